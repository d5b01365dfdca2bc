"""Simulated acceptance for runs with random weights: each round's accept / reject outcome replaced.

Random weights accept almost nothing, so a benchmark that wants a draft's real costs at a realistic acceptance
replaces each round's outcome by a simulated walk: a chain's draft token is accepted with probability alpha
once the ones before it were, a tree's child of rank k with probability v[k] of an acceptance vector. The real
`verify.accept` still runs (same cost, same output shapes); only its path is replaced, so drafting, the verify
pass, commits and rollbacks run as in real generation. `active()` routes the decode loop's accept through
`bernoulli_accept` (common.override, for the process's runs inside the block); `use(vector)` sets the vector
(None: real acceptance) and clears jax's caches, since the vector is a trace-time constant.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import loop, verify
from magicdec_jax.trees import Tree

_SIM = {"vector": None}      # the simulated acceptance vector (a chain uses its first entry); None: real


def default_vector(alpha: float, width: int = 8) -> tuple[float, ...]:
  """v[k] = alpha (1 - alpha)^k: each of a node's children accepted independently with probability alpha
  (the first one wins); a chain node (rank 0 only) is accepted with alpha."""
  return tuple(float(alpha * (1 - alpha) ** k) for k in range(width))


def simulated_walk(tree: Tree, vector, keys):
  """path [B, D+1], n [B], acc_at [B, D] of a walk down `tree`: at each reached node one uniform draw u picks
  the child of rank k where v[0] + .. + v[k-1] <= u < v[0] + .. + v[k] (no child: the walk stops)."""
  table = verify.child_table(tree)                       # [N, W], -1 padded
  w = table.shape[1]
  v = list(vector) + [0.0] * max(0, w - len(vector))
  cum = jnp.asarray(np.tile(np.cumsum(v[:w]), (tree.num_nodes, 1)), jnp.float32)
  valid, table_j = jnp.asarray(table >= 0), jnp.asarray(np.maximum(table, 0))
  u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 0xBE5), (tree.max_depth,)))(keys)   # [B, D]
  node = jnp.zeros((keys.shape[0],), jnp.int32)
  alive = jnp.ones((keys.shape[0],), bool)
  path, acc = [node], []
  for d in range(tree.max_depth):
    hit = (u[:, d, None] < cum[node]) & valid[node]
    ok = alive & hit.any(-1)
    child = table_j[node, jnp.argmax(hit, -1)]
    node = jnp.where(ok, child, node)
    path.append(jnp.where(ok, child, 0))
    acc.append(ok)
    alive = ok
  acc_at = jnp.stack(acc, 1)
  return jnp.stack(path, 1).astype(jnp.int32), acc_at.sum(1).astype(jnp.int32), acc_at


def bernoulli_accept(tree: Tree, greedy, logits_or_p, q, node_tokens, keys):
  """The real `accept`, then its accepted path replaced by a simulated walk with the vector in use."""
  path, n, nxt, acc_at = verify.accept(tree, greedy, logits_or_p, q, node_tokens, keys)
  if _SIM["vector"] is None or tree.max_depth == 0:
    return path, n, nxt, acc_at
  p2, n2, acc2 = simulated_walk(tree, _SIM["vector"], keys)
  return p2.astype(path.dtype), n2.astype(n.dtype), nxt, acc2


def active():
  """A context in which the decode loop accepts through bernoulli_accept."""
  return common.override(loop, accept=bernoulli_accept)


def use(vector) -> None:
  """Simulate this acceptance vector from now on (a chain: (alpha,)); None: real acceptance."""
  _SIM["vector"] = None if vector is None else tuple(float(x) for x in vector)
  jax.clear_caches()


def check(alpha: float, gamma: int = 4, batch: int = 4096, tree: Tree | None = None, vector=None) -> dict:
  """Large-sample check of the switch: a chain's per-position conditional acceptance should be alpha, a
  tree's mean accepted length tree.expected_tokens(vector) - 1."""
  vector = tuple(vector) if vector is not None else (alpha,)
  tree = tree or Tree.chain(gamma)
  use(vector)
  logits = jnp.zeros((batch, tree.num_nodes, 8))
  _, n, _, acc_at = bernoulli_accept(tree, True, logits, None, jnp.zeros((batch, tree.num_nodes), jnp.int32),
                                     jax.random.split(jax.random.key(1), batch))
  acc_at = np.asarray(acc_at)
  trials = batch + acc_at[:, :-1].sum()             # depth d is tried iff every depth before it was accepted
  return {"alpha": alpha, "gamma": gamma if tree.is_chain else None, "tree_nodes": tree.num_nodes, "rows": batch,
          "conditional_acceptance": float(acc_at.sum() / trials), "mean_accepted": float(np.asarray(n).mean()),
          "expected_mean_accepted": float(tree.expected_tokens(vector) - 1)}
