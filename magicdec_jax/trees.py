"""Static speculation trees and the Sequoia dynamic program.

A `Tree` is a fixed token tree that the drafter fills and the target verifies in one step. It is frozen and
hashable so it can be a static argument of `jax.jit`: all index arrays the kernels need (depths, ancestor mask,
levels) are derived once, on the host, with numpy.

`sequoia_tree` finds the tree of at most N nodes and depth <= D that maximizes the expected number of tokens
emitted per verification step, given an acceptance vector p (p[k] = probability that the k-th sampled child of a
node is the accepted one). `hardware_aware_tree` trades that expectation against draft and verify cost.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Callable, Mapping, Sequence

import numpy as np

from magicdec_jax.options import is_int

# Shipped default acceptance vector (Sequoia-style, greedy/top-k drafting on chat data): p[k] is the probability
# that the k-th ranked child is the accepted one. Sum = 0.92, i.e. 8% of the time no child is accepted.
DEFAULT_ACCEPTANCE_VECTOR: tuple[float, ...] = (0.63, 0.11, 0.06, 0.04, 0.03, 0.02, 0.02, 0.01)

# name -> (max_nodes, max_depth) of the shipped Sequoia trees built from DEFAULT_ACCEPTANCE_VECTOR.
DEFAULT_TREE_SPECS: dict[str, tuple[int, int]] = {
    "sequoia16": (16, 6),
    "sequoia32": (32, 8),
    "sequoia64": (64, 10),
}
DEFAULT_CHAINS: dict[str, int] = {"chain4": 4}
DEFAULT_TREES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tree_defaults")


def _readonly(a: np.ndarray) -> np.ndarray:
  a.setflags(write=False)
  return a


@dataclasses.dataclass(frozen=True)
class Tree:
  """A speculation tree in canonical BFS order.

  parents[i] is the parent of node i; parents[0] == -1 (node 0 is the root: the last committed token that is fed
  to the target but is not itself a candidate). For i >= 1, parents must be non-decreasing and < i, which is
  exactly BFS order: depths are non-decreasing, each level is a contiguous range of nodes and siblings are
  contiguous. Among siblings, order = sampling rank (the k-th child is the k-th token drawn from the draft).
  """
  parents: tuple[int, ...]

  def __post_init__(self):
    try:
      parents = tuple(self.parents)
    except TypeError:
      parents = None
    if parents is None or not all(is_int(p) for p in parents):
      raise ValueError(f"Tree parents must be a sequence of ints, got {self.parents!r:.120}")
    parents = tuple(int(p) for p in parents)
    object.__setattr__(self, "parents", parents)
    if not parents:
      raise ValueError("Tree needs at least the root node")
    if parents[0] != -1:
      raise ValueError(f"parents[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i in range(1, len(parents)):
      p = parents[i]
      if not 0 <= p < i:
        raise ValueError(f"node {i}: parent {p} must satisfy 0 <= parent < {i} (a parent precedes its children)")
      if i > 1 and p < parents[i - 1]:
        raise ValueError(f"node {i}: parent {p} < parent of node {i - 1} ({parents[i - 1]}); nodes must be in "
                         "BFS order with siblings contiguous (parents non-decreasing)")

  # ---- constructors -------------------------------------------------------------------------------------------

  @classmethod
  def chain(cls, gamma: int) -> "Tree":
    """A chain of gamma candidates: gamma + 1 nodes, depth gamma."""
    if not is_int(gamma) or gamma < 0:
      raise ValueError(f"gamma must be an integer >= 0, got {gamma!r}")
    return cls((-1,) + tuple(range(gamma)))

  @classmethod
  def from_children_counts(cls, counts: Sequence[int]) -> "Tree":
    """counts[i] = number of children of node i (BFS order); trailing leaves may be omitted."""
    bad = next((c for c in counts if not is_int(c) or c < 0), None)
    if bad is not None:
      raise ValueError(f"children counts must be integers >= 0, got {bad!r} in {list(counts)!r:.80}")
    parents = [-1]
    i = 0
    while i < len(parents):
      c = int(counts[i]) if i < len(counts) else 0
      parents.extend([i] * c)
      i += 1
    if len(counts) > len(parents):
      if any(int(c) for c in counts[len(parents):]):
        raise ValueError(f"counts has {len(counts)} entries but the tree only has {len(parents)} nodes")
    return cls(tuple(parents))

  @classmethod
  def kary(cls, branching: Sequence[int]) -> "Tree":
    """Full tree where every node at depth d has branching[d] children (depth = len(branching))."""
    if any(not is_int(b) or b < 1 for b in branching):
      raise ValueError(f"branching must be integers >= 1 (depth = len(branching)), got {list(branching)!r:.80}")
    counts, width = [], 1
    for b in branching:
      counts.extend([int(b)] * width)
      width *= int(b)
    return cls.from_children_counts(counts)

  # ---- derived arrays (cached; read-only numpy) -------------------------------------------------------------

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @functools.cached_property
  def parents_array(self) -> np.ndarray:  # [N] int32
    return _readonly(np.asarray(self.parents, np.int32))

  @functools.cached_property
  def depths(self) -> np.ndarray:  # [N] int32, root 0
    d = np.zeros(self.num_nodes, np.int32)
    for i in range(1, self.num_nodes):
      d[i] = d[self.parents[i]] + 1
    return _readonly(d)

  @property
  def max_depth(self) -> int:
    return int(self.depths[-1])

  @functools.cached_property
  def children(self) -> tuple[tuple[int, ...], ...]:
    ch: list[list[int]] = [[] for _ in range(self.num_nodes)]
    for i in range(1, self.num_nodes):
      ch[self.parents[i]].append(i)
    return tuple(tuple(c) for c in ch)

  @functools.cached_property
  def num_children(self) -> np.ndarray:  # [N] int32
    return _readonly(np.asarray([len(c) for c in self.children], np.int32))

  @functools.cached_property
  def child_rank(self) -> np.ndarray:  # [N] int32, 0-based rank among siblings, root 0
    r = np.zeros(self.num_nodes, np.int32)
    for c in self.children:
      r[list(c)] = np.arange(len(c))
    return _readonly(r)

  @functools.cached_property
  def ancestor_mask(self) -> np.ndarray:  # [N, N] bool, [i, j] = j is i or an ancestor of i
    n = self.num_nodes
    m = np.zeros((n, n), bool)
    m[0, 0] = True
    for i in range(1, n):
      m[i] = m[self.parents[i]]
      m[i, i] = True
    return _readonly(m)

  @functools.cached_property
  def levels(self) -> tuple[np.ndarray, ...]:  # D + 1 int32 arrays: node ids at each depth
    d = self.depths
    return tuple(_readonly(np.nonzero(d == k)[0].astype(np.int32)) for k in range(self.max_depth + 1))

  @property
  def is_chain(self) -> bool:
    return all(p == i - 1 for i, p in enumerate(self.parents) if i)

  @property
  def max_width(self) -> int:
    return int(self.num_children.max())

  @functools.cached_property
  def expanding_per_level(self) -> np.ndarray:  # [D] int32: nodes at depth d that have children
    nc = self.num_children
    return _readonly(np.asarray([int((nc[lv] > 0).sum()) for lv in self.levels[:-1]], np.int32))

  # ---- evaluation -------------------------------------------------------------------------------------------

  def path_probabilities(self, acceptance_vector: Sequence[float]) -> np.ndarray:
    """[N] float64: P(node is on the accepted path); root 1, rank-k child of u: P(u) * p[k] (0 past len(p))."""
    p = np.asarray(acceptance_vector, np.float64)
    out = np.zeros(self.num_nodes)
    out[0] = 1.0
    rank = self.child_rank
    for i in range(1, self.num_nodes):
      k = rank[i]
      out[i] = out[self.parents[i]] * (p[k] if k < len(p) else 0.0)
    return out

  def expected_tokens(self, acceptance_vector: Sequence[float]) -> float:
    """Expected tokens emitted per verify step (accepted candidates + the one bonus/corrected token)."""
    return float(self.path_probabilities(acceptance_vector).sum())

  # ---- (de)serialization ------------------------------------------------------------------------------------

  def to_json(self, **metadata) -> str:
    return json.dumps({"parents": list(self.parents), **metadata})

  @classmethod
  def from_json(cls, text: str) -> "Tree":
    d = json.loads(text)
    if isinstance(d, list):
      return cls(tuple(d))
    if not isinstance(d, dict) or not isinstance(d.get("parents"), list):
      raise ValueError("tree JSON must be a list of parents or an object with a 'parents' list")
    return cls(tuple(d["parents"]))

  def __repr__(self) -> str:
    return f"Tree(num_nodes={self.num_nodes}, max_depth={self.max_depth}, parents={self.parents})"


AR_TREE = Tree((-1,))   # the root-only tree: a round of plain autoregressive decoding


# ---- Sequoia dynamic program --------------------------------------------------------------------------------

_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class SequoiaTable:
  """DP tables for one acceptance vector.

  value[m, l]: best expected tokens of a subtree with at most m nodes and depth <= l (value[0, l] = 0).
  best_b[m, l]: number of root children of that subtree. choice[l, b, m]: size of the b-th child subtree
  (1-based b) in the best arrangement of b children with at most m nodes in total, each of depth <= l - 1.
  """
  p: np.ndarray
  value: np.ndarray   # [M + 1, D + 1] float64
  best_b: np.ndarray  # [M + 1, D + 1] int32
  choice: np.ndarray  # [D + 1, K + 1, M + 1] int32

  @property
  def max_nodes(self) -> int:
    return self.value.shape[0] - 1

  @property
  def max_depth(self) -> int:
    return self.value.shape[1] - 1

  def tree(self, max_nodes: int, max_depth: int) -> Tree:
    """Reconstruct the best tree with at most max_nodes nodes and depth <= max_depth."""
    if not (1 <= max_nodes <= self.max_nodes and 0 <= max_depth <= self.max_depth):
      raise ValueError(f"(max_nodes={max_nodes}, max_depth={max_depth}) outside the table "
                       f"({self.max_nodes}, {self.max_depth})")
    # Recursive description: (size budget, depth budget) per node; expand breadth first.
    parents = [-1]
    queue = [(0, max_nodes, max_depth)]  # (node id, node budget, depth budget)
    head = 0
    while head < len(queue):
      node, m, l = queue[head]
      head += 1
      b = int(self.best_b[m, l]) if l > 0 else 0
      sizes = []
      rest = m - 1
      for j in range(b, 0, -1):
        y = int(self.choice[l, j, rest])
        sizes.append(y)
        rest -= y
      sizes.reverse()  # sizes[k] = budget of the rank-k child
      for y in sizes:
        parents.append(node)
        queue.append((len(parents) - 1, y, l - 1))
    return Tree(tuple(parents))


def sequoia_table(acceptance_vector: Sequence[float], max_nodes: int, max_depth: int) -> SequoiaTable:
  """Run the Sequoia DP for all budgets up to (max_nodes, max_depth). O(D * K * M^2) with numpy over one axis."""
  p = np.asarray(acceptance_vector, np.float64)
  if p.ndim != 1 or len(p) == 0 or not np.isfinite(p).all() or (p < 0).any() or p.sum() > 1 + 1e-9:
    raise ValueError(f"acceptance vector must be a non-empty 1-D vector of probabilities summing to <= 1, got {p}")
  if max_nodes < 1 or max_depth < 0:
    raise ValueError(f"need max_nodes >= 1 and max_depth >= 0, got {max_nodes}, {max_depth}")
  M, D = int(max_nodes), int(max_depth)
  K = min(len(p), M - 1) if M > 1 else 0  # children past rank len(p) add nothing
  value = np.zeros((M + 1, D + 1))
  best_b = np.zeros((M + 1, D + 1), np.int32)
  choice = np.zeros((D + 1, K + 1, M + 1), np.int32)
  value[1:, 0] = 1.0
  ms = np.arange(M + 1)
  for l in range(1, D + 1):
    child = value[:, l - 1]          # [M + 1] best subtree of depth <= l - 1 with at most y nodes
    g_prev = np.zeros(M + 1)         # b = 0 children: value 0 for every budget
    g_all = [g_prev]
    for b in range(1, K + 1):
      g = np.full(M + 1, -np.inf)
      for m in range(b, M + 1):
        y = ms[1:m - b + 2]            # size of the b-th child: 1 .. m - (b - 1)
        cand = g_prev[m - y] + p[b - 1] * child[y]
        j = int(np.argmax(cand > cand.max() - _EPS))  # smallest y within EPS of the best: prefer small trees
        g[m] = cand[j]
        choice[l, b, m] = y[j]
      g_all.append(g)
      g_prev = g
    gs = np.stack(g_all)             # [K + 1, M + 1]
    for m in range(1, M + 1):
      col = gs[:, m - 1]
      bb = int(np.argmax(col > col.max() - _EPS))  # fewest children within EPS of the best
      best_b[m, l] = bb
      value[m, l] = 1.0 + col[bb]
  return SequoiaTable(p=_readonly(p), value=_readonly(value), best_b=_readonly(best_b), choice=_readonly(choice))


def sequoia_tree(acceptance_vector: Sequence[float], max_nodes: int, max_depth: int) -> Tree:
  """Best tree (root included in max_nodes) of depth <= max_depth maximizing Tree.expected_tokens."""
  return sequoia_table(acceptance_vector, max_nodes, max_depth).tree(max_nodes, max_depth)


def _as_cost(fn, what: str) -> Callable[[int], float]:
  if callable(fn):
    return lambda n: float(fn(int(n)))
  if isinstance(fn, Mapping):
    return lambda n: float(fn[int(n)])
  if isinstance(fn, (int, float)):
    return lambda n: float(fn)
  raise TypeError(f"{what} must be a number, a callable or a dict, got {type(fn).__name__}")


def hardware_aware_tree(acceptance_vector: Sequence[float], sizes: Sequence[int], max_depth: int,
                        t_draft, t_verify, min_depth: int = 0) -> tuple[Tree, dict]:
  """Pick the Sequoia tree minimizing predicted time per emitted token.

  For every candidate verify size N in `sizes` and depth bound min_depth <= d <= max_depth (min_depth 1:
  a tree that speculates, never the root alone), the DP tree T(N, d) costs
  sum over its draft levels of t_draft(width) + t_verify(N) seconds per step, and emits expected_tokens(T).
  t_draft: seconds per draft step (a number) or a callable tokens_per_row -> seconds (the number of nodes at a
  level that have children); t_verify: callable or dict N -> seconds (the verify step is charged at the padded
  size N even if the DP tree uses fewer nodes). Returns (tree, info) with info keys time_per_token,
  expected_tokens, size, depth, step_time.
  """
  sizes = sorted({int(s) for s in sizes})
  if not sizes or sizes[0] < 1:
    raise ValueError(f"sizes must be positive ints, got {sizes}")
  if not 0 <= min_depth <= max_depth:
    raise ValueError(f"need 0 <= min_depth <= max_depth, got {min_depth}, {max_depth}")
  draft = _as_cost(t_draft, "t_draft")
  verify = _as_cost(t_verify, "t_verify")
  table = sequoia_table(acceptance_vector, sizes[-1], max_depth)
  best = None
  for n in sizes:
    seen = set()
    for d in range(min_depth, max_depth + 1):
      tree = table.tree(n, d)
      if tree in seen:
        continue
      seen.add(tree)
      step = sum(draft(w) for w in tree.expanding_per_level) + verify(n)
      e = float(table.value[n, d])
      tpt = step / e
      if best is None or tpt < best[0] - 1e-15:
        best = (tpt, tree, dict(time_per_token=tpt, expected_tokens=e, size=n, depth=tree.max_depth,
                                step_time=step))
  return best[1], best[2]


# ---- shipped defaults ---------------------------------------------------------------------------------------

def build_default_tree(name: str) -> Tree:
  """Fresh construction of a named default tree (what the JSON files under tree_defaults/ hold)."""
  if name in DEFAULT_CHAINS:
    return Tree.chain(DEFAULT_CHAINS[name])
  if name in DEFAULT_TREE_SPECS:
    return sequoia_tree(DEFAULT_ACCEPTANCE_VECTOR, *DEFAULT_TREE_SPECS[name])
  raise ValueError(f"unknown default tree {name!r}; known: {sorted(DEFAULT_CHAINS) + sorted(DEFAULT_TREE_SPECS)}")


DEFAULT_TREE_NAMES = tuple(sorted(DEFAULT_CHAINS)) + tuple(sorted(DEFAULT_TREE_SPECS))


@functools.lru_cache(maxsize=None)
def default_tree(name: str) -> Tree:
  """Load a shipped tree from magicdec_jax/tree_defaults/<name>.json."""
  if name not in DEFAULT_TREE_NAMES:
    raise ValueError(f"unknown default tree {name!r}; known: {list(DEFAULT_TREE_NAMES)}")
  with open(os.path.join(DEFAULT_TREES_DIR, f"{name}.json")) as f:
    return Tree.from_json(f.read())


def write_default_trees(directory: str = DEFAULT_TREES_DIR) -> list[str]:
  """Regenerate the shipped JSON files (run `python -m magicdec_jax.trees`)."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name in DEFAULT_TREE_NAMES:
    tree = build_default_tree(name)
    meta = dict(name=name, acceptance_vector=list(DEFAULT_ACCEPTANCE_VECTOR),
                expected_tokens=round(tree.expected_tokens(DEFAULT_ACCEPTANCE_VECTOR), 6),
                num_nodes=tree.num_nodes, max_depth=tree.max_depth)
    if name in DEFAULT_TREE_SPECS:
      meta["budget"] = dict(zip(("max_nodes", "max_depth"), DEFAULT_TREE_SPECS[name]))
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
      f.write(tree.to_json(**meta) + "\n")
    paths.append(path)
  return paths


if __name__ == "__main__":
  for path in write_default_trees():
    print(path, default_tree.__wrapped__(os.path.basename(path)[:-5]))
