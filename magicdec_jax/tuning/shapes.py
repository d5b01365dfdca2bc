"""Published shapes of the models MagicDec is evaluated with, as `ModelConfig`s (no weights).

Used by the cost model and by benchmarks that run randomly initialized models of real size. Values are from the
models' HF `config.json` files (the Qwen, Gemma 3 and Mistral ones kept as those files' fields and parsed as
a downloaded config.json is); dtype defaults to bfloat16 (what they ship in).
"""
from __future__ import annotations

import functools

from magicdec_jax.config import ModelConfig, RopeScaling
from magicdec_jax.families import config_from_hf

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
  return llama31_8b(dtype).replace(
      hidden_size=2048, intermediate_size=8192, num_layers=16, head_dim=64, tie_embeddings=True,
      rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192))


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
  return llama2_7b(dtype).replace(hidden_size=2048, intermediate_size=5632, num_layers=22, num_kv_heads=4,
                                  head_dim=64, max_position_embeddings=2048)


def smollm2_135m(dtype: str = "bfloat16") -> ModelConfig:
  """SmolLM2-135M(-Instruct): 30 layers, d 576, GQA 9/3, head_dim 64, FFN 1536, vocab 49152, tied; CPU tests."""
  return ModelConfig(
      vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
      num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
      max_position_embeddings=8192, bos_token_id=1, eos_token_ids=(2,), dtype=dtype)


# ---- other families: each config.json's computation-relevant fields as published on the HF hub, read by the
# same parser as a downloaded one (families.config_from_hf), so the shape carries the family's features too.
# Fields that change nothing here are left out (Qwen's max_window_layers: their use_sliding_window is false).

QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct/config.json
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 131072,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}
QWEN25_32B = dict(QWEN25_7B, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,  # Qwen/Qwen2.5-32B-Instruct
                  num_attention_heads=40, num_key_value_heads=8)
QWEN25_72B = dict(QWEN25_7B, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,  # Qwen/Qwen2.5-72B-Instruct
                  num_attention_heads=64, num_key_value_heads=8)
QWEN3_8B = {  # Qwen/Qwen3-8B/config.json
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}
QWEN3_32B = dict(QWEN3_8B, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,  # Qwen/Qwen3-32B
                 num_attention_heads=64, num_key_value_heads=8)
GEMMA3_4B = {  # google/gemma-3-4b-it/config.json: the text model's fields; the rest are Gemma3TextConfig's defaults
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "eos_token_id": [1, 106],
    "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                    "num_hidden_layers": 34, "sliding_window": 1024,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}}
GEMMA3_12B = dict(GEMMA3_4B, text_config={  # google/gemma-3-12b-it/config.json
    "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 8, "sliding_window": 1024,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})
GEMMA3_27B = dict(GEMMA3_4B, text_config={  # google/gemma-3-27b-it/config.json
    "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
    "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168,
    "sliding_window": 1024, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})
MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1/config.json (v0.2 / v0.3 drop the window: "sliding_window": null)
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 32768, "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "sliding_window": 4096,
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
HF_SHAPES = {"qwen25_7b": QWEN25_7B, "qwen25_32b": QWEN25_32B, "qwen25_72b": QWEN25_72B, "qwen3_8b": QWEN3_8B,
             "qwen3_32b": QWEN3_32B, "gemma3_4b": GEMMA3_4B, "gemma3_12b": GEMMA3_12B, "gemma3_27b": GEMMA3_27B,
             "mistral_7b": MISTRAL_7B}


MODEL_SHAPES = {
    "llama31_8b": llama31_8b,
    "llama32_1b": llama32_1b,
    "llama2_7b": llama2_7b,
    "llama2_7b_32k": llama2_7b_32k,
    "tinyllama_1b": tinyllama_1b,
    "smollm2_135m": smollm2_135m,
    **{name: functools.partial(lambda d, dtype="bfloat16": config_from_hf(d, dtype), d)
       for name, d in HF_SHAPES.items()},
}


def model_shape(name: str, dtype: str = "bfloat16") -> ModelConfig:
  if name not in MODEL_SHAPES:
    raise ValueError(f"unknown model shape {name!r}; known: {sorted(MODEL_SHAPES)}")
  return MODEL_SHAPES[name](dtype)
