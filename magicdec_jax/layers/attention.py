"""Grouped-query attention over an explicit KV cache passed in and returned.

The new tokens' keys/values are written into the cache at per-row slots first, then every query attends
to the cache under a visibility rule. Three rules cover every caller:
  * `PrefixTree(base, anc)` — a linear cache: slots [0, base) are the row's prefix, the T new tokens sit at
    slots base + j and see each other through the ancestor mask `anc` (causal chunk, chain, or tree);
  * `DenseMask(mask)` — any explicit [B, T, S] mask (the draft's sink + window ring buffer);
  * `CausalChunk(start)` — a prefill chunk (layers/prefill_attention.py; with fixed-shape numerics
    layers/invariant.chunk_attention): only the causal triangle is computed, block by block.
A layer with a sliding window w (static, from the config and the layer index) also hides every key whose
position is not in (q - w, q] for a query at position q, under every rule: the query positions are the
forward pass's, the key positions the slots' (slot == position in a linear cache, the tree's own positions
for its nodes, `DenseMask.key_pos` in a draft's ring). The Pallas kernels know no windows or soft-capping:
such layers take the XLA path (with fixed-shape numerics, its fixed tiles: still invariant, slower).
"""
from __future__ import annotations


import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from magicdec_jax import pallas
from magicdec_jax.backend import FixedShapes
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.dense import dense, weight_param
from magicdec_jax.layers.invariant import chunk_attention, tiled_attention
from magicdec_jax.layers.norm import RMSNorm
from magicdec_jax.layers.prefill_attention import CausalChunk, causal_chunk_attention, softcapped
from magicdec_jax.layers.rope import rotate
from magicdec_jax.pallas.xla_attention import dot_operands, fold_queries, unfold_queries, visibility_mask

NEG_INF = -1e30


@flax.struct.dataclass
class PrefixTree:
  base: jax.Array  # [B] int32
  anc: jax.Array   # [T, T] bool


@flax.struct.dataclass
class DenseMask:
  """An explicit mask. With `alt_pos`, slots flagged in `alt_slots` are scored against the query rotated
  at `alt_pos` instead of its true position: StreamingLLM's positions-within-the-cache, where sink keys
  sit just before the window (keys are stored rotated at their absolute positions). `key_pos`: the position
  each slot holds (a ring, where slot != position; -1: none); None means slot s holds position s. A mask
  over a target KVCache's linear slots gives `filled` for its ring layers (ring_rule). `tree`: the PrefixTree
  a ring layer's mask was made from, so fixed-shape numerics sum its nodes where plain decoding holds them."""
  mask: jax.Array                    # [B, T, S] bool
  alt_pos: jax.Array | None = None   # [B, T] int32
  alt_slots: jax.Array | None = None  # [S] bool
  key_pos: jax.Array | None = None   # [B, S] int32
  filled: jax.Array | None = None    # [B] over a target KVCache: virtual slots below it are written (ring layers)
  tree: PrefixTree | None = None     # the linear rule a ring layer's mask shows (ring_rule): fixed-shape sums


def in_window(key_pos: jax.Array, q_pos: jax.Array, window: int) -> jax.Array:
  """key_pos [B, S], q_pos [B, T] -> [B, T, S]: key inside the query's sliding window (q - w, q]."""
  return key_pos[:, None, :] > q_pos[:, :, None] - window


def tree_key_positions(base: jax.Array, q_pos: jax.Array, num_slots: int) -> jax.Array:
  """[B, S] the position each slot holds under a PrefixTree rule: slot s < base holds s, slot base + j the
  j-th new token's position q_pos[:, j] (its tree depth, not j), later slots none (-1)."""
  t = q_pos.shape[1]
  s = jnp.arange(num_slots, dtype=jnp.int32)[None, :]
  rel = s - base[:, None].astype(jnp.int32)
  tree = jnp.take_along_axis(q_pos.astype(jnp.int32), jnp.clip(rel, 0, t - 1), axis=1)
  return jnp.where(rel < 0, s, jnp.where(rel < t, tree, -1))


