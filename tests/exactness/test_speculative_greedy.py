"""Greedy speculative decoding is token-exact: every draft, chain and tree equals plain greedy decoding.

Reference: `generate(..., draft=None)` (itself checked against a full-forward argmax loop in
test_generate.py). The target's attention weights are scaled up so context matters: narrow windows,
SnapKV selections and a differently-initialized draft model really disagree with the target, which puts
the rejection paths to work (acceptance strictly between 0 and 1 is asserted where expected). Prompts are
ragged (9..16 tokens) so windows of 3-8 are shorter and windows of 64 longer than every prompt; a stop
token that some rows emit mid-run is set for every case. The default run compiles one executable pair
per case (a few chosen combinations); the full product is marked slow.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from magicdec_jax.generation import generate
from magicdec_jax.trees import Tree, default_tree

from speculative_cases import DRAFTS, NEW, prompts_and_eos, target


def random_tree(seed: int, num_nodes: int, max_width: int) -> Tree:
  """A random BFS tree with exactly num_nodes nodes and at least one node of width > 1."""
  rng = np.random.default_rng(seed)
  while True:
    counts, total = [], 1
    while total < num_nodes:
      c = int(min(rng.integers(0, max_width + 1), num_nodes - total))
      if len(counts) + 1 == total and c == 0:    # the last open node must not close the tree early
        c = 1
      counts.append(c)
      total += c
    tree = Tree.from_children_counts(counts)
    if tree.num_nodes == num_nodes and tree.max_width > 1:
      return tree


@functools.lru_cache(maxsize=None)
def reference(batch: int):
  prompts, eos = prompts_and_eos()
  res = generate(target(), prompts[:batch], max_new_tokens=NEW, eos_token_id=eos)
  return prompts[:batch], eos, res


def check_exact(batch: int, draft_name: str, *, gamma: int = 4, tree: Tree | None = None):
  prompts, eos, ref = reference(batch)
  res = generate(target(), prompts, max_new_tokens=NEW, eos_token_id=eos, draft=DRAFTS[draft_name](),
                 **(dict(gamma=gamma) if tree is None else dict(tree=tree)))
  assert res.tokens == ref.tokens
  assert res.finish_reasons == ref.finish_reasons
  depth = tree.max_depth if tree is not None else gamma
  for r, t in zip(res.row_stats, res.tokens):
    # every verify step emits 1 + accepted tokens, except where EOS / the budget cut it short
    assert r["verify_steps"] <= len(t) <= r["verify_steps"] * (depth + 1)
    assert r["accepted_tokens"] <= r["verify_steps"] * depth
  return res.stats["acceptance_rate"]


def test_reference_rows_stop_mid_run():
  _, _, ref = reference(4)
  assert "eos" in ref.finish_reasons and "length" in ref.finish_reasons
  assert any(0 < len(t) < NEW for t in ref.tokens)


# (batch, draft, gamma or tree, expected acceptance: "mid" strictly inside (0, 1), "low" < 0.5, "high":
# the draft equals the target, so every round accepts the whole rank-0 path)
CHAINS = [
    (4, "streaming-s0-w4", 1, "mid"),
    (4, "snapkv-b4-w4", 3, "any"),
    (4, "model-other-s1-w8", 6, "low"),
    (4, "model-trunc-s0-w64", 2, "mid"),
    (1, "streaming-s2-w3", 5, "any"),
]


@pytest.mark.parametrize("batch,draft,gamma,expect", CHAINS,
                         ids=[f"b{b}-{d}-g{g}" for b, d, g, _ in CHAINS])
def test_chain_greedy_exact(batch, draft, gamma, expect):
  acc = check_exact(batch, draft, gamma=gamma)
  if expect == "mid":
    assert 0.0 < acc < 1.0
  elif expect == "low":
    assert acc < 0.5


TREES = [
    (4, "streaming-s2-w64", "random12", "high"),     # window longer than every prompt: the target itself
    (4, "model-trunc-s2-w5", "sequoia16", "mid"),
    (4, "snapkv-b6-w2", "random9", "any"),
]


def named_tree(name: str) -> Tree:
  if name.startswith("random"):
    return random_tree(int(name[6:]), int(name[6:]), 3)
  return default_tree(name)


@pytest.mark.parametrize("batch,draft,tree,expect", TREES, ids=[f"b{b}-{d}-{t}" for b, d, t, _ in TREES])
def test_tree_greedy_exact(batch, draft, tree, expect):
  acc = check_exact(batch, draft, tree=named_tree(tree))
  if expect == "mid":
    assert 0.0 < acc < 1.0
  elif expect == "high":    # the draft is the target: the rank-0 child is always right
    t, first_chain = named_tree(tree), 0
    while t.children[first_chain]:
      first_chain = t.children[first_chain][0]
    assert acc >= 0.9 * t.depths[first_chain] / t.max_depth


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3, 5])
@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_chain_greedy_exact_sweep(batch, gamma, draft):
  check_exact(batch, draft, gamma=gamma)


@pytest.mark.slow
@pytest.mark.parametrize("tree", ["random5", "random9", "random12", "sequoia16", "sequoia32", "chain4"])
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_tree_greedy_exact_sweep(tree, draft):
  check_exact(5, draft, tree=named_tree(tree))
