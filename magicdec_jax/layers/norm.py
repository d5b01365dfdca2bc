"""RMSNorm, computed in float32 whatever the parameter dtype (as HF LLaMA does)."""
import flax.linen as nn
import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """x [..., Dm], scale [Dm] -> [..., Dm] in x.dtype."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (y.astype(x.dtype) * scale).astype(x.dtype)


class RMSNorm(nn.Module):
  eps: float = 1e-5
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
    return rms_norm(x, scale, self.eps)
