"""SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""
import flax.linen as nn
import jax
import jax.numpy as jnp


class SwiGLU(nn.Module):
  hidden: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):  # x [B, T, Dm]
    dm = x.shape[-1]
    init = nn.initializers.normal(0.02)
    gate = self.param("gate", init, (dm, self.hidden), self.dtype)
    up = self.param("up", init, (dm, self.hidden), self.dtype)
    down = self.param("down", init, (self.hidden, dm), self.dtype)
    prec = jax.lax.Precision.HIGHEST if jnp.dtype(self.dtype) == jnp.float32 else None  # no TF32
    h = (jax.nn.silu(jnp.einsum("BTD,DF->BTF", x, gate, precision=prec))
         * jnp.einsum("BTD,DF->BTF", x, up, precision=prec))
    return jnp.einsum("BTF,FD->BTD", h, down, precision=prec)
