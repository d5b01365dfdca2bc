"""The speculative decoding cases several test modules share: a target, the draft menu, prompts and a stop token."""
from __future__ import annotations

import functools

from magicdec_jax.drafts import ModelDraft, SnapKVDraft, StreamingDraft, truncate_layers
from magicdec_jax.generation import generate

from conftest import random_prompts, tiny_model

NEW = 24
LENGTHS = (9, 16, 12, 14, 10)


def target():
  """The tiny random target every case decodes; attention scaled up so that context matters."""
  return tiny_model(0, attn_scale=10.0)


DRAFTS = {
    "streaming-s0-w4": lambda: StreamingDraft(sink=0, window=4),
    "streaming-s2-w3": lambda: StreamingDraft(sink=2, window=3),
    "streaming-s2-w64": lambda: StreamingDraft(sink=2, window=64),
    "snapkv-b4-w4": lambda: SnapKVDraft(budget=4, window=4, observation_window=4, pool_kernel=3),
    "snapkv-b6-w2": lambda: SnapKVDraft(budget=6, window=2, observation_window=8, pool_kernel=5),
    "model-other-s1-w8": lambda: ModelDraft(    # another architecture, same vocabulary
        tiny_model(1, attn_scale=10.0, hidden=16, heads=2, kv_heads=1, layers=1), sink=1, window=8),
    "model-trunc-s0-w64": lambda: ModelDraft(truncate_layers(target(), 1), sink=0, window=64),
    "model-trunc-s2-w5": lambda: ModelDraft(truncate_layers(target(), 1), sink=2, window=5),
}


@functools.lru_cache(maxsize=None)
def prompts_and_eos() -> tuple[list[list[int]], int]:
  """Prompts and a stop token that row 0 emits mid-run (first emitted after 6 tokens) but not every row."""
  prompts = random_prompts(LENGTHS, 64, seed=11)
  free = generate(target(), prompts[:4], max_new_tokens=NEW).tokens
  for j in range(6, NEW - 4):
    tok = free[0][j]
    if tok not in free[0][:j] and not all(tok in row for row in free):
      return prompts, tok
  raise AssertionError(f"no usable stop token in {free}")
