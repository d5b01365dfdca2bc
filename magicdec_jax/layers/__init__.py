"""Building blocks of a LLaMA decoder layer, each a small pure module."""
from magicdec_jax.layers.norm import RMSNorm, rms_norm
from magicdec_jax.layers.rope import apply_rope, rope_frequencies
from magicdec_jax.layers.attention import Attention, masked_attention
from magicdec_jax.layers.mlp import SwiGLU
