"""RMSNorm, computed in float32 whatever the parameter dtype.

Two conventions: LLaMA's (normalize in float32, cast to the input dtype, then x the scale) and Gemma's
(`plus_one`: normalize and x (1 + scale) both in float32, then cast), each as HF computes it.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from magicdec_jax.layers.invariant import pairwise_sum, rounded, unknown_one


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool = False,
             fixed_order: bool = False) -> jax.Array:
  """x [..., Dm], scale [Dm] -> [..., Dm] in x.dtype. `fixed_order` (fixed-shape numerics): the mean of
  squares summed as a fixed tree of rounded products, because a backend's own row reduction vectorises by
  the program around it (what it is fused with), so a row's norm would round by its context."""
  x32 = x.astype(jnp.float32)
  if fixed_order:
    ms = pairwise_sum(rounded(x32 * x32, unknown_one(x32)))[..., None] / x.shape[-1]
  else:
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(ms + eps)
  if plus_one:
    return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
  return (y.astype(x.dtype) * scale).astype(x.dtype)


class RMSNorm(nn.Module):
  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32
  plus_one: bool = False
  fixed_order: bool = False   # fixed-shape numerics: see rms_norm

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
    scale = self.param("scale", init, (x.shape[-1],), self.dtype)
    return rms_norm(x, scale, self.eps, self.plus_one, self.fixed_order)
