"""Building blocks of a decoder layer, each a small pure module."""
from magicdec_jax.layers.norm import RMSNorm, rms_norm
from magicdec_jax.layers.rope import apply_rope, rope_frequencies
from magicdec_jax.layers.attention import Attention, masked_attention
from magicdec_jax.layers.mlp import GatedMLP

__all__ = ["RMSNorm", "rms_norm", "apply_rope", "rope_frequencies", "Attention", "masked_attention", "GatedMLP"]
