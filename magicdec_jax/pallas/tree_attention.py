"""Prefix + tree attention over a linear KV cache as a split-K (flash-decoding) Pallas kernel.

Why: at long context the verify step of speculative decoding is bound by reading the KV cache, so
each K/V block must be read once for all G query heads of its KV group and all T tree queries.

Layout. The grid is (batch, KV head, query-row block, KV split). The query rows of one KV group are
the T*G (token, head-in-group) pairs, row r = t * G + g, padded to a power of two >= 16 (Triton dot
minimum). Each program walks its split of the row's *live* range [0, base[b] + T) — the split length
is computed per row at run time, so ragged rows need no padding and dead slots are never read — one
[block_k, D] K/V block at a time, and writes an unnormalised partial (o, m, l). A small XLA step
merges the splits with log-sum-exp.

Masking. Slot s is visible to row r iff s < base (prefix) or anc[r // G, s - base] (tree). The
ancestor mask is passed as an int8 [rows, block_k + T + block_k] matrix whose column c holds tree
slot j = c - block_k (zero outside [0, T)), so the tree bits of any block are one contiguous,
clamped, dynamic slice. A block that would run past the end of the cache is read shifted back to end
at slot S - 1, and slots already handled are masked out, so every load stays in bounds. Values of
slots outside the live range are zeroed before the second matmul, so garbage (even NaN) never leaks.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

NEG_BIG = -1e30  # finite "minus infinity": an all-masked block gives exp(0) * 0, never inf - inf
TARGET_PROGRAMS = 512  # aim for a few waves of programs on a ~132-SM GPU (untuned)
MAX_SPLITS = 64


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _prev_pow2(n: int) -> int:
  return 1 << (max(1, n).bit_length() - 1)


def _cdiv(a, b):
  return (a + b - 1) // b


def _kernel(base_ref, q_ref, anc_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, num_tokens: int,
            num_slots: int, block_k: int, num_splits: int, scale: float, precision):
  """One (row b, KV head, row block, split) program.

  base_ref [] int32; q_ref [R, D]; anc_ref [R, W] int8; k_ref, v_ref [S, D];
  o_ref [R, D] f32 (unnormalised); m_ref, l_ref [R] f32 (running max and sum of exp).
  """
  split = pl.program_id(3)
  base = base_ref[...]
  end = base + num_tokens                                     # live range of this row: [0, end)
  split_len = _cdiv(_cdiv(end, num_splits), block_k) * block_k
  start = split * split_len
  stop = jnp.minimum(start + split_len, end)
  num_blocks = _cdiv(jnp.maximum(stop - start, 0), block_k)

  q = q_ref[...]                                              # [R, D]
  rows, d = q.shape
  lane = jnp.arange(block_k, dtype=jnp.int32)                 # [Bk]

  def body(i, carry):
    o, m, l = carry                                           # [R, D], [R], [R]
    blk = start + i * block_k
    off = jnp.minimum(blk, num_slots - block_k)               # shifted back at the cache end
    slots = off + lane                                        # [Bk]
    valid = (slots >= blk) & (slots < stop)                   # [Bk] live and not yet handled
    col = jnp.clip(off - base + block_k, 0, num_tokens + block_k)
    tree = anc_ref[:, pl.ds(col, block_k)] != 0               # [R, Bk]
    vis = valid[None, :] & ((slots < base)[None, :] | tree)   # [R, Bk]
    k = k_ref[pl.ds(off, block_k), :]                         # [Bk, D]
    v = v_ref[pl.ds(off, block_k), :]                         # [Bk, D]
    s = jnp.einsum("RD,SD->RS", q, k, preferred_element_type=jnp.float32, precision=precision)
    s = jnp.where(vis, s * scale, NEG_BIG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))                # [R]
    corr = jnp.exp(m - m_new)
    p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)      # [R, Bk]
    v = jnp.where(valid[:, None], v, jnp.zeros_like(v))
    pv = jnp.einsum("RS,SD->RD", p.astype(v.dtype), v, preferred_element_type=jnp.float32,
                    precision=precision)
    return corr[:, None] * o + pv, m_new, corr * l + jnp.sum(p, axis=1)

  init = (jnp.zeros((rows, d), jnp.float32), jnp.full((rows,), NEG_BIG, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  o, m, l = lax.fori_loop(0, num_blocks, body, init)
  o_ref[...] = o
  m_ref[...] = m
  l_ref[...] = l


def default_block_k(block_q: int) -> int:
  """KV block length: longer blocks for few query rows (decode), shorter when the row block is big."""
  return 128 if block_q <= 32 else 64


def default_num_splits(batch: int, kv_heads: int, q_blocks: int, num_slots: int, block_k: int) -> int:
  programs = batch * kv_heads * q_blocks
  most = max(1, min(MAX_SPLITS, num_slots // (4 * block_k)))
  return max(1, min(most, _cdiv(TARGET_PROGRAMS, programs)))


def merge_splits(o: jax.Array, m: jax.Array, l: jax.Array) -> jax.Array:
  """o [B,K,N,R,D], m/l [B,K,N,R] partials of N splits -> [B,K,R,D] normalised (log-sum-exp merge)."""
  m_all = jnp.max(m, axis=2, keepdims=True)                   # [B, K, 1, R]
  w = jnp.exp(m - m_all)                                      # [B, K, N, R]; empty splits -> 0
  num = jnp.einsum("BKNR,BKNRD->BKRD", w, o, precision=lax.Precision.HIGHEST)
  den = jnp.einsum("BKNR,BKNR->BKR", w, l, precision=lax.Precision.HIGHEST)
  return num / den[..., None]


def pallas_tree_attention(q: jax.Array, k: jax.Array, v: jax.Array, base: jax.Array, anc: jax.Array,
                          *, scale: float | None = None, block_k: int | None = None,
                          block_q: int | None = None, num_splits: int | None = None,
                          interpret: bool = False, compiler_params=None) -> jax.Array:
  """q [B,T,H,D], k/v [B,K,S,D], base [B] int32, anc [T,T] bool -> out [B,T,H,D] in q.dtype.

  block_q: query rows (T*G pairs) per program, a power of two >= 16 (default min(rows, 64)).
  block_k: KV slots per inner step, a power of two >= 16 (default by block_q, capped by S).
  num_splits: KV splits per row (default: enough programs to fill a GPU).
  compiler_params: e.g. pltriton.CompilerParams(num_warps=4, num_stages=2) to force Triton.
  """
  b, t, h, d = q.shape
  kh, s = k.shape[1], k.shape[2]
  if h % kh or anc.shape != (t, t) or v.shape != k.shape or k.shape[0] != b or k.shape[3] != d:
    raise ValueError(f"bad shapes q={q.shape} k={k.shape} v={v.shape} anc={anc.shape}")
  g = h // kh
  scale = float(d ** -0.5 if scale is None else scale)
  rows = t * g
  rows_p = max(16, _next_pow2(rows))
  block_q = min(rows_p, 64 if block_q is None else block_q)
  block_k = default_block_k(block_q) if block_k is None else block_k
  for name, n in (("block_q", block_q), ("block_k", block_k)):
    if n < 16 or n & (n - 1):
      raise ValueError(f"{name}={n} must be a power of two >= 16")
  if s < 16:  # tiny caches only (tests): pad so one 16-slot block fits
    pad = ((0, 0), (0, 0), (0, 16 - s), (0, 0))
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    s = 16
  block_k = min(block_k, _prev_pow2(s))
  q_blocks = rows_p // block_q
  if num_splits is None:
    num_splits = default_num_splits(b, kh, q_blocks, s, block_k)

  qr = q.reshape(b, t, kh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kh, rows, d)
  qr = jnp.pad(qr, ((0, 0), (0, 0), (0, rows_p - rows), (0, 0)))            # [B, K, Rp, D]
  anc_rows = jnp.repeat(anc.astype(jnp.int8), g, axis=0)                   # [rows, T]
  anc_p = jnp.pad(anc_rows, ((0, rows_p - rows), (block_k, block_k)))      # [Rp, W]
  width = anc_p.shape[1]

  kernel = functools.partial(
      _kernel, num_tokens=t, num_slots=s, block_k=block_k, num_splits=num_splits, scale=scale,
      precision=lax.Precision.HIGHEST if q.dtype == jnp.float32 else None)
  grid = (b, kh, q_blocks, num_splits)
  kv_spec = pl.BlockSpec((None, None, s, d), lambda i, j, r, n: (i, j, 0, 0))
  o, m, l = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[
          pl.BlockSpec((None,), lambda i, j, r, n: (i,)),                             # base
          pl.BlockSpec((None, None, block_q, d), lambda i, j, r, n: (i, j, r, 0)),    # q
          pl.BlockSpec((block_q, width), lambda i, j, r, n: (r, 0)),                 # anc
          kv_spec, kv_spec,
      ],
      out_specs=[
          pl.BlockSpec((None, None, None, block_q, d), lambda i, j, r, n: (i, j, n, r, 0)),
          pl.BlockSpec((None, None, None, block_q), lambda i, j, r, n: (i, j, n, r)),
          pl.BlockSpec((None, None, None, block_q), lambda i, j, r, n: (i, j, n, r)),
      ],
      out_shape=[
          jax.ShapeDtypeStruct((b, kh, num_splits, rows_p, d), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, num_splits, rows_p), jnp.float32),
          jax.ShapeDtypeStruct((b, kh, num_splits, rows_p), jnp.float32),
      ],
      interpret=interpret,
      compiler_params=compiler_params,
      name="tree_attention",
  )(base.astype(jnp.int32), qr, anc_p, k, v)
  out = merge_splits(o, m, l)[:, :, :rows]                                   # [B, K, rows, D]
  out = out.reshape(b, kh, t, g, d).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)
  return out.astype(q.dtype)
