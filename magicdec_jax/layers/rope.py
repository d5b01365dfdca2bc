"""Rotary position embeddings (rotate-half convention), with llama3 and linear frequency scaling."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.config import ModelConfig


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


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
  """x [B, T, N, D], positions [B, T] (int) -> x rotated by angle position * inv_freq, in x.dtype."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)
