"""Independent references shared by several test modules: a cache-free argmax loop and random HF models."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from magicdec_jax.checkpoints import params_from_hf_state_dict
from magicdec_jax.families import config_from_hf
from magicdec_jax.model import Model, full_forward

from conftest import random_hf_llama


def reference_greedy(model, prompts, new: int) -> list[list[int]]:
  """Argmax of a full causal forward over the whole sequence, one token at a time (no cache).

  Rows live in one fixed-width buffer (right padding is invisible to earlier positions under the causal
  mask), so every step reuses one compiled shape.
  """
  width = max(len(p) for p in prompts) + new
  buf = np.zeros((len(prompts), width), np.int32)
  lens = np.asarray([len(p) for p in prompts])
  for i, p in enumerate(prompts):
    buf[i, :len(p)] = p
  for _ in range(new):
    lg = np.asarray(full_forward(model.params, model.config, jnp.asarray(buf)))
    nxt = lg[np.arange(len(prompts)), lens - 1].argmax(-1)
    buf[np.arange(len(prompts)), lens] = nxt
    lens = lens + 1
  return [buf[i, len(p):len(p) + new].tolist() for i, p in enumerate(prompts)]


def hf_model(kv_heads, scaling, tied, seed=0):
  """A random tiny HF LlamaForCausalLM: GQA/MHA by kv_heads, RoPE scaling dict or None, tied head or not."""
  rope = {"rope_type": "default", "rope_theta": 500.0}
  if scaling:
    rope = dict(scaling, rope_theta=500.0)
  return random_hf_llama(
      seed, 0.2, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
      tie_word_embeddings=tied, rope_parameters=rope, initializer_range=0.15, rms_norm_eps=1e-5)


def ours_from_hf(model):
  """Our Model holding the same weights as the HF `model` (converted by the checkpoint loader)."""
  cfg = config_from_hf(model.config.to_dict())
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  return Model(cfg, params_from_hf_state_dict(cfg, sd))
