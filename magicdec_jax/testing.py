"""Small random models for tests, smoke runs and debugging (`--model=random-tiny[:SEED]`).

`random_tiny_model` is a 2-layer random LLaMA over a byte-level tokenizer: seconds to compile, real text in
and out, a chat template, an EOS id. Nothing here is used on the generation path.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params

RANDOM_PREFIX = "random-tiny"


def byte_tokenizer():
  """A byte-level `tokenizers.Tokenizer` (256 byte tokens + '<|eos|>' = 256) for random test models."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<|eos|>"])
  return tok


TINY_CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}")


def random_tiny_model(seed: int = 0, max_pos: int = 4096):
  """A 2-layer random LLaMA over the byte tokenizer (vocab 264, eos 256): fast, for tests and debugging.

  Params are numpy normals in init_params' layout (shapes from jax.eval_shape, no flax init compile).
  """
  cfg = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_pos, eos_token_ids=(256,))
  shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def leaf(path, x):
    if "scale" in jax.tree_util.keystr(path):
      return jax.numpy.ones(x.shape, x.dtype)
    std = 0.5 if "embed" in jax.tree_util.keystr(path) else cfg.hidden_size ** -0.5
    return jax.numpy.asarray(rng.normal(size=x.shape) * std, x.dtype)

  params = jax.tree_util.tree_map_with_path(leaf, shapes)
  return Model(cfg, params, tokenizer=byte_tokenizer(), chat_template=TINY_CHAT_TEMPLATE,
               name=f"{RANDOM_PREFIX}:{seed}")
