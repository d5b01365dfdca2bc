"""Fixed-shape numerics: a (row, position)'s numbers never depend on what else is computed with it.

Contract: with `ModelConfig.numerics == "invariant"` a position's logits are the same bits in a plain step,
in a chain's or a tree's verify pass, in any batch and at any cache slot count that is a multiple of
`FixedShapes.cache_multiple`, whatever the chunks its prompt was prefilled in, so speculative decoding emits
plain decoding's tokens. Why it needs care: a backend picks its algorithms from
the operands' shapes, and two algorithms round differently (docs/how-it-works.md#fixed-shape-numerics-bitwise-plain-decoding).
The shapes (`backend.FixedShapes`, in `cfg.fixed`) are the backend's measured algorithm classes:

  * token-wise stages run through `tile_map`: calls whose row counts lie in one class;
  * attention (`tiled_attention`) reads, for each query position p, a prefix of whole key blocks as one dot
    over every slot (masked slots add exact zeros: slot count invariant), then a tail of `tail_blocks`
    blocks in canonical slot order, a tree node's ancestors gathered where plain decoding has them;
  * a prefill chunk's attention (`chunk_attention`) goes in tiles of fixed query and key counts aligned to
    positions, so a prompt's K/V do not depend on the chunk it was prefilled in.

The guarantee is between runs of one build on one machine: another build may pick other algorithms.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.backend import FixedShapes
from magicdec_jax.layers.prefill_attention import NEG_BIG, softcapped
from magicdec_jax.pallas.xla_attention import dot_operands, fold_queries, unfold_queries


def unknown_one(x: jax.Array) -> jax.Array:
  """1.0 (float32, shape []) computed from x's first element, so that no compiler folds it (x finite)."""
  return x.reshape(-1)[0].astype(jnp.float32) * 0 + 1


def rounded(product: jax.Array, one: jax.Array) -> jax.Array:
  """product x one (unknown_one): the product rounded on its own whatever follows. A compiler may fuse a
  product into the addition it feeds (a fused multiply-add, rounding once), and whether it does depends on
  the program around it; a product multiplied by 1.0 feeds the addition exactly in either case."""
  return product * one


def key_block(num_slots: int, fixed: FixedShapes) -> int:
  """The largest power of two <= fixed.key_block dividing num_slots: fixed.key_block for the target caches
  the engine sizes (whole blocks); a target's ring layer (a windowed layer) keeps one size in every run."""
  blk = fixed.key_block
  while num_slots % blk:
    blk //= 2
  return blk


