"""The package's imports run one way (a ladder, no circles) and none hides inside a function.

Rungs, bottom to top (RUNGS): plain values (config, trees, compile, ...) -> kernels and layers -> the model
and the pure cost model (tuning/) -> drafts and the loop -> plan and engine -> measurement (measure/) and
training -> the command line. Read from the AST only: no module is imported, so this costs milliseconds.
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


# The ladder, bottom to top: a module imports only from its own rung or below (tested on every import
# edge). A module (or package) not listed fails the test: a new one takes its place here and in
# docs/layout.md.
RUNGS = (
    ("plain values", ("backend", "config", "trees", "sampling", "tokenizer", "textdata", "compile", "tuning.batch_tail",
                      "tuning.hlo", "sharding.mesh", "sharding.distributed", "training.distill_data",
                      "openai_batch", "options", "constraints", "hub")),
    ("kernels and layers", ("pallas", "layers")),
    ("the model and the cost model", ("cache", "model", "families", "checkpoints", "feature_head", "prompts",
                                      "testing", "sharding", "tuning")),
    ("drafts and the loop", ("drafts", "verify", "loop", "loop_state", "row_features", "schedule", "slots", "shrink")),
    ("plan and engine", ("settings", "plan", "engine", "stream", "prefilled", "datagen")),
    ("measurement and training", ("measure", "training")),
    ("command line", ("cli", "")),            # "": the package's own __init__ (the public API)
)


def rung_of(module: str) -> int | None:
  """The rung of a dotted module name: its most specific entry in RUNGS (a package entry covers its
  modules unless one is listed itself)."""
  name = module[len(PKG) + 1:] if module != PKG else ""
  best, rung = -1, None
  for i, (_, mods) in enumerate(RUNGS):
    for m in mods:
      if (m == name or (m and name.startswith(m + "."))) and len(m) > best:
        best, rung = len(m), i
  return rung


def test_ladder_rungs():
  """Every module sits on a rung, and every import runs to its own rung or below (kernels and layers at the
  bottom, the CLI on top; the pure cost model low, measurement high)."""
  graph, _ = _graph()
  unplaced = sorted(m for m in graph if rung_of(m) is None)
  assert not unplaced, f"modules on no rung of RUNGS: {unplaced}"
  up = sorted(f"{m} ({RUNGS[rung_of(m)][0]}) -> {n} ({RUNGS[rung_of(n)][0]})"
              for m, edges in graph.items() for n in edges if rung_of(n) > rung_of(m))
  assert not up, "imports that run up the ladder:\n  " + "\n  ".join(up)


def test_ladder_detector_sees_an_upward_import():
  """rung_of places modules by their most specific entry, and an upward edge is one to a higher rung."""
  assert RUNGS[rung_of(f"{PKG}.tuning.costmodel")][0] == "the model and the cost model"
  assert RUNGS[rung_of(f"{PKG}.tuning.hlo")][0] == "plain values"
  assert RUNGS[rung_of(PKG)][0] == "command line"
  assert rung_of(f"{PKG}.engine") > rung_of(f"{PKG}.loop") > rung_of(f"{PKG}.model") > rung_of(f"{PKG}.layers.dense")


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
