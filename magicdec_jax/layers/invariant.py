"""Fixed-shape numerics: a (row, position)'s numbers never depend on what else is computed with it.

A backend picks its matmul algorithm from the operands' shapes, and different algorithms sum in different
orders. Measured on XLA:CPU (jax 0.10, `[M, 576] x [576, 1536]`): M = 1, M = 2..32 and M >= 40 are three
algorithms, and a row's float32 result differs between them in its last bits; in bfloat16 those bits then
flip roundings. A verify pass computes a position with M = B x (gamma + 1) rows, plain decoding with
M = B: the logits differ by rounding, and a greedy argmax near a tie flips (issue 45: 3 of 4 rows differed
from plain decoding in bfloat16). So with `ModelConfig.numerics == "invariant"` every dot of the target
has one shape, whatever the batch, the round's query count, the slot count or the phase:

  * everything a layer computes token by token (norms, projections, RoPE, the MLP, the LM head) runs on
    tiles of exactly `rows` tokens (`row_tile`: decode and prefill have their own; tokens padded up to
    it, more tokens run as a loop over tiles: `tile_map`). Not only dots: XLA:CPU's elementwise code
    depends on the shape too (an RMS norm over 4 rows differed from the same rows among 8, and an exp
    over one row from the same row among 128, in float32);
  * decode attention sums the values over fixed blocks of `key_block` slots, the blocks' partial sums
    added one after another in slot order (`tiled_attention`). A block beyond a row's last visible slot
    adds exact zeros, so the slot count of the cache does not change a bit of the result. On an
    scores tiles of `QUERY_TOKENS` query tokens (x the G heads of a KV group; more tokens run as a loop
    of tiles, each reading the cache). On an accelerator every tile is padded to that size. On XLA:CPU a
    round of up to QUERY_TOKENS tokens is one unpadded tile (at least 2 rows): its attention dots give a
    row the same bits among 2 to 4G rows (measured; tests/test_invariant_numerics.py guards it), while
    padding cost plain decoding 1.44x its step at SmolLM2 8 x 4096 (docs/measurements.md#invariant-numerics). A
    16-node tree untiled (48 rows) did differ in one row of 8: rounds of more tokens are tiled;
  * a prefill always runs in chunks of one size (the engine pads prompts to it), so its rows' dots have
    one shape too.

Every other operation is elementwise or a reduction over one row of fixed length (norms, softmax max,
RoPE), which does not depend on the other rows. Shapes, not values, are fixed: the same executable
compiled twice, or on another machine, may pick other algorithms, so the guarantee is between runs of one
build on one machine (tests/test_invariant_numerics.py checks it against plain decoding).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from magicdec_jax.layers.prefill_attention import NEG_BIG, softcapped

DECODE_ROWS = {"cpu": 8}          # tokens per token-wise tile in a decode round (else DEFAULT_DECODE_ROWS)
DEFAULT_DECODE_ROWS = 128         # accelerators: a projection reads its weights once up to 128 rows (prediction)
PREFILL_ROWS = 256                # tokens per token-wise tile in a prefill chunk (one row's chunk)
QUERY_TOKENS = 4                  # query tokens per attention tile: plain decoding and chains up to gamma 3
PAD_QUERY_TILE = {"cpu": False}   # pad a single tile of fewer tokens up to QUERY_TOKENS (else True)
KEY_BLOCK = 64                    # slots per partial sum of the attention's value reduction
# DecodeSettings.numerics when none is given, by backend (else "fast"). On CPU fixed shapes cost little
# (SmolLM2 f32 8 x 4096: plain decoding 1.06x, MagicDec 1.19x). On one H100 (LLaMA-3.1-8B shape, bf16,
# 8 x 32K, 2026-11-26) they cost the AR loop 2.07x (214 against 444 tok/s: XLA's attention over the whole
# cache in 4-token tiles instead of the Pallas kernel) and its compile 197 s against 7 s
# (benchmarks/results/gpu_engine_h100_2026-11-26_run2_invariant.json), so a GPU asks for them explicitly.
DEFAULT_NUMERICS = {"cpu": "invariant"}


def default_numerics() -> str:
  """The numerics a DecodeSettings gets on the default backend when it names none (DEFAULT_NUMERICS)."""
  return DEFAULT_NUMERICS.get(jax.default_backend(), "fast")


def row_tile(prefill: bool) -> int:
  """Tokens per token-wise tile for a prefill chunk or a decode round on the default backend."""
  return PREFILL_ROWS if prefill else DECODE_ROWS.get(jax.default_backend(), DEFAULT_DECODE_ROWS)


def pad_query_tile() -> bool:
  """Whether a round of fewer than QUERY_TOKENS query tokens is padded up to a whole tile on this backend."""
  return PAD_QUERY_TILE.get(jax.default_backend(), True)


def key_block(num_slots: int) -> int:
  """The largest power of two <= KEY_BLOCK dividing num_slots: KEY_BLOCK for the target caches the engine
  sizes (whole blocks); a target's ring layer (a windowed layer) keeps one size in every run."""
  blk = KEY_BLOCK
  while num_slots % blk:
    blk //= 2
  return blk


