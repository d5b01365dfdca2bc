"""The draft interface does one job: drafts run; the cost model prices plain numbers; the command line parses.

* no module outside drafts/ and the command line's draft registry (cli/draft_flags.py) compares anything
  with a --draft name (`fv.draft == "model"`): they ask the interface or the registry (read from the AST);
* drafts/ imports no measuring or command-line code, tuning/ no code that runs a model;
* each draft's cost descriptor (tuning/draft_cost.DraftCost) against hand counts for one small config, and
  one draft step priced by the roofline against its bytes counted by hand;
* the command line's registry names exactly the drafts' registry, and its descriptors from flags agree
  with the drafts' own.
"""
from __future__ import annotations

import ast
import math
import os

import pytest
from absl import flags

from magicdec_jax import drafts
from magicdec_jax.cli import draft_flags, modes
from magicdec_jax.config import ModelConfig
from magicdec_jax.tuning import costmodel
from magicdec_jax.tuning.draft_cost import DraftCost
from import_graph import PKG, ROOT, graph

DRAFT_NAMES = set(drafts.REGISTRY) - {"none"}
ALLOWED = (os.path.join(ROOT, "drafts") + os.sep, os.path.join(ROOT, "cli", "draft_flags.py"))
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, dtype="float32")


def _strings(node) -> set[str]:
  """The string constants a comparison operand is, or holds (a tuple / list / set of them)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return {node.value}
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
  return set()


def draft_name_comparisons(path: str) -> list[str]:
  """'file:line: source' for each ==, !=, in, not in of anything against a --draft name in `path`."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  out = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Compare):
      continue
    operands = [node.left] + node.comparators
    for op, a, b in zip(node.ops, operands, operands[1:]):
      if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (_strings(a) | _strings(b)) & DRAFT_NAMES:
        out.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}:{node.lineno}: {ast.unparse(node)}")
  return out


def test_nothing_outside_the_drafts_and_their_registry_compares_a_draft_name():
  assert {"streaming", "snapkv", "model", "feature", "lookup"} <= DRAFT_NAMES
  bad = []
  for dirpath, _, files in os.walk(ROOT):
    for f in sorted(files):
      path = os.path.join(dirpath, f)
      if f.endswith(".py") and not path.startswith(ALLOWED[0]) and path != ALLOWED[1]:
        bad += draft_name_comparisons(path)
  assert not bad, "a --draft name compared outside drafts/ and cli/draft_flags.py: " + "; ".join(bad)


def test_the_scan_finds_what_it_claims(tmp_path):
  """The scan sees a name on either side, in a tuple, and under !=; it ignores other strings and 'none'."""
  p = tmp_path / "m.py"
  p.write_text('a = fv.draft == "model"\nb = "lookup" != x\nc = fv.draft not in ("streaming", "x")\n'
               'd = fv.draft == "none"\ne = kind == "linear"\nf = {"model": 1}\n')
  assert [line.split(":")[1] for line in draft_name_comparisons(str(p))] == ["1", "2", "3"]


def _reach(graph, mod: str) -> set[str]:
  seen, todo = set(), [mod]
  while todo:
    for n in graph.get(todo.pop(), ()):
      if n not in seen:
        seen.add(n)
        todo.append(n)
  return seen


def test_drafts_import_no_measuring_or_cli_code_and_the_planner_runs_no_model():
  edges, _ = graph()
  banned = (f"{PKG}.measure", f"{PKG}.cli", f"{PKG}.tuning.calibrate", f"{PKG}.tuning.acceptance")
  for mod in [m for m in edges if m == f"{PKG}.drafts" or m.startswith(f"{PKG}.drafts.")]:
    bad = sorted(n for n in _reach(edges, mod) if n.startswith(banned))
    assert not bad, f"{mod} reaches {bad}"
  # tuning/ prices and chooses: none of its modules imports code that runs a model, nor reaches the model,
  # the drafts, the loop or the measuring layer (the layers package, which it reaches for weight byte
  # counts, is the bottom rung).
  direct = {f"{PKG}.{m}" for m in ("model", "cache", "feature_head", "layers.attention")}
  upper = {f"{PKG}.{m}" for m in ("model", "cache", "feature_head", "drafts", "loop", "engine", "prefilled")}
  tuning = sorted(m for m in edges if m.startswith(f"{PKG}.tuning."))
  assert f"{PKG}.tuning.costmodel" in tuning and f"{PKG}.tuning.profiles" in tuning
  for mod in tuning:
    bad = sorted(edges[mod] & direct) + sorted(n for n in _reach(edges, mod)
                                               if n in upper or n.startswith((f"{PKG}.measure", f"{PKG}.drafts.")))
    assert not bad, f"{mod} imports or reaches code that runs a model: {bad}"


# ---- cost descriptors by hand ----------------------------------------------------------------------------

