"""The package's import graph read from the AST (no module is imported): the shared helper of the
import-ladder tests (project/test_imports.py) and the draft-interface test."""
from __future__ import annotations

import ast
import os

PKG = "magicdec_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PKG)


def modules(root: str = ROOT) -> dict[str, str]:
  """dotted module name -> file path, for every .py file of the package."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(root))[:-3].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        out[".".join(rel)] = os.path.join(dirpath, f)
  return out


def import_targets(node, module: str, is_pkg: bool, modules) -> list[str]:
  """The package modules an import statement executes: the named module (for `from X import y`, X.y when
  that is a module, else X) and every intermediate package not already being imported (the root's
  __init__ and the importing module's own parents are never new dependencies)."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:
      parts = module.split(".") if is_pkg else module.split(".")[:-1]
      parts = parts[:len(parts) - (node.level - 1)]
      base = ".".join(parts + ([base] if base else []))
    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
  out = []
  for name in names:
    if not name.startswith(PKG + "."):
      continue
    parts = name.split(".")
    for i in range(2, len(parts) + 1):
      prefix = ".".join(parts[:i])
      parent_of_self = module.startswith(prefix + ".")
      if prefix in modules and prefix != module and (prefix == name or not parent_of_self):
        out.append(prefix)
  return out


def graph(root: str = ROOT):
  """(module -> the package modules it imports, [file:line of imports inside functions])."""
  mods = modules(root)
  edges_of, nested = {}, []
  for mod, path in mods.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    edges = set()
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    inside = {id(n) for fn in funcs for n in ast.walk(fn) if n is not fn}
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        targets = import_targets(node, mod, is_pkg, mods)
        if id(node) in inside and (targets or (isinstance(node, ast.ImportFrom) and node.level)):
          nested.append(f"{os.path.relpath(path, os.path.dirname(root))}:{node.lineno}")
        edges.update(targets)
    edges_of[mod] = edges
  return edges_of, nested


def cycle(graph) -> list[str] | None:
  """One import circle of graph (a path that ends where it starts), or None."""
  color, stack = {}, []

  def visit(m):
    color[m] = 1
    stack.append(m)
    for n in sorted(graph.get(m, ())):
      if color.get(n) == 1:
        return stack[stack.index(n):] + [n]
      if n not in color:
        found = visit(n)
        if found:
          return found
    stack.pop()
    color[m] = 2
    return None

  for m in sorted(graph):
    if m not in color:
      found = visit(m)
      if found:
        return found
  return None
