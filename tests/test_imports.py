"""The package's imports run one way (a ladder, no circles) and none hides inside a function.

Rungs, bottom to top: pallas/, layers/ -> config, model, cache -> drafts, verify, trees, sampling, loop ->
compile, sharding/ -> engine, datagen -> cli/ (and run.py); tuning/ and training/ hold modules of several
rungs (the cost model low, the context sweep high), each module on its own rung. Read from the AST only: no
module is imported, so this costs milliseconds.
"""
from __future__ import annotations

import ast
import os
import sys

PKG = "magicdec_jax"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PKG)


def _modules() -> dict[str, str]:
  """dotted module name -> file path, for every .py file of the package."""
  out = {}
  for dirpath, _, files in os.walk(ROOT):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(ROOT))[:-3].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        out[".".join(rel)] = os.path.join(dirpath, f)
  return out


def _targets(node, module: str, is_pkg: bool, modules) -> list[str]:
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


def _graph():
  modules = _modules()
  graph, nested = {}, []
  for mod, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    is_pkg = path.endswith("__init__.py")
    edges = set()
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    inside = {id(n) for fn in funcs for n in ast.walk(fn) if n is not fn}
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        targets = _targets(node, mod, is_pkg, modules)
        if id(node) in inside and (targets or (isinstance(node, ast.ImportFrom) and node.level)):
          nested.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}:{node.lineno}")
        edges.update(targets)
    graph[mod] = edges
  return graph, nested


def _cycle(graph) -> list[str] | None:
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


def test_no_import_cycles():
  graph, _ = _graph()
  assert len(graph) > 20, sorted(graph)
  cycle = _cycle(graph)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_function_level_project_imports():
  _, nested = _graph()
  assert not nested, "function-level imports of magicdec_jax modules (import at the top instead): " + \
      ", ".join(nested)


def test_ladder_rungs():
  """The bottom rungs never reach up: kernels and layers import no model/loop/runtime code, the compiled
  core imports no sharded runtime or engine, the runtime no engine / CLI."""
  graph, _ = _graph()

  def reach(m):
    seen, todo = set(), [m]
    while todo:
      for n in graph.get(todo.pop(), ()):
        if n not in seen:
          seen.add(n)
          todo.append(n)
    return seen

  above = {
      f"{PKG}.pallas": ("model", "cache", "loop", "drafts", "sharding", "engine", "cli"),
      f"{PKG}.layers.attention": ("model", "loop", "drafts", "sharding", "engine", "cli"),
      f"{PKG}.loop": ("sharding", "engine", "datagen", "cli", "compile", "tuning.autotune", "training"),
      f"{PKG}.sharding": ("engine", "datagen", "cli", "training"),
      f"{PKG}.engine": ("datagen", "cli", "training"),
      f"{PKG}.tuning.costmodel": ("drafts", "loop", "engine", "cli"),
  }
  for mod, banned in above.items():
    bad = sorted(n for n in reach(mod) if any(n == f"{PKG}.{b}" or n.startswith(f"{PKG}.{b}.") for b in banned))
    assert not bad, f"{mod} reaches up the ladder to {bad}"


def test_detector_finds_a_cycle_and_a_nested_import(tmp_path, monkeypatch):
  """The checks above really detect what they claim (a two-module circle closed by a hidden import)."""
  pkg = tmp_path / PKG
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from magicdec_jax import b\n")
  (pkg / "b.py").write_text("def f():\n  from magicdec_jax import a\n  return a\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(pkg))
  graph, nested = _graph()
  assert _cycle(graph) == [f"{PKG}.a", f"{PKG}.b", f"{PKG}.a"]
  assert nested == [os.path.join(PKG, "b.py") + ":2"]


def test_nothing_outside_drafts_dispatches_on_a_draft_class():
  """Every draft answers one interface (drafts/base.py): no module outside magicdec_jax/drafts/ asks
  isinstance / issubclass of a concrete draft class, or compares a draft's type."""
  drafts_dir = os.path.join(ROOT, "drafts")
  concrete = set()
  for f in os.listdir(drafts_dir):
    if f.endswith(".py"):
      tree = ast.parse(open(os.path.join(drafts_dir, f), encoding="utf-8").read())
      concrete |= {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
  concrete -= {"Draft", "DraftSpec", "Prefill", "Round", "Footprint"}       # the interface itself
  assert {"StreamingDraft", "ModelDraft", "PromptLookupDraft"} <= concrete
  bad = []
  for mod, path in _modules().items():
    if mod.startswith(f"{PKG}.drafts") or path == os.path.join(ROOT, "testing.py"):
      continue
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
        named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} | \
                {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
        if named & concrete:
          bad.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}:{node.lineno}")
  assert not bad, "dispatch on a draft class outside drafts/: " + ", ".join(bad)
