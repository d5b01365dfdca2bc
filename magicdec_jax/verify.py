"""Lossless acceptance of a speculated tree (a chain is a tree of width 1), per row.

Greedy: follow the target's argmax through the children; emit the argmax where no child matches.
Sampling: Sequoia's recursive rejection sampling. At node u the children were drawn from q_u without
replacement; child x is accepted with probability min(1, p(x)/q(x)); on rejection p <- norm(max(p - q, 0))
and x is removed from q (renormalized), which is exactly the distribution the next sibling was drawn from.
With no child accepted the row emits a sample of the residual p; at a leaf, a sample of the target's p
(the bonus token). For a chain this is Leviathan et al. / Chen et al. speculative sampling.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.sampling import sample
from magicdec_jax.trees import Tree


def child_table(tree: Tree) -> np.ndarray:
  """[N, W] child ids in rank order, -1 padded (W >= 1)."""
  w = max(tree.max_width, 1)
  table = -np.ones((tree.num_nodes, w), np.int32)
  for u, ch in enumerate(tree.children):
    table[u, :len(ch)] = ch
  return table


def simulated_walk(tree: Tree, vector: tuple[float, ...], keys: jax.Array):
  """path [B, D+1], n [B], acc_at [B, D] of a random walk down `tree` (Sampling.simulated_acceptance): at each
  reached node one uniform draw u picks the child of rank k where v[0] + .. + v[k-1] <= u < v[0] + .. + v[k]
  (no such child: the walk stops). keys [B]: the rows' verify keys."""
  table = child_table(tree)                              # [N, W], -1 padded
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


def _normalize(x: jax.Array, fallback: jax.Array) -> jax.Array:
  total = x.sum(-1, keepdims=True)
  return jnp.where(total > 0, x / jnp.where(total > 0, total, 1.0), fallback)


def accept(tree: Tree, greedy: bool, logits_or_p: jax.Array, q: jax.Array | None, node_tokens: jax.Array,
           keys: jax.Array):
  """Walk the tree for every row.

  logits_or_p: [B, N, V] target logits (greedy) or filtered probabilities p (sampling);
  q: [B, N, V] draft probabilities at each node (sampling only); node_tokens: [B, N]; keys: [B] row keys.
  Returns path [B, D+1] (node ids, path[:, 0] = 0, entries past n are 0), n [B] accepted candidates,
  next_token [B] (bonus or residual sample), accepted_at [B, D] bool (depth d+1 accepted).
  """
  b = node_tokens.shape[0]
  rows = jnp.arange(b)
  table = jnp.asarray(child_table(tree))
  depth = tree.max_depth
  cur = jnp.zeros((b,), jnp.int32)
  alive = jnp.ones((b,), bool)
  path = [cur]
  accepted_at = []
  if greedy:
    target = jnp.argmax(logits_or_p, axis=-1).astype(jnp.int32)         # [B, N]
    for _ in range(depth):
      ch = table[cur]                                                     # [B, W]
      tok = jnp.take_along_axis(node_tokens, jnp.maximum(ch, 0), axis=1)
      hit = (ch >= 0) & (tok == target[rows, cur][:, None]) & alive[:, None]
      found = hit.any(-1)
      nxt = ch[rows, jnp.argmax(hit, axis=-1)]
      cur = jnp.where(found, nxt, cur)
      alive = alive & found
      path.append(jnp.where(found, nxt, 0))
      accepted_at.append(found)
    next_token = target[rows, cur]
  else:
    p = logits_or_p
    p_res = p[:, 0]
    q_res = jnp.zeros_like(p_res) if q is None else q[:, 0]    # q is None: autoregressive (depth 0)
    for d in range(depth):
      ch = table[cur]
      chosen = -jnp.ones((b,), jnp.int32)
      for k in range(table.shape[1]):
        c = ch[:, k]
        valid = (c >= 0) & alive & (chosen < 0)
        x = node_tokens[rows, jnp.maximum(c, 0)]
        px, qx = p_res[rows, x], q_res[rows, x]
        u = jax.vmap(lambda key: jax.random.uniform(jax.random.fold_in(key, d * 1024 + k)))(keys)
        acc = valid & (qx > 0) & (u * qx < px)
        rej = (valid & ~acc)[:, None]
        chosen = jnp.where(acc, c, chosen)
        residual = _normalize(jnp.maximum(p_res - q_res, 0.0), p_res)
        q_removed = _normalize(q_res.at[rows, x].set(0.0), q_res)
        p_res = jnp.where(rej, residual, p_res)
        q_res = jnp.where(rej, q_removed, q_res)
      found = chosen >= 0
      cur = jnp.where(found, chosen, cur)
      p_res = jnp.where(found[:, None], p[rows, cur], p_res)
      q_res = jnp.where(found[:, None], q[rows, cur], q_res)
      alive = alive & found
      path.append(jnp.where(found, chosen, 0))
      accepted_at.append(found)
    final_keys = jax.vmap(lambda key: jax.random.fold_in(key, 1 << 20))(keys)
    next_token = sample(final_keys, p_res)
  n = jnp.stack(accepted_at, 1).sum(1).astype(jnp.int32) if depth else jnp.zeros((b,), jnp.int32)
  acc_at = jnp.stack(accepted_at, 1) if depth else jnp.zeros((b, 0), bool)
  return jnp.stack(path, 1), n, next_token, acc_at
