"""Tests for magicdec_jax.trees: Tree invariants, the Sequoia DP against brute force, defaults, Monte Carlo."""
import json
import os
import time

import numpy as np
import pytest

from magicdec_jax import trees
from magicdec_jax.trees import Tree

VECTORS = [
    trees.DEFAULT_ACCEPTANCE_VECTOR,
    (0.8,),
    (0.5, 0.3),
    (0.1, 0.5, 0.2),          # non-monotone: a rank-1 child can be worth more than rank 0
    (0.3, 0.3, 0.3),
    (0.97, 0.01, 0.01),
]


# ---- independent brute force over plane trees (nested tuples of children) ----------------------------------

def _plane_trees(n):
  """All ordered rooted trees with exactly n nodes, as nested tuples (a node = tuple of its children)."""
  if n == 1:
    return [()]
  out = []
  for first in range(1, n):  # size of the first child subtree; the rest is a tree with n - first nodes
    for sub in _plane_trees(first):
      for rest in _plane_trees(n - first):
        out.append((sub,) + rest)
  return out


def _value(t, p):
  return 1.0 + sum((p[k] if k < len(p) else 0.0) * _value(c, p) for k, c in enumerate(t))


def _depth(t):
  return 1 + max(map(_depth, t)) if t else 0


def _to_tree(t):
  parents, queue = [-1], [(0, t)]
  for node, sub in queue:
    for c in sub:
      parents.append(node)
      queue.append((len(parents) - 1, c))
  return Tree(tuple(parents))


ALL_PLANE = {n: _plane_trees(n) for n in range(1, 9)}


def test_plane_tree_count_is_catalan():
  catalan = [1, 1, 2, 5, 14, 42, 132, 429]
  assert [len(ALL_PLANE[n]) for n in range(1, 9)] == catalan


@pytest.mark.parametrize("p", VECTORS)
def test_dp_matches_brute_force(p):
  table = trees.sequoia_table(p, 8, 4)
  for m in range(1, 9):
    for d in range(0, 5):
      cands = [t for n in range(1, m + 1) for t in ALL_PLANE[n] if _depth(t) <= d]
      best = max(_value(t, p) for t in cands)
      assert table.value[m, d] == pytest.approx(best, abs=1e-12), (m, d)
      tree = trees.sequoia_tree(p, m, d)
      assert tree.num_nodes <= m and tree.max_depth <= d
      assert tree.expected_tokens(p) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 8))
def test_expected_tokens_matches_recursive_value(n):
  p = (0.6, 0.2, 0.1)
  for t in ALL_PLANE[n]:
    assert _to_tree(t).expected_tokens(p) == pytest.approx(_value(t, p), abs=1e-12)


def test_dp_fast_for_128_nodes():
  t0 = time.perf_counter()
  tree = trees.sequoia_tree(trees.DEFAULT_ACCEPTANCE_VECTOR, 128, 16)
  assert time.perf_counter() - t0 < 5.0
  assert tree.num_nodes <= 128 and tree.max_depth <= 16
  # More budget never hurts, and the 128-node tree beats the shipped 64-node one.
  assert tree.expected_tokens(trees.DEFAULT_ACCEPTANCE_VECTOR) >= \
      trees.default_tree("sequoia64").expected_tokens(trees.DEFAULT_ACCEPTANCE_VECTOR)


def test_dp_value_monotone_in_budget():
  table = trees.sequoia_table((0.7, 0.15, 0.05), 40, 10)
  assert (np.diff(table.value[1:], axis=0) >= -1e-12).all()
  assert (np.diff(table.value[1:], axis=1) >= -1e-12).all()


def test_single_rank_vector_gives_chain():
  tree = trees.sequoia_tree((0.8,), 9, 20)
  assert tree == Tree.chain(8) and tree.is_chain


@pytest.mark.parametrize("gamma", [0, 1, 3, 7])
@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 1.0])
def test_chain_expected_tokens_closed_form(gamma, a):
  closed = gamma + 1 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)
  assert Tree.chain(gamma).expected_tokens([a]) == pytest.approx(closed)
  assert Tree.chain(gamma).num_nodes == gamma + 1 and Tree.chain(gamma).max_depth == gamma