def tile_map(fn, rows: tuple[int, int], *xs):
  """fn over the tokens of xs (arrays [B, T, ...] or None) in calls whose token counts lie in rows = (lo, hi):
  m tokens make m // hi calls of hi tokens, then one of the rest padded to at least lo. Each call is given to
  fn as [n, 1, ...]; fn's outputs (a pytree of [n, 1, ...] arrays) come back as [B, T, ...]. Each call is
  fenced by optimization barriers, so XLA fuses nothing across it and compiles its body as it would alone;
  the calls of hi tokens are one loop over equal tiles (one body, so compile time does not grow with the
  batch), the rest one call after them."""
  b, t = next(x for x in xs if x is not None).shape[:2]
  m = b * t
  flat = tuple(None if x is None else x.reshape(m, 1, *x.shape[2:]) for x in xs)

  def body(args):
    return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

  def pad(x, n):
    return jnp.pad(x, ((0, n - x.shape[0]),) + ((0, 0),) * (x.ndim - 1))

  def tiles_of(n):                  # the first n tokens (a multiple of hi) as [n / hi, hi, 1, ...]
    return tuple(None if x is None else x[:n].reshape(n // hi, hi, *x.shape[1:]) for x in flat)

  lo, hi = rows
  if lo == hi:
    tiles = -(-m // hi)
    out = jax.lax.map(body, tuple(None if x is None else pad(x, tiles * hi).reshape(tiles, hi, *x.shape[1:])
                                  for x in flat))
    return jax.tree.map(lambda y: y.reshape(tiles * hi, *y.shape[3:])[:m].reshape(b, t, *y.shape[3:]), out)
  full = m // hi * hi
  parts, prev = [], ()
  if full > hi:         # full tiles: one loop body however many (compile time does not grow with the batch)
    prev = jax.lax.map(body, tiles_of(full))
    parts.append(jax.tree.map(lambda y: y.reshape(full, *y.shape[2:]), prev))
  elif full:
    prev = body(tuple(None if x is None else x[:full] for x in flat))
    parts.append(prev)
  rest = m - full
  if rest:
    # its inputs pass one barrier with the tiles' outputs: the calls then run in order, and XLA cannot merge
    # their dots (which share the weights) into one of another row count
    args, _ = jax.lax.optimization_barrier((tuple(None if x is None else pad(x[full:], max(rest, lo))
                                                  for x in flat), prev))
    parts.append(jax.tree.map(lambda y: y[:rest], body(args)))
  out = parts[0] if len(parts) == 1 else jax.tree.map(lambda *ys: jnp.concatenate(ys, 0), *parts)
  return jax.tree.map(lambda y: y.reshape(b, t, *y.shape[2:]), out)


def tree_sources(anc: jax.Array) -> jax.Array:
  """anc [T, T] bool (anc[t, j]: node j is t or an ancestor of t; nodes in BFS order) -> [T, T] int32: the
  node at depth d on node t's path, or -1 past t's depth. A node at depth d of a tree is computed, in plain
  decoding, at the slot base + d: its ancestors' canonical slots."""
  anc = anc.astype(bool)
  depth = anc.sum(-1).astype(jnp.int32) - 1                                     # [T]
  at = anc[:, :, None] & (depth[None, :, None] == jnp.arange(anc.shape[0])[None, None, :])   # [t, j, d]
  return jnp.where(at.any(1), jnp.argmax(at, axis=1), -1).astype(jnp.int32)


def pairwise_sum(x: jax.Array) -> jax.Array:
  """x [..., n] summed over its last axis as a fixed binary tree of elementwise adds over n padded with zeros
  to a power of two: the same bits whatever the shape around it (a backend's own reduction vectorises by
  shape), and whatever the zeros past the last nonzero entry (padding to 2n adds exact zeros first)."""
  n = 1 << max(0, int(x.shape[-1] - 1).bit_length())
  x = jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, n - x.shape[-1]),))
  while x.shape[-1] > 1:
    half = x.shape[-1] // 2
    x = x[..., :half] + x[..., half:]
  return x[..., 0]


def max_depth(anc) -> int:
  """The deepest node of the ancestor mask anc [T, T] (T - 1 when the mask is traced, not a constant)."""
  try:
    return int(np.asarray(anc).astype(bool).sum(-1).max()) - 1
  except jax.errors.TracerArrayConversionError:
    return anc.shape[0] - 1


