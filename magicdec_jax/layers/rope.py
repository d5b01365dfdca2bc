"""Rotary position embeddings (rotate-half convention), with llama3 and linear frequency scaling."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.invariant import rounded, unknown_one


def rope_frequencies(cfg: ModelConfig, layer: int = 0) -> np.ndarray:
  """Inverse frequencies [D/2] of layer `layer` (its base and scaling: cfg.layer_rope) in float64 numpy (a
  compile-time constant)."""
  d = cfg.head_dim
  theta, s = cfg.layer_rope(layer)
  inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
  if s is None:
    return inv
  if s.kind == "linear":
    return inv / s.factor
  # llama3: keep short wavelengths, divide long ones by `factor`, blend smoothly in between.
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  blended = (1 - smooth) * inv / s.factor + smooth * inv
  out = np.where(wavelen > low_wavelen, inv / s.factor, inv)
  mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
  return np.where(mid, blended, out)


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
  """cos and sin [B, T, D/2] of position * inv_freq for positions [B, T] < max_position, from rope_tables by
  the angle-sum identity: table reads and products only, so a position's rotation is the same bits in any
  program (a backend's cos and sin may vectorise differently by the shapes and fusions around them)."""
  ch, sh, cl, sl = (jnp.asarray(t) for t in rope_tables(inv_freq, max_position))
  hi = jnp.clip(positions >> LOW_BITS, 0, ch.shape[0] - 1)
  lo = positions & ((1 << LOW_BITS) - 1)
  c1, s1, c2, s2 = jnp.take(ch, hi, axis=0), jnp.take(sh, hi, axis=0), jnp.take(cl, lo, axis=0), jnp.take(sl, lo, axis=0)
  one = unknown_one(c1)
  return rounded(c1 * c2, one) - rounded(s1 * s2, one), rounded(s1 * c2, one) + rounded(c1 * s2, one)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray, max_position: int | None = None) -> jax.Array:
  """x [B, T, N, D], positions [B, T] (int) -> x rotated by angle position * inv_freq, in x.dtype.
  max_position: the rotation read from tables of positions below it (tabled_rotation; fixed-shape
  numerics), else cos / sin of float32 angles."""
  if max_position is None:
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # [B, T, D/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
  else:
    cos, sin = tabled_rotation(positions.astype(jnp.int32), inv_freq, max_position)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  if max_position is None:
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  else:
    one = unknown_one(x32)
    out = jnp.concatenate([rounded(x1 * cos, one) - rounded(x2 * sin, one),
                           rounded(x2 * cos, one) + rounded(x1 * sin, one)], axis=-1)
  return out.astype(x.dtype)
