"""SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from magicdec_jax.layers.dense import dense


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
    h = jax.nn.silu(dense("BTD,DF->BTF", x, gate)) * dense("BTD,DF->BTF", x, up)
    return dense("BTF,FD->BTD", h, down)