def tiled_attention(qf: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, tokens: int, scale: float,
                    softcap: float | None, precision, fixed: FixedShapes,
                    tree: tuple[jax.Array, jax.Array] | None = None, window: int | None = None,
                    ring: bool = False) -> jax.Array:
  """Folded queries qf [B, K, T*G, D] of `tokens` = T query tokens, one layer's k/v [B, K, S, D] (already in
  the dot's dtype) and the visibility mask [B, T*G, S] -> [B, K, T*G, D] float32, in tiles of
  fixed.query_tokens tokens (several: one loop over one tile body, each tile reading the whole cache).

  With tree = (base [B], anc [T, T]) (a PrefixTree rule: slots < base the prefix, the T new tokens at
  base + j), a query at position p sums its values in two parts that depend on p alone: the prefix
  [0, s) with s = p - W rounded down to whole key blocks (W = (tail_blocks - 1) blocks) as one dot over
  the cache, whose zeros past s add nothing; and the tail, tail_blocks blocks from s on, with the query
  token's ancestors gathered to their canonical slots base + depth (tree_sources), as one dot over those
  slots. A tree node's output is then bitwise the one-token step's at its position (chains and plain
  steps take the same path), whatever the slot count or the batch. A sliding `window` (already in the
  mask) hides tail slots out of it too. With `ring`, k/v are a ring layer's S slots holding virtual slot c
  at c % S (cache.py: the ring keeps a round's nodes beyond the window): the prefix is every slot outside
  the tail's blocks and the round's node slots, the tail is gathered from the ring. Without `tree` (a
  draft's ring): value sums over key blocks added in slot order."""
  b, kh, tg, d = qf.shape
  s = k.shape[2]
  g = tg // tokens
  tiles = -(-tokens // fixed.query_tokens)
  q0 = fixed.query_tokens * g
  if tiles == 1 and not fixed.pad_query_tile:   # one short tile left unpadded (FixedShapes.query_rows)
    q0 = fixed.query_rows(tokens, g, d)
  tt = q0 // g                                  # query tokens per tile (padding included)
  pad = tiles * q0 - tg
  qf = jnp.pad(qf, ((0, 0), (0, 0), (0, pad), (0, 0)))
  mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
  blk = key_block(s, fixed)
  nb = s // blk
  slot_ids = jnp.arange(s, dtype=jnp.int32)
  if tree is not None:
    # sums of probabilities as dots too (a backend's own reduction vectorises by shape; a dot against two
    # columns of ones, computed so that XLA cannot fold them into a reduction, sums in one fixed order)
    ones = jnp.broadcast_to(unknown_one(qf), (b, kh, s, 2)).astype(v.dtype)
    base = tree[0].astype(jnp.int32)
    anc = jnp.pad(tree[1].astype(bool), ((0, tiles * tt - tokens), (0, 0)))  # padded tokens see nothing new
    src = jnp.pad(tree_sources(tree[1]), ((0, tiles * tt - tokens), (0, 0)), constant_values=-1)
    depth = jnp.maximum(anc.sum(-1).astype(jnp.int32) - 1, 0)                # [T'] each token's depth
    width = fixed.tail_blocks * blk
    lookback = (fixed.tail_blocks - 1) * blk
    deepest = max_depth(tree[1])
    if deepest > lookback:
      raise ValueError(f"a round of depth {deepest} exceeds fixed-shape attention's tail of {lookback} slots "
                       f"(FixedShapes.tail_blocks={fixed.tail_blocks}, key_block={blk})")

  one = unknown_one(qf)

  def scores(qt, mt):
    """The [B, K, q0, S] logits with invisible slots at NEG_BIG, and their max (exact in any order)."""
    logits = softcapped(rounded(jnp.einsum("BKQD,BKSD->BKQS", qt, k, preferred_element_type=jnp.float32,
                                           precision=precision) * scale, one), softcap)
    logits = jnp.where(mt[:, None], logits, NEG_BIG)
    return logits, logits.max(-1, keepdims=True)

  def value_dot(p, vals, eq):
    return jnp.einsum(eq, p.astype(v.dtype), vals, preferred_element_type=jnp.float32, precision=precision)

  def block_tile(args):
    qt, mt = args                                                              # [B, K, q0, D], [B, q0, S]
    logits, top = scores(qt, mt)
    p = jnp.where(mt[:, None], jnp.exp(logits - top), 0.0).reshape(b, kh, q0, nb, blk)
    part_o = value_dot(p, v.reshape(b, kh, nb, blk, d), "BKQnS,BKnSD->BKnQD")   # [B, K, nb, q0, D]
    part_l = pairwise_sum(p)                                                   # [B, K, q0, nb]
    o, l = jax.lax.fori_loop(1, nb, lambda i, ol: (ol[0] + part_o[:, :, i], ol[1] + part_l[..., i]),
                             (part_o[:, :, 0], part_l[..., 0]))                # in slot order, one by one
    return o / l[..., None]

  def tree_tile(args):
    qt, mt, at, st, dt = args                # [B, K, q0, D], [B, q0, S], [tt, T], [tt, T], [tt]
    logits, top = scores(qt, mt)
    pos = base[:, None] + dt[None, :]                                          # [B, tt] query positions
    cut = jnp.maximum((pos - lookback) // blk * blk, 0)                        # [B, tt] where the tail starts
    if ring:     # the prefix: slots holding a virtual slot below cut (outside the tail, not the round's)
      node_slot = jnp.mod(slot_ids[None, :] - base[:, None], s) < tokens       # [B, S]
      in_tail = jnp.mod(slot_ids[None, None, :] - cut[:, :, None], s) < width  # [B, tt, S]
      prefix = jnp.repeat(~node_slot[:, None, :] & ~in_tail, g, axis=1) & mt    # [B, q0, S]
    else:
      prefix = slot_ids[None, None, :] < jnp.repeat(cut, g, axis=1)[:, :, None]
    p = jnp.where(prefix[:, None], jnp.exp(logits - top), 0.0)
    o = value_dot(p, v, "BKQS,BKSD->BKQD")                                     # the prefix: one dot
    l = value_dot(p, ones, "BKQS,BKSE->BKQE")[..., 0]
    c = cut[:, :, None] + jnp.arange(width, dtype=jnp.int32)[None, None, :]    # [B, tt, C] canonical slots
    rel = c - base[:, None, None]
    node = jnp.take_along_axis(jnp.broadcast_to(st[None], (b,) + st.shape), jnp.clip(rel, 0, tokens - 1), axis=2)
    live = jnp.where(rel < 0, True, (rel <= dt[None, :, None]) & (node >= 0))
    live = live & (c > pos[:, :, None] - window) if window is not None else live
    slot = jnp.where(rel < 0, c, base[:, None, None] + node)                   # virtual: a ring holds c at c % S
    live = live if ring else live & (c < s)
    slot = jnp.where(live, jnp.mod(slot, s) if ring else slot, 0)              # [B, tt, C]
    rows = jnp.repeat(slot, g, axis=1)                                         # [B, q0, C]
    lt = jnp.take_along_axis(logits, jnp.broadcast_to(rows[:, None], (b, kh, q0, width)), axis=3)
    pt = jnp.where(jnp.repeat(live, g, axis=1)[:, None], jnp.exp(lt - top), 0.0)  # [B, K, q0, C]
    vt = jnp.take_along_axis(v[:, :, None], slot[:, None, :, :, None], axis=3)  # [B, K, tt, C, D]
    ot = value_dot(pt.reshape(b, kh, tt, g, width), vt, "BKTGC,BKTCD->BKTGD").reshape(b, kh, q0, d)
    lt_sum = value_dot(pt.reshape(b, kh, tt, g, width), ones[:, :, None, :width], "BKTGC,BKTCE->BKTGE")
    return (o + ot) / (l + lt_sum.reshape(b, kh, q0, -1)[..., 0])[..., None]

  # tiles stacked first: [tiles, B, K, q0, D] and [tiles, B, q0, S]; several are one loop over one body
  qs = jnp.moveaxis(qf.reshape(b, kh, tiles, q0, d), 2, 0)
  ms = jnp.moveaxis(mask.reshape(b, tiles, q0, s), 1, 0)
  args, tile = ((qs, ms), block_tile) if tree is None else \
      ((qs, ms, *(x.reshape(tiles, tt, *x.shape[1:]) for x in (anc, src, depth))), tree_tile)
  out = tile(tuple(x[0] for x in args))[None] if tiles == 1 else jax.lax.map(tile, args)
  return jnp.moveaxis(out, 0, 2).reshape(b, kh, tiles * q0, d)[:, :, :tg]


def chunk_attention(q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, start: jax.Array, *, scale: float,
                    softcap: float | None, window: int | None, fixed: FixedShapes, ring: int = 0) -> jax.Array:
  """A prefill chunk's attention with fixed-shape numerics: q [B, T, H, D] at positions start .. start+T-1
  (start a multiple of T, the same for every row), one layer's cache [B, K, S, D] already holding the chunk's
  K/V and every position below it -> out [B, T, H, D] (float32 math, output in q.dtype).

  A query's output depends on its position and the cache alone, not on T or the batch: queries go in tiles of
  tq tokens x the G heads of a KV group (fixed.prefill_tile = (tq, C); tile j holds positions [j tq, j tq +
  tq), a chunk not covering whole tiles padded inside them), and a tile reads keys in blocks of C positions
  [i C, i C + C), from block 0 (with a window w: the block of its first query's first visible position) to
  the block of its last query, merged by online softmax in that order. A block a query cannot see (past its
  causal limit, or before its window) leaves its accumulators exactly as they were (m unchanged, p = 0,
  a = 1; before any visible block: o = l = 0), so the tile's range does not change a query's bits. Blocks
  are gathered by position: slot p of a linear layer (positions past S clipped: never visible), slot p % ring
  of a ring layer of `ring` slots (it holds every position a query sees: cache.ring_margin). Rows go one at a
  time on one device (`lax.map`), vectorised under a mesh (a dot's batch dimension does not change a row)."""
  b, t, h, d = q.shape
  kh, s = cache_k.shape[1], cache_k.shape[2]
  g = h // kh
  tq, blk = fixed.prefill_tile
  q0 = tq * g
  out_dtype = q.dtype
  q, = dot_operands(q)
  precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
  # the tiles covering the chunk: its first position sits at offset start % tq of the first one
  spare = 0 if t % tq == 0 else tq - math.gcd(t, tq)
  tiles = -(-(t + spare) // tq)
  offset = jnp.int32(0) if spare == 0 else jnp.asarray(start, jnp.int32) % tq
  qf = jax.lax.dynamic_update_slice(jnp.zeros((b, kh, tiles * q0, d), q.dtype), fold_queries(q, kh),
                                    (0, 0, offset * g, 0))
  first_pos = jnp.asarray(start, jnp.int32) - offset
  one = unknown_one(qf)
  q_tok = jnp.repeat(jnp.arange(tq, dtype=jnp.int32), g)                        # each tile row's token
  k_off = jnp.arange(blk, dtype=jnp.int32)

  def value_dot(p, vals):
    return jnp.einsum("BKQS,BKSD->BKQD", p.astype(vals.dtype), vals, preferred_element_type=jnp.float32,
                      precision=precision)

  def attend_rows(qr, row):
    """Rows row .. row + R - 1 of the cache, their folded queries qr [R, K, tiles * q0, D]."""
    r = qr.shape[0]

    def read(buf, i):                                # block i's positions, gathered from their slots
      pos = i * blk + k_off
      slots = pos % ring if ring else jnp.minimum(pos, s - 1)
      rows = jax.lax.dynamic_slice_in_dim(buf, row, r, axis=0)
      return dot_operands(jnp.take(rows, slots, axis=2))[0]                     # [R, K, C, D]

    def tile(j, out):
      p0 = first_pos + j * tq
      qt = jax.lax.dynamic_slice_in_dim(qr, j * q0, q0, axis=2)                 # [R, K, q0, D]
      q_pos = p0 + q_tok                                                        # [q0]

      def block(i, carry):
        o, m, l = carry
        k_pos = i * blk + k_off
        seen = k_pos[None, :] <= q_pos[:, None]
        if window is not None:
          seen = seen & (k_pos[None, :] > q_pos[:, None] - window)
        logits = softcapped(rounded(jnp.einsum("BKQD,BKSD->BKQS", qt, read(cache_k, i).astype(qt.dtype),
                                               preferred_element_type=jnp.float32, precision=precision) * scale,
                                    one), softcap)
        logits = jnp.where(seen, logits, NEG_BIG)
        m_new = jnp.maximum(m, logits.max(-1, keepdims=True))
        p = jnp.where(seen, jnp.exp(logits - m_new), 0.0)
        a = jnp.exp(m - m_new)
        return (rounded(o * a, one) + value_dot(p, read(cache_v, i)), m_new,
                rounded(l * a, one) + p.sum(-1, keepdims=True))

      lo = 0 if window is None else jnp.maximum(p0 - window + 1, 0) // blk
      init = (jnp.zeros((r, kh, q0, d), jnp.float32), jnp.full((r, kh, q0, 1), NEG_BIG, jnp.float32),
              jnp.zeros((r, kh, q0, 1), jnp.float32))
      o, _, l = jax.lax.fori_loop(lo, (p0 + tq - 1) // blk + 1, block, init)
      return jax.lax.dynamic_update_slice_in_dim(out, o / l, j * q0, axis=2)

    # the tile count passes through `start` (>= 0, unknown to the compiler), so even one tile is a loop
    # whose body compiles alone: the same code whatever the chunk
    count = jnp.where(jnp.asarray(start) >= 0, tiles, tiles + 1)
    return jax.lax.fori_loop(0, count, tile, jnp.zeros((r, kh, tiles * q0, d), jnp.float32))

  if b > 1 and jax.sharding.get_abstract_mesh().size <= 1:     # one device (no mesh, or 1 x 1): row by row
    o = jax.lax.map(lambda xs: attend_rows(xs[1][None], xs[0])[0], (jnp.arange(b, dtype=jnp.int32), qf))
  else:
    o = attend_rows(qf, jnp.int32(0))
  o = jax.lax.dynamic_slice_in_dim(o, offset * g, t * g, axis=2)
  return unfold_queries(o, t).astype(out_dtype)
