"""The package's imports run one way (a ladder, no circles) and none hides inside a function.

Rungs, bottom to top (RUNGS): plain values (config, trees, compile, ...) -> kernels and layers -> the model
and the pure cost model (tuning/) -> drafts and the loop -> plan and engine -> measurement (measure/) and
training -> the command line. Read from the AST only: no module is imported, so this costs milliseconds.
"""
from __future__ import annotations

import ast
import os

from import_graph import PKG, ROOT, cycle, graph, modules


def test_no_import_cycles():
  edges, _ = graph()
  assert len(edges) > 20, sorted(edges)
  found = cycle(edges)
  assert found is None, "import cycle: " + " -> ".join(found)


def test_no_function_level_project_imports():
  _, nested = graph()
  assert not nested, "function-level imports of magicdec_jax modules (import at the top instead): " + \
      ", ".join(nested)


# The ladder, bottom to top: a module imports only from its own rung or below (tested on every import
# edge). A module (or package) not listed fails the test: a new one takes its place here and in
# docs/layout.md.
RUNGS = (
    ("plain values", ("backend", "config", "trees", "sampling", "tokenizer", "textdata", "compile", "tuning.batch_tail",
                      "tuning.hlo", "sharding.mesh", "sharding.distributed", "training.distill_data",
                      "openai_batch", "options", "constraints", "hub", "stops", "datagen_files", "traced")),
    ("kernels and layers", ("pallas", "layers")),
    ("the model and the cost model", ("cache", "model", "families", "checkpoints", "feature_head", "prompts",
                                      "testing", "sharding", "tuning")),
    ("drafts and the loop", ("drafts", "verify", "loop", "loop_state", "row_features", "schedule", "slots", "shrink")),
    ("plan and engine", ("settings", "plan", "engine", "generation", "request", "stream", "prefilled",
                         "datagen_formats", "datagen")),
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
  edges_of, _ = graph()
  unplaced = sorted(m for m in edges_of if rung_of(m) is None)
  assert not unplaced, f"modules on no rung of RUNGS: {unplaced}"
  up = sorted(f"{m} ({RUNGS[rung_of(m)][0]}) -> {n} ({RUNGS[rung_of(n)][0]})"
              for m, edges in edges_of.items() for n in edges if rung_of(n) > rung_of(m))
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
  edges, nested = graph(str(pkg))
  assert cycle(edges) == [f"{PKG}.a", f"{PKG}.b", f"{PKG}.a"]
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
  for mod, path in modules().items():
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
