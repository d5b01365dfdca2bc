"""Fixed-shape prefix + tree attention as a Pallas kernel: a query position's output never depends on what
else is computed with it (the batch, the other query tokens, the cache's slot count).

Contract: q [B, T, H, D] over a linear cache k/v [B, K, S, D] under a prefix + tree rule (base [B], anc
[T, T]; the T new tokens' K/V already at slots base + j) -> [B, T, H, D], where a query token's output is
bitwise the same in a plain step, in a chain's or a tree's verify pass, in any batch and at any S (S a
multiple of the key block). Why a kernel: the XLA form of these numerics (layers/invariant.py) runs in small
tiles with unrolled block sums on an accelerator; this reads the cache once per query tile, as the fast
kernel (tree_attention.py) does, with every arithmetic step of a row fixed by its position alone.

Design ([docs](../../docs/how-it-works.md#the-fixed-shape-attention-kernel)):

  * One tile shape: `query_tokens` tokens x the G heads of a KV group, padded to R = a power of two >= 16
    rows (Triton's dot minimum), for plain steps, chains and trees alike. A row's dot results do not depend
    on the other rows of a fixed-shape dot.
  * A query at position p = base + depth splits its keys at cut = (p - (tail_blocks - 1) * key_block)
    rounded down to whole key blocks (>= 0): the prefix [0, cut) is read straight from the cache, the tail
    (tail_blocks blocks from cut on) is gathered to canonical slots: slot c < base is c, slot base + d the
    query's ancestor at depth d, so a tree node's tail holds what plain decoding's holds at its position.
  * Grid (B, K, query tiles, 1 + splits). Program 0 of a tile sums its tail, token by token; program n >= 1
    reads split n - 1: `split_slots` consecutive slots (a size, not a count) in key blocks in slot order,
    up to the tile's furthest cut. Each block updates a running (max, sum, output) per row (online
    softmax); a row's masked slots score NEG_BIG (finite), so a block with no slot visible to the row
    leaves its state bitwise unchanged (max unchanged, correction exp(0) = 1, nothing added).
  * The partials are merged in one fixed order (splits in slot order, then the tail), products rounded on
    their own: a fully masked split adds exact zeros, so more slots (more splits) change nothing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

NEG_BIG = -1e30   # finite "minus infinity": a fully masked block gives exp(0) = 1 and p = 0, never inf - inf
MIN_ROWS = 16     # Triton's smallest dot


def tile_rows(query_tokens: int, group: int) -> int:
  """Rows of a query tile: query_tokens x group padded to a power of two >= MIN_ROWS."""
  n = query_tokens * group
  return max(MIN_ROWS, 1 << max(0, (n - 1).bit_length()))


def ancestor_sources(anc: jax.Array) -> jax.Array:
  """anc [T, T] bool (anc[t, j]: node j is t or an ancestor of t) -> [T, T] int32: the node at depth d on
  t's path, or -1 past t's depth (where plain decoding holds t's ancestors: base + depth)."""
  anc = anc.astype(bool)
  depth = anc.sum(-1).astype(jnp.int32) - 1
  at = anc[:, :, None] & (depth[None, :, None] == jnp.arange(anc.shape[0])[None, None, :])   # [t, j, d]
  return jnp.where(at.any(1), jnp.argmax(at, axis=1), -1).astype(jnp.int32)


def deepest(anc) -> int | None:
  """The deepest node of a concrete ancestor mask, or None when it is traced."""
  try:
    return int(np.asarray(anc).astype(bool).sum(-1).max()) - 1
  except jax.errors.TracerArrayConversionError:
    return None


def canonical_tail(base: jax.Array, anc: jax.Array, tokens: int, num_slots: int, *, key_block: int,
                   tail_blocks: int):
  """Per (row, token), padded to `tokens`: (cut [B, tokens] int32, slot [B, tokens, W] int32, live [B, tokens,
  W] bool) with W = tail_blocks * key_block: where the prefix ends, the cache slot each canonical tail slot
  cut + c reads, and whether the query sees it. Padded tokens see nothing."""
  t = anc.shape[0]
  width = tail_blocks * key_block
  lookback = (tail_blocks - 1) * key_block
  src = jnp.pad(ancestor_sources(anc), ((0, tokens - t), (0, 0)), constant_values=-1)        # [T', T]
  depth = jnp.pad(anc.astype(bool).sum(-1).astype(jnp.int32) - 1, (0, tokens - t), constant_values=-1)
  base = base.astype(jnp.int32)[:, None]
  pos = base + jnp.maximum(depth, 0)[None, :]                                               # [B, T']
  cut = jnp.maximum((pos - lookback) // key_block * key_block, 0)
  c = cut[:, :, None] + jnp.arange(width, dtype=jnp.int32)                                  # [B, T', W]
  rel = c - base[:, :, None]
  node = jnp.take_along_axis(jnp.broadcast_to(src[None], (base.shape[0],) + src.shape), jnp.clip(rel, 0, t - 1),
                             axis=2)
  live = jnp.where(rel < 0, True, (rel <= depth[None, :, None]) & (node >= 0)) & (c < num_slots)
  live = live & (depth >= 0)[None, :, None]
  slot = jnp.where(live, jnp.where(rel < 0, c, base[:, :, None] + node), 0)
  cut = jnp.where((depth >= 0)[None, :], cut, 0)
  return cut, slot, live


def _online_step(state, q, kb, vb, vis, *, scale, precision):
  """One key block [Bk, D] into the running (o [R, D], m [R], l [R]) of q [R, D], slots visible per vis
  [R, Bk]: a row with nothing visible keeps its state bitwise."""
  o, m, l = state
  s = jnp.einsum("RD,SD->RS", q, kb, preferred_element_type=jnp.float32, precision=precision)
  s = jnp.where(vis, s * scale, NEG_BIG)
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  corr = jnp.exp(m - m_new)
  p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
  pv = jnp.einsum("RS,SD->RD", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32, precision=precision)
  return corr[:, None] * o + pv, m_new, corr * l + jnp.sum(p, axis=1)


def _kernel(cut_ref, live_ref, q_ref, k_ref, v_ref, tk_ref, tv_ref, o_ref, m_ref, l_ref, *, group: int,
            tokens: int, key_block: int, tail_blocks: int, split_blocks: int, scale: float, precision):
  """One (row, KV head, query tile, part) program: part 0 the tile's canonical tails, part n the prefix
  keys of split n - 1. cut_ref [R] int32, live_ref [R, W] int8, q_ref [R, D], k_ref/v_ref [S, D],
  tk_ref/tv_ref [tokens * W, D] (the gathered tails); out o_ref [R, D], m_ref/l_ref [R]."""
  part = pl.program_id(3)
  q = q_ref[...]
  rows, d = q.shape
  width = tail_blocks * key_block
  init = (jnp.zeros((rows, d), jnp.float32), jnp.full((rows,), NEG_BIG, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  step = functools.partial(_online_step, q=q, scale=scale, precision=precision)

  def store(state):
    o_ref[...], m_ref[...], l_ref[...] = state

  @pl.when(part == 0)
  def _tail():
    token = lax.div(lax.broadcasted_iota(jnp.int32, (rows,), 0), jnp.int32(group))

    def body(j, state):                 # token j's tail blocks in slot order
      for blk in range(tail_blocks):
        at = j * width + blk * key_block
        kb, vb = tk_ref[pl.ds(at, key_block), :], tv_ref[pl.ds(at, key_block), :]
        vis = (token == j)[:, None] & (live_ref[:, pl.ds(blk * key_block, key_block)] != 0)
        state = step(state, kb=kb, vb=vb, vis=vis)
      return state

    store(lax.fori_loop(0, tokens, body, init))

  @pl.when(part > 0)
  def _prefix():
    cut = cut_ref[...]                                                  # [R]
    start = (part - 1) * (split_blocks * key_block)
    top = jnp.max(cut)
    # lax.div truncates where // floors: they differ only below zero, which the clip takes to 0 either way
    blocks = jnp.clip(lax.div(top - start + key_block - 1, jnp.int32(key_block)), 0, split_blocks)
    lane = lax.broadcasted_iota(jnp.int32, (key_block,), 0)

    def body(i, state):
      off = start + i * key_block
      kb, vb = k_ref[pl.ds(off, key_block), :], v_ref[pl.ds(off, key_block), :]
      vis = (off + lane)[None, :] < cut[:, None]
      return step(state, kb=kb, vb=vb, vis=vis)

    store(lax.fori_loop(0, blocks, body, init))


def merge_parts(o: jax.Array, m: jax.Array, l: jax.Array) -> jax.Array:
  """o [..., P, R, D], m/l [..., P, R] of parts 0 (tail) .. P - 1 (splits) -> [..., R, D] normalised: merged
  in the fixed order splits 1 .. P - 1, then the tail, each product rounded on its own (x unknown 1.0, so no
  compiler fuses it into the addition differently in different programs); a part with nothing visible adds
  exact zeros. Rows with nothing visible at all give 0."""
  one = o.reshape(-1)[0] * 0 + 1
  order = list(range(1, o.shape[-3])) + [0]
  acc_o, acc_m, acc_l = o[..., order[0], :, :], m[..., order[0], :], l[..., order[0], :]
  for n in order[1:]:
    m_new = jnp.maximum(acc_m, m[..., n, :])
    a, c = jnp.exp(acc_m - m_new), jnp.exp(m[..., n, :] - m_new)
    acc_o = (acc_o * a[..., None]) * one + (o[..., n, :, :] * c[..., None]) * one
    acc_l = (acc_l * a) * one + (l[..., n, :] * c) * one
    acc_m = m_new
  return jnp.where(acc_l[..., None] > 0, acc_o / jnp.where(acc_l > 0, acc_l, 1.0)[..., None], 0.0)


def pallas_fixed_attention(q: jax.Array, k: jax.Array, v: jax.Array, base: jax.Array, anc: jax.Array, *,
                           query_tokens: int, key_block: int, tail_blocks: int, split_slots: int,
                           scale: float | None = None, chain: bool = False, interpret: bool = False,
                           compiler_params=None) -> jax.Array:
  """q [B,T,H,D], k/v [B,K,S,D], base [B] int32, anc [T,T] bool -> [B,T,H,D] in q.dtype (module docstring).

  Query t of row b sees slots [0, base[b]) and tree slots base[b] + j with anc[t, j]. A tree's depth must
  fit its tail ((tail_blocks - 1) * key_block slots) unless `chain` (anc the causal triangle: a chunk of
  consecutive tokens, of any length). split_slots: a multiple of key_block. S is padded to whole key blocks
  (a copy of the cache: the engine sizes target caches in whole blocks)."""
  b, t, h, d = q.shape
  kh, s = k.shape[1], k.shape[2]
  if h % kh or anc.shape != (t, t) or v.shape != k.shape or k.shape[0] != b or k.shape[3] != d:
    raise ValueError(f"bad shapes q={q.shape} k={k.shape} v={v.shape} anc={anc.shape}")
  if key_block < MIN_ROWS or key_block & (key_block - 1) or split_slots % key_block or tail_blocks < 2:
    raise ValueError(f"key_block={key_block} must be a power of two >= {MIN_ROWS}, split_slots={split_slots} a "
                     f"multiple of it and tail_blocks={tail_blocks} >= 2")
  lookback = (tail_blocks - 1) * key_block
  depth = deepest(anc)
  if not chain and (t - 1 if depth is None else depth) > lookback:
    raise ValueError(f"a round of depth {t - 1 if depth is None else depth} exceeds the fixed-shape kernel's "
                     f"tail of {lookback} slots (tail_blocks={tail_blocks}, key_block={key_block})")
  g = h // kh
  scale = float(d ** -0.5 if scale is None else scale)
  if s % key_block:
    pad = ((0, 0), (0, 0), (0, key_block - s % key_block), (0, 0))
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    s = k.shape[2]
  tiles = -(-t // query_tokens)
  tokens = tiles * query_tokens
  rows = tile_rows(query_tokens, g)
  width = tail_blocks * key_block
  splits = -(-s // split_slots)

  cut, slot, live = canonical_tail(base, anc, tokens, s, key_block=key_block, tail_blocks=tail_blocks)

  def per_row(x, fill):                           # [B, T', ...] -> [B, tiles, R, ...]: row r = token r // G
    x = jnp.repeat(x.reshape(b, tiles, query_tokens, *x.shape[2:]), g, axis=2)
    pad = ((0, 0), (0, 0), (0, rows - query_tokens * g)) + ((0, 0),) * (x.ndim - 3)
    return jnp.pad(x, pad, constant_values=fill)

  cut_rows = per_row(cut, 0)                                                   # [B, tiles, R]
  live_rows = per_row(live.astype(jnp.int8), 0)                                # [B, tiles, R, W]
  qr = q.reshape(b, t, kh, g, d).transpose(0, 2, 1, 3, 4)                      # [B, K, T, G, D]
  qr = jnp.pad(qr, ((0, 0), (0, 0), (0, tokens - t), (0, 0), (0, 0)))
  qr = qr.reshape(b, kh, tiles, query_tokens * g, d)
  qr = jnp.pad(qr, ((0, 0), (0, 0), (0, 0), (0, rows - query_tokens * g), (0, 0)))   # [B, K, tiles, R, D]
  idx = slot.reshape(b, 1, tokens * width, 1)
  tk = jnp.take_along_axis(k, idx, axis=2).reshape(b, kh, tiles, query_tokens * width, d)
  tv = jnp.take_along_axis(v, idx, axis=2).reshape(b, kh, tiles, query_tokens * width, d)

  kernel = functools.partial(
      _kernel, group=g, tokens=query_tokens, key_block=key_block, tail_blocks=tail_blocks,
      split_blocks=split_slots // key_block, scale=scale,
      precision=lax.Precision.HIGHEST if q.dtype == jnp.float32 else None)
  kv_spec = pl.BlockSpec((None, None, s, d), lambda i, j, r, n: (i, j, 0, 0))
  tail_spec = pl.BlockSpec((None, None, None, query_tokens * width, d), lambda i, j, r, n: (i, j, r, 0, 0))
  row_spec = pl.BlockSpec((None, None, None, None, rows), lambda i, j, r, n: (i, j, r, n, 0))
  o, m, l = pl.pallas_call(
      kernel,
      grid=(b, kh, tiles, 1 + splits),
      in_specs=[
          pl.BlockSpec((None, None, rows), lambda i, j, r, n: (i, r, 0)),                 # cut per row
          pl.BlockSpec((None, None, rows, width), lambda i, j, r, n: (i, r, 0, 0)),       # tail visibility
          pl.BlockSpec((None, None, None, rows, d), lambda i, j, r, n: (i, j, r, 0, 0)),  # q tile
          kv_spec, kv_spec, tail_spec, tail_spec,
      ],
      out_specs=[pl.BlockSpec((None, None, None, None, rows, d), lambda i, j, r, n: (i, j, r, n, 0, 0)),
                 row_spec, row_spec],
      out_shape=[jax.ShapeDtypeStruct((b, kh, tiles, 1 + splits, rows, d), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, tiles, 1 + splits, rows), jnp.float32),
                 jax.ShapeDtypeStruct((b, kh, tiles, 1 + splits, rows), jnp.float32)],
      interpret=interpret,
      compiler_params=compiler_params,
      name="fixed_attention",
  )(cut_rows.astype(jnp.int32), live_rows, qr, k, v, tk, tv)
  out = merge_parts(o, m, l)[:, :, :, :query_tokens * g]                      # [B, K, tiles, tq * G, D]
  out = out.reshape(b, kh, tokens, g, d)[:, :, :t].transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)
  return out.astype(q.dtype)
