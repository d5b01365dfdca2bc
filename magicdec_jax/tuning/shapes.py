"""Published shapes of the models MagicDec is evaluated with, as `ModelConfig`s (no weights).

Used by the cost model and by benchmarks that run randomly initialized models of real size. Values are from the
models' HF `config.json` files; dtype defaults to bfloat16 (what they ship in).
"""
from __future__ import annotations

from magicdec_jax.config import ModelConfig, RopeScaling

_LLAMA3_EOS = (128001, 128008, 128009)


def llama31_8b(dtype: str = "bfloat16") -> ModelConfig:
  """Meta-Llama-3.1-8B: 32 layers, d 4096, GQA 32/8, FFN 14336, vocab 128256, 128K context."""
  return ModelConfig(
      vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
      num_kv_heads=8, head_dim=128, rope_theta=500000.0,
      rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5, tie_embeddings=False,
      max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=_LLAMA3_EOS, dtype=dtype)


def llama32_1b(dtype: str = "bfloat16") -> ModelConfig:
  """Llama-3.2-1B: 16 layers, d 2048, GQA 32/8, head_dim 64, FFN 8192, vocab 128256, tied embeddings."""
  return ModelConfig(
      vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
      num_kv_heads=8, head_dim=64, rope_theta=500000.0,
      rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5, tie_embeddings=True,
      max_position_embeddings=131072, bos_token_id=128000, eos_token_ids=_LLAMA3_EOS, dtype=dtype)


def llama2_7b(dtype: str = "bfloat16") -> ModelConfig:
  """Llama-2-7b-hf: 32 layers, d 4096, MHA 32 heads, FFN 11008, vocab 32000, 4K context."""
  return ModelConfig(
      vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
      num_kv_heads=32, head_dim=128, rope_theta=10000.0, rms_norm_eps=1e-5, tie_embeddings=False,
      max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,), dtype=dtype)


def llama2_7b_32k(dtype: str = "bfloat16") -> ModelConfig:
  """togethercomputer/LLaMA-2-7B-32K (MagicDec's Llama-2 target): Llama-2-7B with linear RoPE scaling x8."""
  return llama2_7b(dtype).replace(rope_scaling=RopeScaling(kind="linear", factor=8.0),
                                  max_position_embeddings=32768)


def tinyllama_1b(dtype: str = "bfloat16") -> ModelConfig:
  """TinyLlama-1.1B: 22 layers, d 2048, GQA 32/4, head_dim 64, FFN 5632, vocab 32000 (Llama-2 tokenizer)."""
  return ModelConfig(
      vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32,
      num_kv_heads=4, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-5, tie_embeddings=False,
      max_position_embeddings=2048, bos_token_id=1, eos_token_ids=(2,), dtype=dtype)


def smollm2_135m(dtype: str = "bfloat16") -> ModelConfig:
  """SmolLM2-135M(-Instruct): 30 layers, d 576, GQA 9/3, head_dim 64, FFN 1536, vocab 49152, tied; CPU tests."""
  return ModelConfig(
      vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
      num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
      max_position_embeddings=8192, bos_token_id=1, eos_token_ids=(2,), dtype=dtype)


MODEL_SHAPES = {
    "llama31_8b": llama31_8b,
    "llama32_1b": llama32_1b,
    "llama2_7b": llama2_7b,
    "llama2_7b_32k": llama2_7b_32k,
    "tinyllama_1b": tinyllama_1b,
    "smollm2_135m": smollm2_135m,
}


def model_shape(name: str, dtype: str = "bfloat16") -> ModelConfig:
  if name not in MODEL_SHAPES:
    raise ValueError(f"unknown model shape {name!r}; known: {sorted(MODEL_SHAPES)}")
  return MODEL_SHAPES[name](dtype)
