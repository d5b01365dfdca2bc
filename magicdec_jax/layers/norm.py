"""RMSNorm, computed in float32 whatever the parameter dtype.

Two conventions: LLaMA's (normalize in float32, cast to the input dtype, then x the scale) and Gemma's
(`plus_one`: normalize and x (1 + scale) both in float32, then cast), each as HF computes it.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool = False) -> jax.Array:
  """x [..., Dm], scale [Dm] -> [..., Dm] in x.dtype."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  if plus_one:
    return (y * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
  return (y.astype(x.dtype) * scale).astype(x.dtype)


class RMSNorm(nn.Module):
  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32
  plus_one: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
    scale = self.param("scale", init, (x.shape[-1],), self.dtype)
    return rms_norm(x, scale, self.eps, self.plus_one)