def ring_rule(spec, q_pos: jax.Array, size: int) -> DenseMask:
  """A linear-cache rule (PrefixTree, or a prefill chunk's CausalChunk) seen through a ring layer of `size`
  slots holding virtual slot v at v % size: the T new tokens sit at virtual slots base .. base + T - 1
  and every virtual slot below base + T has been written in order, so ring slot r holds the latest v = r
  (mod size) below base + T. It shows a query that slot's prefix position (v < base), or its tree node under
  the ancestor mask; a slot not yet written (v < 0) is invisible. key_pos: the position each slot holds,
  for the layer's window (which the ring's size covers, so no key a query needs was overwritten)."""
  t = q_pos.shape[1]
  if isinstance(spec, DenseMask) and spec.filled is not None and spec.key_pos is None:
    r = jnp.arange(size, dtype=jnp.int32)[None, :]
    top = spec.filled.astype(jnp.int32)[:, None]
    virt = r + size * jnp.floor_divide(top - 1 - r, size)
    seen = jnp.take_along_axis(spec.mask, jnp.clip(virt, 0, spec.mask.shape[2] - 1)[:, None, :].repeat(t, 1), 2)
    return DenseMask(seen & (virt >= 0)[:, None, :], key_pos=jnp.where(virt >= 0, virt, -1))
  if isinstance(spec, CausalChunk):
    base = jnp.broadcast_to(spec.start.astype(jnp.int32), (q_pos.shape[0],))
    anc = jnp.tril(jnp.ones((t, t), bool))
  elif isinstance(spec, PrefixTree):
    base, anc = spec.base.astype(jnp.int32), spec.anc
  else:
    raise ValueError("a ring layer of the target cache takes a PrefixTree, a CausalChunk or a DenseMask with "
                     f"`filled`, got {type(spec).__name__}")
  r = jnp.arange(size, dtype=jnp.int32)[None, :]
  top = base[:, None] + t
  virt = r + size * jnp.floor_divide(top - 1 - r, size)                      # [B, S] latest v below top
  rel = virt - base[:, None]
  node = jnp.clip(rel, 0, t - 1)
  key_pos = jnp.where(virt < 0, -1, jnp.where(rel < 0, virt, jnp.take_along_axis(q_pos.astype(jnp.int32),
                                                                                   node, axis=1)))
  tree = jnp.moveaxis(jnp.take(anc, node, axis=1), 1, 0)                     # [B, T, S]: anc[j, node]
  mask = jnp.where((rel < 0)[:, None, :], (virt >= 0)[:, None, :], tree)
  return DenseMask(mask, key_pos=key_pos, tree=spec if isinstance(spec, PrefixTree) else None)


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     return_scores: bool = False, q_alt: jax.Array | None = None,
                     alt_slots: jax.Array | None = None, *, scale: float | None = None,
                     softcap: float | None = None, fixed: FixedShapes | None = None, tree=None,
                     window: int | None = None, ring: bool = False):
  """q [B,T,H,D], k/v [B,K,S,D], mask [B,T,S] -> out [B,T,H,D] (and [B,K,S] probability mass per KV head).
  Logits are q.k x `scale` (default D ** -0.5), soft-capped to softcap * tanh(. / softcap) if given.
  `fixed`: fixed-shape numerics at those shapes (layers/invariant.tiled_attention; not with scores or q_alt),
  with tree = (base, anc) where the mask is a PrefixTree's (a tree's nodes then summed at canonical slots;
  `window`: the layer's, already in the mask; `ring`: k/v are a ring layer's, slot = virtual slot % S)."""
  b, t, h, d = q.shape
  kh = k.shape[1]
  out_dtype = q.dtype
  scale = d ** -0.5 if scale is None else scale
  q, k, v, q_alt = dot_operands(q, k, v, q if q_alt is None else q_alt)
  q_alt = None if alt_slots is None else q_alt
  prec = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None   # no TF32 on GPU for fp32
  mask_q = jnp.repeat(mask, h // kh, axis=1)                                  # [B, T*G, S]
  if fixed is not None:
    if return_scores or q_alt is not None:
      raise ValueError("fixed-shape attention returns no scores and takes no alternative query positions")
    out = tiled_attention(fold_queries(q, kh), k, v, mask_q, tokens=t, scale=scale, softcap=softcap,
                          precision=prec, fixed=fixed, tree=tree, window=window, ring=ring)
    return unfold_queries(out, t).astype(out_dtype)

  def scores(qq):
    return softcapped(jnp.einsum("BKQD,BKSD->BKQS", fold_queries(qq, kh), k, preferred_element_type=jnp.float32,
                                 precision=prec) * scale, softcap)

  logits = scores(q)
  if q_alt is not None:
    logits = jnp.where(alt_slots[None, None, None, :], scores(q_alt), logits)
  logits = jnp.where(mask_q[:, None], logits, NEG_INF)
  probs = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum("BKQS,BKSD->BKQD", probs.astype(v.dtype), v, preferred_element_type=jnp.float32,
                   precision=prec)
  out = unfold_queries(out, t).astype(out_dtype)
  if return_scores:
    return out, probs.sum(axis=2)
  return out


def attend(q, k, v, spec, impl: str = "xla", return_scores: bool = False, q_alt=None, *, q_pos=None,
           window: int | None = None, scale: float | None = None, softcap: float | None = None,
           fixed: FixedShapes | None = None):
  """Dispatch on the visibility rule; the prefix+tree rule may use the Pallas kernel (not with a window
  or soft-capping). With fixed-shape numerics (`fixed`) it takes the kernel fixed.attention names (the
  fixed-shape Pallas kernel, or XLA's tiles: layers/invariant.py), never `impl`. q_pos [B, T]: the query
  positions (needed with a window)."""
  num_slots = k.shape[2]
  if isinstance(spec, PrefixTree) and fixed is not None and fixed.attention != "xla" and window is None \
      and softcap is None and not return_scores:
    return pallas.fixed_attention(q, k, v, spec.base, spec.anc, fixed=fixed, scale=scale)
  if isinstance(spec, PrefixTree):
    kernel = window is None and softcap is None and not return_scores and fixed is None
    if kernel and impl == "auto":
      impl = pallas.resolve_impl(q, k, v, spec.base, spec.anc, scale=scale)
    if kernel and impl != "xla":
      return pallas.tree_attention(q, k, v, spec.base, spec.anc, scale=scale, impl=impl)
    mask = visibility_mask(spec.base, spec.anc, num_slots)
    if window is not None:
      mask = mask & in_window(tree_key_positions(spec.base, q_pos, num_slots), q_pos, window)
    return masked_attention(q, k, v, mask, return_scores, scale=scale, softcap=softcap, fixed=fixed,
                            tree=(spec.base, spec.anc), window=window)
  mask = spec.mask
  if window is not None:
    key_pos = spec.key_pos
    if key_pos is None:                                            # a linear cache: slot s holds position s
      key_pos = jnp.broadcast_to(jnp.arange(num_slots, dtype=jnp.int32), (q.shape[0], num_slots))
    mask = mask & in_window(key_pos, q_pos, window)
  tree = None if spec.tree is None or fixed is None else (spec.tree.base, spec.tree.anc)
  return masked_attention(q, k, v, mask, return_scores, q_alt, spec.alt_slots, scale=scale, softcap=softcap,
                          fixed=fixed, tree=tree, window=window, ring=tree is not None)


class Attention(nn.Module):
  """q/k/v/o projections (+ biases) + q/k norms + RoPE + cache write + attention, for layer `layer` (its
  window and RoPE: cfg.layer_window / cfg.layer_rope) and that layer's own cache buffers [B, K, S, D]
  (written in place, read where they lie: no slice or copy of the cache). Three stages, so fixed-shape
  numerics (model.py) can run the token-wise ones over fixed tiles of tokens: `qkv` (token-wise),
  `attend_cache` (cache write + attention, per row), `out` (token-wise); model.Block composes them."""
  cfg: ModelConfig
  impl: str = "xla"
  layer: int = 0

  def setup(self):
    cfg, dt = self.cfg, self.cfg.jnp_dtype
    init, zeros = nn.initializers.normal(0.02), nn.initializers.zeros
    dm, h, kh, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.wq = weight_param(self, "q", init, (dm, h, d), dt)
    self.wk = weight_param(self, "k", init, (dm, kh, d), dt)
    self.wv = weight_param(self, "v", init, (dm, kh, d), dt)
    self.wo = weight_param(self, "o", init, (h, d, dm), dt)
    if cfg.qkv_bias:
      self.bq, self.bk = self.param("q_bias", zeros, (h * d,), dt), self.param("k_bias", zeros, (kh * d,), dt)
      self.bv = self.param("v_bias", zeros, (kh * d,), dt)
    if cfg.qk_norm:                                                          # per head, before RoPE
      self.q_norm = RMSNorm(cfg.rms_norm_eps, dt, cfg.norm_plus_one, cfg.invariant)
      self.k_norm = RMSNorm(cfg.rms_norm_eps, dt, cfg.norm_plus_one, cfg.invariant)
    if cfg.o_bias:
      self.bo = self.param("o_bias", zeros, (dm,), dt)

  def qkv(self, x, rot, alt_rot=None):
    """x [B, T, Dm] -> q [B, T, H, D] rotated by rot = (cos, sin) [B, T, D/2] (rope.rotation at the tokens'
    positions, for this layer's frequencies), q rotated by alt_rot (or None), k, v [B, T, K, D]."""
    cfg = self.cfg
    bq, bk, bv = (self.bq, self.bk, self.bv) if cfg.qkv_bias else (None, None, None)
    q_raw, k = project(x, self.wq, bq), project(x, self.wk, bk)
    if cfg.qk_norm:
      q_raw, k = self.q_norm(q_raw), self.k_norm(k)
    q = rotate(q_raw, *rot, fixed=cfg.invariant)
    q_alt = None if alt_rot is None else rotate(q_raw, *alt_rot, fixed=cfg.invariant)
    return q, q_alt, rotate(k, *rot, fixed=cfg.invariant), project(x, self.wv, bv)

  def attend_cache(self, q, q_alt, k, v, positions, cache_k, cache_v, write_slots, spec, return_scores=False):
    """The new tokens' k/v written at write_slots, then q attending to the cache under `spec` ->
    (out [B, T, H, D], cache_k, cache_v, scores or None)."""
    cfg = self.cfg
    if write_slots is not None:
      cache_k = write_rows(cache_k, write_slots, k)
      cache_v = write_rows(cache_v, write_slots, v)
    window = cfg.layer_window(self.layer)
    scale = None if cfg.query_pre_attn_scalar is None else cfg.attn_scale
    if isinstance(spec, CausalChunk) and cfg.invariant:
      return chunk_attention(q, cache_k, cache_v, spec.start, scale=q.shape[-1] ** -0.5 if scale is None else scale,
                             softcap=cfg.attn_softcap, window=window, fixed=cfg.fixed,
                             ring=spec.ring), cache_k, cache_v, None
    if isinstance(spec, CausalChunk):
      return causal_chunk_attention(q, k, v, cache_k, cache_v, spec.start, scale=scale,
                                    softcap=cfg.attn_softcap, window=window), cache_k, cache_v, None
    res = attend(q, cache_k, cache_v, spec, self.impl, return_scores, q_alt, q_pos=positions, window=window,
                 scale=scale, softcap=cfg.attn_softcap, fixed=cfg.fixed)
    out, scores = res if return_scores else (res, None)
    return out, cache_k, cache_v, scores

  def out(self, o):
    """The attention output [B, T, H, D] -> [B, T, Dm] through the o projection (+ bias)."""
    b, t, h, d = o.shape
    # [B, T, N*H] x [N*H, Dm]: both reshapes are free, and XLA then never transposes the weight (with a
    # "BTNH,NHD" contraction XLA:CPU copied every layer's o weight into [H, N, Dm] order each step)
    y = dense("BTF,FD->BTD", o.reshape(b, t, h * d), self.wo.reshape(h * d, -1))
    return (y + self.bo).astype(y.dtype) if self.cfg.o_bias else y


def project(x: jax.Array, w: jax.Array, bias: jax.Array | None = None) -> jax.Array:
  """x [B, T, Dm] @ w [Dm, N, H] (+ bias [N * H]) -> [B, T, N, H] as one 2-D matmul over the weight as it lies."""
  dm, n, hd = w.shape
  y = dense("BTD,DF->BTF", x, w.reshape(dm, n * hd))
  y = y if bias is None else (y + bias).astype(y.dtype)
  return y.reshape(*x.shape[:2], n, hd)


def write_rows(buf: jax.Array, slots: jax.Array, values: jax.Array) -> jax.Array:
  """One layer's cache buf [B, K, S, D] with values [B, M, K, D] written in place at per-row slots [B, M];
  out-of-range slots are dropped (how callers say "do not write")."""
  rows = jnp.arange(buf.shape[0])[:, None]
  if slots.shape == (1, 1):
    # One row, one token (batch-1 decoding): XLA rewrites a one-index scatter into a dynamic-update-slice,
    # then fuses a second, out-of-place copy of that update into the attention's operand, which costs
    # copies of the whole layer every step (batch-1 AR at 8K context: 5x the time of a 3-token verify).
    # Writing the same value twice at the same slot keeps it a scatter, updated in place.
    slots, values = jnp.concatenate([slots, slots], 1), jnp.concatenate([values, values], 1)
  return buf.at[rows, :, slots].set(values.astype(buf.dtype), mode="drop")
