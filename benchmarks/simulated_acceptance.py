"""Simulated acceptance for benchmarks with random weights (gpu_suite): the decode loop's accept, patched.

Random weights accept almost nothing, so a benchmark that wants a draft's real costs at a realistic
acceptance replaces each round's accept / reject outcome by a simulated walk: a chain's draft token is
accepted with probability alpha, a tree's child of rank k with probability v[k] of an acceptance vector.
The real `accept` still runs (same cost, same output shapes); only its path is replaced, so drafting, the
verify pass, commits and rollbacks run as in real generation. Installed over `magicdec_jax.loop.accept` by
`install_bernoulli`, only inside the process that calls it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import loop, verify
from magicdec_jax.trees import Tree

_REAL_ACCEPT = verify.accept
_SIM = {"vector": None}      # simulated acceptance vector (a chain uses its first entry), None = real


def default_vector(alpha: float, width: int = 8) -> tuple[float, ...]:
  """v[k] = alpha (1 - alpha)^k: each of a node's children accepted independently with probability alpha
  (the first one wins); a chain node (rank 0 only) is accepted with alpha."""
  return tuple(float(alpha * (1 - alpha) ** k) for k in range(width))


def simulated_walk(tree: Tree, vector, keys):
  """path [B, D+1], n [B], acc_at [B, D] of a walk down `tree`: at each reached node one uniform draw u picks
  the child of rank k where v[0] + .. + v[k-1] <= u < v[0] + .. + v[k] (no child: the walk stops)."""
  d = tree.max_depth
  table = verify.child_table(tree)                       # [N, W], -1 padded
  w = table.shape[1]
  cum = np.zeros(table.shape, np.float64)
  v = list(vector) + [0.0] * max(0, w - len(vector))
  for u in range(tree.num_nodes):
    cum[u] = np.cumsum(v[:w])
  valid = jnp.asarray(table >= 0)
  table_j, cum_j = jnp.asarray(np.maximum(table, 0)), jnp.asarray(cum, jnp.float32)
  b = keys.shape[0]
  u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 0xBE5), (d,)))(keys)   # [B, D]
  node = jnp.zeros((b,), jnp.int32)
  alive = jnp.ones((b,), bool)
  path, acc = [node], []
  for dd in range(d):
    hit = (u[:, dd, None] < cum_j[node]) & valid[node]
    ok = alive & hit.any(-1)
    child = table_j[node, jnp.argmax(hit, -1)]
    node = jnp.where(ok, child, node)
    path.append(jnp.where(ok, child, 0))
    acc.append(ok)
    alive = ok
  acc_at = jnp.stack(acc, 1)
  return jnp.stack(path, 1).astype(jnp.int32), acc_at.sum(1).astype(jnp.int32), acc_at


def bernoulli_accept(tree: Tree, greedy, logits_or_p, q, node_tokens, keys):
  """The real `accept` (same cost, same outputs' shapes), then the accepted path replaced by a simulated walk
  (simulated_walk with the installed vector). Benchmark-only: installed by `install_bernoulli`."""
  path, n, nxt, acc_at = _REAL_ACCEPT(tree, greedy, logits_or_p, q, node_tokens, keys)
  vec = _SIM["vector"]
  if vec is None or tree.max_depth == 0:
    return path, n, nxt, acc_at
  p2, n2, acc2 = simulated_walk(tree, vec, keys)
  return p2.astype(path.dtype), n2.astype(n.dtype), nxt, acc2


def install_bernoulli(alpha: float | None, vector=None) -> None:
  """Route the decode loop's accept through bernoulli_accept with this alpha (a chain) or acceptance vector
  (chains and trees); both None: real acceptance."""
  _SIM["vector"] = tuple(vector) if vector is not None else ((alpha,) if alpha is not None else None)
  loop.accept = bernoulli_accept
  jax.clear_caches()           # the vector is a trace-time constant: never reuse a loop traced with another


def bernoulli_check(alpha: float, gamma: int = 4, batch: int = 4096, tree: Tree | None = None,
                    vector=None) -> dict:
  """Large-sample check of the switch itself: a chain's per-position conditional acceptance should be alpha;
  a tree's mean accepted length should be tree.expected_tokens(vector) - 1."""
  vector = tuple(vector) if vector is not None else (alpha,)
  tree = tree or Tree.chain(gamma)
  _SIM["vector"] = vector
  logits = jnp.zeros((batch, tree.num_nodes, 8))
  keys = jax.random.split(jax.random.key(1), batch)
  _, n, _, acc_at = bernoulli_accept(tree, True, logits, None, jnp.zeros((batch, tree.num_nodes), jnp.int32),
                                     keys)
  acc_at = np.asarray(acc_at)
  trials = batch + acc_at[:, :-1].sum()             # depth d is tried iff all before it were accepted
  return {"alpha": alpha, "gamma": gamma if tree.is_chain else None, "tree_nodes": tree.num_nodes,
          "rows": batch, "conditional_acceptance": float(acc_at.sum() / trials),
          "mean_accepted": float(np.asarray(n).mean()),
          "expected_mean_accepted": float(tree.expected_tokens(vector) - 1)}