def _random_tree(rng, n, max_children=4):
  parents = [-1]
  while len(parents) < n:
    # BFS growth: pick a parent >= the last parent, keeping each node's child count bounded.
    last = parents[-1] if len(parents) > 1 else 0
    cand = [u for u in range(last, len(parents)) if parents[1:].count(u) < max_children]
    parents.append(int(rng.choice(cand[:3])))
  return Tree(tuple(parents))


def test_monte_carlo_expected_tokens():
  rng = np.random.default_rng(0)
  p = np.array([0.55, 0.2, 0.1, 0.05])
  tree = _random_tree(rng, 20)
  assert tree.max_width > 1
  kids = np.full((tree.num_nodes, len(p) + 1), -1)  # column len(p) = "no child accepted"
  for u, ch in enumerate(tree.children):
    for k, c in enumerate(ch[:len(p)]):
      kids[u, k] = c
  trials = 200_000
  node = np.zeros(trials, int)
  tokens = np.ones(trials)
  alive = np.ones(trials, bool)
  probs = np.append(p, 1 - p.sum())
  for _ in range(tree.max_depth):
    k = rng.choice(len(probs), size=trials, p=probs)
    nxt = np.where(alive, kids[node, k], -1)
    alive = nxt >= 0
    tokens += alive
    node = np.where(alive, nxt, node)
  mean, sem = tokens.mean(), tokens.std() / np.sqrt(trials)
  assert abs(mean - tree.expected_tokens(p)) < 4 * sem


