"""The gated feed-forward: down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or tanh-approximated GELU (GeGLU)."""
import flax.linen as nn
import jax
import jax.numpy as jnp

from magicdec_jax.layers.dense import dense, weight_param

ACTIVATION_FNS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


class GatedMLP(nn.Module):
  hidden: int
  dtype: jnp.dtype = jnp.float32
  activation: str = "silu"

  @nn.compact
  def __call__(self, x):  # x [B, T, Dm]
    dm = x.shape[-1]
    init = nn.initializers.normal(0.02)
    gate = weight_param(self, "gate", init, (dm, self.hidden), self.dtype)
    up = weight_param(self, "up", init, (dm, self.hidden), self.dtype)
    down = weight_param(self, "down", init, (self.hidden, dm), self.dtype)
    h = ACTIVATION_FNS[self.activation](dense("BTD,DF->BTF", x, gate)) * dense("BTD,DF->BTF", x, up)
    return dense("BTF,FD->BTD", h, down)