def tile_map(fn, rows: int, *xs):
  """fn over the tokens of xs (arrays [B, T, ...] or None) in tiles of exactly `rows` tokens, each tile
  given to fn as [rows, 1, ...] -> fn's outputs (a pytree of [rows, 1, ...] arrays) as [B, T, ...]. The
  tokens are padded up to a multiple of `rows` and the tiles run as a loop whose body is fenced by
  optimization barriers, so XLA compiles fn once for that shape and fuses nothing across it."""
  b, t = next(x for x in xs if x is not None).shape[:2]
  m = b * t
  tiles = -(-m // rows)

  def split(x):
    x = x.reshape(m, *x.shape[2:])
    x = jnp.pad(x, ((0, tiles * rows - m),) + ((0, 0),) * (x.ndim - 1))
    return x.reshape(tiles, rows, 1, *x.shape[1:])

  def body(args):
    return jax.lax.optimization_barrier(fn(*jax.lax.optimization_barrier(args)))

  out = jax.lax.map(body, tuple(None if x is None else split(x) for x in xs))
  return jax.tree.map(lambda y: y.reshape(tiles * rows, *y.shape[3:])[:m].reshape(b, t, *y.shape[3:]), out)


def tiled_attention(qf: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, tokens: int, scale: float,
                    softcap: float | None, precision) -> jax.Array:
  """Folded queries qf [B, K, T*G, D] of `tokens` = T query tokens, one layer's k/v [B, K, S, D] (already in
  the dot's dtype) and the visibility mask [B, T*G, S] -> [B, K, T*G, D] float32, in tiles of QUERY_TOKENS
  tokens (see the module docstring; more run as a loop, each tile reading the whole cache) and KEY_BLOCK
  slot blocks."""
  b, kh, tg, d = qf.shape
  s = k.shape[2]
  g = tg // tokens
  tiles = -(-tokens // QUERY_TOKENS)
  q0 = QUERY_TOKENS * g
  if tiles == 1 and not pad_query_tile():     # one short tile left unpadded (at least 2 rows): see the docstring
    q0 = max(tg, 2)
  pad = tiles * q0 - tg
  qf = jnp.pad(qf, ((0, 0), (0, 0), (0, pad), (0, 0)))
  mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
  blk = key_block(s)
  nb = s // blk
  vb = v.reshape(b, kh, nb, blk, d)

  def tile(args):
    qt, mt = args                                                              # [B, K, q0, D], [B, q0, S]
    logits = softcapped(jnp.einsum("BKQD,BKSD->BKQS", qt, k, preferred_element_type=jnp.float32,
                                   precision=precision) * scale, softcap)
    seen = mt[:, None]
    logits = jnp.where(seen, logits, NEG_BIG)
    top = logits.max(-1, keepdims=True)                                        # a max is exact in any order
    p = jnp.where(seen, jnp.exp(logits - top), 0.0).reshape(b, kh, q0, nb, blk)
    part_l = p.sum(-1)                                                         # [B, K, q0, nb]
    part_o = jnp.einsum("BKQnS,BKnSD->BKnQD", p.astype(v.dtype), vb, preferred_element_type=jnp.float32,
                        precision=precision)                                  # [B, K, nb, q0, D]
    o, l = part_o[:, :, 0], part_l[..., 0]
    for i in range(1, nb):                                                     # in slot order, one by one
      o, l = o + part_o[:, :, i], l + part_l[..., i]
    return o / l[..., None]

  if tiles == 1:
    out = tile((qf, mask))
  else:
    qs = jnp.moveaxis(qf.reshape(b, kh, tiles, q0, d), 2, 0)
    ms = jnp.moveaxis(mask.reshape(b, tiles, q0, s), 1, 0)
    out = jnp.moveaxis(jax.lax.map(tile, (qs, ms)), 0, 2).reshape(b, kh, tiles * q0, d)
  return out[:, :, :tg]