def test_each_drafts_cost_descriptor_by_hand():
  head = CFG.replace(num_layers=1)
  small = CFG.replace(num_layers=1, hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1)
  cases = {    # draft -> (KV slots read, its own network, the weight copy it reads, runs a network)
      drafts.StreamingDraft(4, 60): (4 + 60, None, None, True),
      drafts.StreamingDraft(4, 60, weights="bfloat16"): (64, None, "bfloat16", True),
      drafts.SnapKVDraft(budget=32, window=16, weights="int8"): (32 + 16, None, "int8", True),
      drafts.ModelSpec(small, 2, 8, weights="int8"): (2 + 8, small, "int8", True),
      drafts.ModelSpec(small, 2, 8, weights="bfloat16"): (10, small, "bfloat16", True),
      drafts.FeatureSpec(head, (0, 1), 3, 5): (3 + 5, head, None, True),
      drafts.FeatureSpec(head, (0, 1), 3, 5, vocab=(1, 2, 7)): (8, head.replace(vocab_size=3), None, True),
      drafts.PromptLookupDraft(3): (0, None, None, False),
  }
  for d, (slots, config, wbytes, runs) in cases.items():
    c = d.spec.cost()
    assert isinstance(c, DraftCost), d
    assert (c.kv_slots, c.config, c.weights_dtype, c.runs_network) == (slots, config, wbytes, runs), d
    assert c.kv_tokens(10_000) == slots and c.kv_tokens(5) == (min(5, slots) if runs else 0)
    assert c.network_config(CFG) == (CFG if config is None else config)


def _matmul_params(c: ModelConfig) -> int:
  per_layer = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) + 3 * c.hidden_size * \
      c.intermediate_size + 2 * c.hidden_size
  return c.num_layers * per_layer + c.vocab_size * c.hidden_size


def test_a_draft_step_priced_by_its_bytes_counted_by_hand():
  """On a bandwidth-only roofline (1 byte/s, infinite FLOPs) a step's seconds are its bytes: a float32
  target's self draft on a bfloat16 copy (sink 4 + window 60) at batch 3, context 1000, 2 tokens per row:
  weights at 2 bytes (+ the gathered embedding rows), the ring's 64 tokens of float32 K/V read and 2 written
  per row, float32 logits; a context shorter than the ring reads only the context; prompt lookup costs 0."""
  hw = costmodel.Hardware("bytes", 1.0, math.inf, math.inf)
  b, t = 3, 2
  kv_token = 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 4
  want = lambda kv: (_matmul_params(CFG) * 2 + b * t * CFG.hidden_size * 2 + (b * kv + b * t) * kv_token
                     + b * t * CFG.vocab_size * 4)
  c = drafts.StreamingDraft(4, 60, weights="bfloat16").cost()
  assert costmodel.t_draft(CFG, hw, c, b, 1000, t, "float32") == want(64)
  assert costmodel.t_draft(CFG, hw, c, b, 40, t, "float32") == want(40)
  assert costmodel.t_draft(CFG, hw, drafts.PromptLookupDraft(3).cost(), b, 1000, t, "float32") == 0.0


# ---- the command line's registry ---------------------------------------------------------------------------

def _flags(*argv):
  fv = modes.define_flags(flags.FlagValues())
  fv(["run.py", "--mode=plan", *argv])
  return fv


def test_the_cli_registry_names_the_drafts_and_prices_as_they_do():
  assert list(draft_flags.REGISTRY) == list(drafts.REGISTRY)
  for name in ("streaming", "snapkv", "lookup"):
    fv = _flags(f"--draft={name}", "--sink=3", "--window=20", "--budget=40", "--draft_weights=int8"
                if name != "lookup" else "--lookup_ngram=2")
    assert draft_flags.cost(fv, CFG) == draft_flags.build(fv, None, lambda n: None).spec.cost()
  assert draft_flags.cost(_flags("--draft=snapkv", "--budget=40", "--window=20"), CFG).kv_slots == 60
  snap = draft_flags.build(_flags("--draft=snapkv"), None, lambda n: None)       # SnapKVDraft's own defaults
  assert (snap.budget, snap.window) == (drafts.SnapKVDraft().budget, drafts.SnapKVDraft().window)
  fv = _flags("--draft=model", "--draft_layers=1", "--sink=3", "--window=20")
  assert draft_flags.cost(fv, CFG) == DraftCost(23, CFG.replace(num_layers=1), label="model")
  fv = _flags("--draft=feature", "--sink=3", "--window=20", "--draft_vocab=16")
  assert draft_flags.cost(fv, CFG) == DraftCost(23, CFG.replace(num_layers=1, vocab_size=16), label="feature head")
  none = _flags("--draft=none")
  assert draft_flags.entry(none) is None and draft_flags.build(none, None, None) is None


@pytest.mark.parametrize("bad,match", [
    (dict(kv_slots=-1), "kv_slots"), (dict(kv_slots=4, weights_dtype="float8"), "weights_dtype"),
    (dict(kv_slots=4, runs_network=False), "runs no network")])
def test_descriptor_refuses_nonsense(bad, match):
  with pytest.raises(ValueError, match=match):
    DraftCost(**bad)