def test_derived_arrays():
  tree = Tree((-1, 0, 0, 0, 1, 1, 2, 4, 6, 6))
  assert tree.num_nodes == 10 and tree.max_depth == 3
  np.testing.assert_array_equal(tree.depths, [0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
  np.testing.assert_array_equal(tree.child_rank, [0, 0, 1, 2, 0, 1, 0, 0, 0, 1])
  np.testing.assert_array_equal(tree.num_children, [3, 2, 1, 0, 1, 0, 2, 0, 0, 0])
  assert tree.children[0] == (1, 2, 3) and tree.children[6] == (8, 9)
  assert [lv.tolist() for lv in tree.levels] == [[0], [1, 2, 3], [4, 5, 6], [7, 8, 9]]
  assert tree.max_width == 3 and not tree.is_chain
  np.testing.assert_array_equal(tree.expanding_per_level, [1, 2, 2])
  assert tree.depths.dtype == np.int32 and tree.ancestor_mask.dtype == bool
  with pytest.raises(ValueError):
    tree.depths[0] = 5  # cached arrays are read-only


@pytest.mark.parametrize("seed", range(5))
def test_ancestor_mask_properties(seed):
  tree = _random_tree(np.random.default_rng(seed), 30)
  anc = tree.ancestor_mask
  n = tree.num_nodes
  assert anc.shape == (n, n)
  assert anc.diagonal().all() and anc[:, 0].all()
  assert not np.triu(anc, 1).any()  # ancestors precede descendants
  np.testing.assert_array_equal(anc.sum(1), tree.depths + 1)
  for i in range(n):
    path, u = set(), i
    while u >= 0:
      path.add(u)
      u = tree.parents[u]
    assert set(np.nonzero(anc[i])[0].tolist()) == path
    for j in path:  # transitivity: ancestors of an ancestor are ancestors
      assert (anc[i] >= anc[j]).all()


def test_constructors():
  assert Tree.from_children_counts([2, 1, 1]) == Tree((-1, 0, 0, 1, 2))
  assert Tree.from_children_counts([0]) == Tree((-1,))
  k = Tree.kary([2, 3])
  assert k.num_nodes == 1 + 2 + 6 and k.max_width == 3 and k.max_depth == 2
  assert [len(lv) for lv in k.levels] == [1, 2, 6]
  with pytest.raises(ValueError):
    Tree.from_children_counts([1, 0, 5])
  for bad in ([1.5, 1], ["2"], [True], [1, -1]):
    with pytest.raises(ValueError, match=r"children counts must be integers >= 0, got"):
      Tree.from_children_counts(bad)
  for bad in ([2.7, 2], [2, 0, 3], ["2"]):            # 0 would end the tree before len(branching)
    with pytest.raises(ValueError, match=r"branching must be integers >= 1 \(depth = len\(branching\)\)"):
      Tree.kary(bad)
  with pytest.raises(ValueError, match="acceptance vector must be"):
    trees.sequoia_tree([float("nan"), 0.1], 8, 4)
  with pytest.raises(ValueError, match="need 0 <= min_depth <= max_depth, got 3, 2"):
    trees.hardware_aware_tree([0.5], [4], 2, t_draft=1.0, t_verify=lambda n: 1.0, min_depth=3)


@pytest.mark.parametrize("bad", [(), (0,), (-1, 1), (-1, 0, 0, 1, 0), (-1, -1), (-1, 0, 2)])
def test_validation_errors(bad):
  with pytest.raises(ValueError):
    Tree(bad)


def test_hashable_and_json_round_trip():
  tree = trees.sequoia_tree((0.6, 0.2, 0.1), 20, 5)
  again = Tree.from_json(tree.to_json(note="x"))
  assert again == tree and hash(again) == hash(tree)
  assert {tree: 1}[again] == 1
  assert Tree.from_json(json.dumps(list(tree.parents))) == tree
  with pytest.raises(ValueError):
    Tree.from_json('{"nodes": [1]}')


@pytest.mark.parametrize("name", trees.DEFAULT_TREE_NAMES)
def test_default_json_equals_fresh_dp(name):
  with open(os.path.join(trees.DEFAULT_TREES_DIR, f"{name}.json")) as f:
    meta = json.load(f)
  tree = trees.default_tree(name)
  assert tree == trees.build_default_tree(name)
  assert meta["expected_tokens"] == pytest.approx(tree.expected_tokens(trees.DEFAULT_ACCEPTANCE_VECTOR), abs=1e-6)
  if name in trees.DEFAULT_TREE_SPECS:
    m, d = trees.DEFAULT_TREE_SPECS[name]
    assert tree.num_nodes <= m and tree.max_depth <= d
  with pytest.raises(ValueError):
    trees.default_tree("nope")


def test_hardware_aware_tree_is_argmin():
  p = trees.DEFAULT_ACCEPTANCE_VECTOR
  sizes, depth = (4, 8, 16, 32, 64), 8
  t_verify = lambda n: 1.0 + 0.02 * n
  t_draft = lambda w: 0.1 + 0.01 * w
  tree, info = trees.hardware_aware_tree(p, sizes, depth, t_draft, t_verify)
  table = trees.sequoia_table(p, max(sizes), depth)
  best = min(
      (sum(t_draft(w) for w in table.tree(n, d).expanding_per_level) + t_verify(n)) / table.value[n, d]
      for n in sizes for d in range(depth + 1))
  assert info["time_per_token"] == pytest.approx(best)
  assert info["expected_tokens"] == pytest.approx(tree.expected_tokens(p))
  # Free drafting and verification -> the biggest, deepest tree; very expensive drafting -> no speculation.
  big, _ = trees.hardware_aware_tree(p, sizes, depth, 0.0, {n: 1.0 for n in sizes})
  assert big.expected_tokens(p) == pytest.approx(table.value[64, depth])
  none, info = trees.hardware_aware_tree(p, sizes, depth, 100.0, t_verify)
  assert none.num_nodes == 1 and info["expected_tokens"] == 1.0
  some, info = trees.hardware_aware_tree(p, sizes, depth, 100.0, t_verify, min_depth=1)   # (auto_fallback=False)
  assert some.max_depth >= 1 and info["time_per_token"] == pytest.approx(min(
      (sum(100.0 for _ in table.tree(n, d).expanding_per_level) + t_verify(n)) / table.value[n, d]
      for n in sizes for d in range(1, depth + 1)))
