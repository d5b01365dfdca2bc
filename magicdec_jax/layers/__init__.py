"""Building blocks of a decoder layer, each a small pure module."""
from magicdec_jax.layers.norm import RMSNorm, rms_norm
from magicdec_jax.layers.rope import rope_frequencies, rotate, rotation
from magicdec_jax.layers.attention import Attention, masked_attention
from magicdec_jax.layers.mlp import GatedMLP

__all__ = ["RMSNorm", "rms_norm", "rope_frequencies", "rotation", "rotate", "Attention", "masked_attention", "GatedMLP"]
