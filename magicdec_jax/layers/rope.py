"""Rotary position embeddings (rotate-half convention), with llama3 and linear frequency scaling.

Frequencies and angles are float32, rounded as transformers rounds them (so as the checkpoints were trained):
at position p an angle is off the exact one by up to p x 2**-24 radians, and matching that keeps long-context
logits on transformers' (docs/decisions.md#rope-in-float32)."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.invariant import rounded, unknown_one


def rope_frequencies(cfg: ModelConfig, layer: int = 0) -> np.ndarray:
  """Inverse frequencies [D/2] of layer `layer` (its base and scaling: cfg.layer_rope), float32 numpy (a
  compile-time constant), computed as transformers computes them: float32 arithmetic, which is what the
  checkpoints were trained and are served with (the exact values differ in the last bit of a third of them,
  and a position's angle by position x that). Its float32 pow rounded once: torch's vectorised pow is off
  by an ulp in a few entries (docs/decisions.md#rope-in-float32)."""
  f32 = np.float32
  d = cfg.head_dim
  theta, s = cfg.layer_rope(layer)
  exponents = np.arange(0, d, 2, dtype=f32) / f32(d)
  inv = f32(1) / (np.float64(f32(theta)) ** exponents.astype(np.float64)).astype(f32)   # a float32 pow, rounded once
  if s is None:
    return inv
  if s.kind == "linear":
    return inv / f32(s.factor)
  # llama3: keep short wavelengths, divide long ones by `factor`, blend smoothly in between. (A number over
  # an array is torch's number x the array's reciprocals.)
  old = s.original_max_position_embeddings
  wavelen = f32(2 * math.pi) * (f32(1) / inv)
  scaled = np.where(wavelen > f32(old / s.low_freq_factor), inv / f32(s.factor), inv)
  smooth = (f32(old) * (f32(1) / wavelen) - f32(s.low_freq_factor)) / f32(s.high_freq_factor - s.low_freq_factor)
  blended = (f32(1) - smooth) * scaled / f32(s.factor) + smooth * scaled
  mid = ~(wavelen < f32(old / s.high_freq_factor)) & ~(wavelen > f32(old / s.low_freq_factor))
  return np.where(mid, blended, scaled).astype(f32)


LOW_BITS = 8   # tabled RoPE: a position is (high << LOW_BITS) + low, each part's rotation read from a table


def rope_tables(inv_freq: np.ndarray, max_position: int) -> tuple[np.ndarray, ...]:
  """(cos, sin) of the high and the low part of every position below max_position ([H, D/2] and
  [2**LOW_BITS, D/2] float32, computed in float64): compile-time constants of a few KB."""
  high = np.arange(-(-max(int(max_position), 1) // (1 << LOW_BITS)), dtype=np.float64)[:, None] * (1 << LOW_BITS)
  low = np.arange(1 << LOW_BITS, dtype=np.float64)[:, None]
  out = []
  for part in (high, low):
    angle = part * np.asarray(inv_freq, np.float64)[None, :]
    out += [np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)]
  return tuple(out)


def tabled_rotation(positions: jax.Array, inv_freq: np.ndarray, max_position: int) -> tuple[jax.Array, jax.Array]:
  """cos and sin [B, T, D/2] of the float32 angle position * inv_freq (rounded as `rotation`'s fast form and
  transformers round it) for positions [B, T] < max_position: the exact product's rotation from rope_tables
  by the angle-sum identity, turned back by the float32 product's rounding error e (exact: angle_error; its
  cos and sin as series, |e| being half an ulp of the angle). Table reads, products and sums only, so a
  position's rotation is the same bits in any program (a backend's cos and sin may vectorise differently by
  the shapes and fusions around them)."""
  if max_position > 1 << 24:
    raise ValueError(f"fixed-shape numerics' RoPE holds positions below 2**24 (float32 counts them exactly), "
                     f"not max_position_embeddings={max_position}")
  ch, sh, cl, sl = (jnp.asarray(t) for t in rope_tables(inv_freq, max_position))
  hi = jnp.clip(positions >> LOW_BITS, 0, ch.shape[0] - 1)
  lo = positions & ((1 << LOW_BITS) - 1)
  c1, s1, c2, s2 = jnp.take(ch, hi, axis=0), jnp.take(sh, hi, axis=0), jnp.take(cl, lo, axis=0), jnp.take(sl, lo, axis=0)
  one = unknown_one(c1)
  cos, sin = rounded(c1 * c2, one) - rounded(s1 * s2, one), rounded(s1 * c2, one) + rounded(c1 * s2, one)
  e = angle_error(positions, inv_freq, one)
  e2 = rounded(e * e, one)

  def series(coefs):                # c0 + e2 (c1 + e2 (c2 + ...)), each step rounded on its own
    acc = jnp.float32(coefs[-1])
    for c in coefs[-2::-1]:
      acc = c + rounded(e2 * acc, one)
    return acc

  cos_e = series((1.0, -1 / 2, 1 / 24, -1 / 720))                   # |e| <= 1/2: within ~1e-7 of cos e
  sin_e = rounded(e * series((1.0, -1 / 6, 1 / 120, -1 / 5040)), one)
  return (rounded(cos * cos_e, one) + rounded(sin * sin_e, one),                    # angle - e
          rounded(sin * cos_e, one) - rounded(cos * sin_e, one))


def angle_error(positions: jax.Array, inv_freq: np.ndarray, one: jax.Array) -> jax.Array:
  """[B, T, D/2] float32: position * inv_freq minus its float32 rounding, exactly (Dekker's product: both
  factors split into halves of at most 12 bits, whose products are exact in float32), for positions < 2**24."""
  f = np.asarray(inv_freq, np.float32)
  f_hi = (f.view(np.int32) & np.int32(~0xFFF)).view(np.float32)
  f_lo = f - f_hi
  p = positions[..., None]
  p_hi, p_lo = ((p >> 12) << 12).astype(jnp.float32), (p & 0xFFF).astype(jnp.float32)
  angle = rounded(p.astype(jnp.float32) * f, one)
  return (((p_hi * f_hi - angle) + p_hi * f_lo) + p_lo * f_hi) + p_lo * f_lo


def rotation(positions: jax.Array, inv_freq: np.ndarray, max_position: int | None = None
             ) -> tuple[jax.Array, jax.Array]:
  """positions [B, T] (int) -> (cos, sin) [B, T, D/2] float32 of the float32 angle position * inv_freq.
  max_position: read from tables of positions below it (tabled_rotation; fixed-shape numerics), else the
  backend's cos / sin. A forward pass computes it once for every layer that shares inv_freq."""
  if max_position is None:
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # [B, T, D/2]
    return jnp.cos(angles), jnp.sin(angles)
  return tabled_rotation(positions.astype(jnp.int32), inv_freq, max_position)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, fixed: bool = False) -> jax.Array:
  """x [B, T, N, D] rotated by `rotation`'s cos, sin [B, T, D/2], in x.dtype (fixed: each product rounded
  on its own, so a token's result is the same bits in any program)."""
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  if not fixed:
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  else:
    one = unknown_one(x32)
    out = jnp.concatenate([rounded(x1 * cos, one) - rounded(x2 * sin, one),
                           rounded(x2 * cos, one) + rounded(x1 * sin, one)], axis=-1)
  return out.astype(x.dtype)
