"""Fixed-shape numerics' prefill (layers/invariant.chunk_attention): a prompt's K/V do not depend on the chunk.

With `numerics="invariant"` a prompt is padded to its own bucket (16, 32, ... tokens) and prefilled in chunks
of min(bucket, 256): a row alone and the same row beside a longer prompt are prefilled in chunks of different
sizes, into caches of different slot counts. Their K/V, and so the logits of every step after, must be the
same bits. Checked here on a tiny model in bfloat16 and float32, with a sliding-window layer too (a ring in
the larger caches, a linear layer in the smaller ones), against float64 numpy for the attention itself, and
end to end (speculative decoding's tokens are plain decoding's, alone or in a batch of mixed lengths).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import compile as compiling, loop
from magicdec_jax.backend import fixed_shapes
from magicdec_jax.cache import KVCache, ring_margin
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.layers.invariant import chunk_attention
from magicdec_jax.model import Model
from magicdec_jax.prompts import pad_prompts
from magicdec_jax.trees import AR_TREE

from conftest import random_prompts
from test_invariant_numerics import forward_pass, target

WINDOW = 24       # the windowed variant: layer 0 sees (p - 24, p]


@functools.lru_cache(maxsize=None)
def model(dtype: str, windowed: bool) -> Model:
  """The invariant-numerics tests' tiny target (bfloat16, or its float32 weights), layer 0 windowed or not."""
  m = target()
  if dtype == "float32":
    m = Model(dataclasses.replace(m.config, dtype="float32"), jax.tree.map(lambda a: a.astype(jnp.float32),
                                                                           m.params), name=m.name + "-f32")
  cfg = dataclasses.replace(m.config, numerics="invariant", layer_windows=(WINDOW, 0) if windowed else ())
  return Model(cfg, m.params, name=m.name)


def prefilled(m: Model, prompts, bucket: int, chunk: int, num_slots: int) -> KVCache:
  """loop.prefill of the prompts right-padded to `bucket`, compiled as the engine compiles it."""
  ids, lengths = pad_prompts(prompts, len(prompts), bucket)
  args = (m.params, jnp.asarray(ids), jnp.asarray(lengths - 1))    # the last token: the first step's
  static = dict(cfg=m.config, num_slots=num_slots, margin=ring_margin(AR_TREE.num_nodes, chunk), chunk=chunk)
  return compiling.jit_executable("test_prefill", loop.prefill, args, static,
                                  options=m.config.fixed.compiler_options(prefill=True))(*args)


def positions_kv(m: Model, cache: KVCache, row: int, n: int) -> list[np.ndarray]:
  """Row `row`'s K and V of positions 0..n-1 in every layer (a ring layer's slot p % R)."""
  out = []
  for layer in range(m.config.num_layers):
    slots = np.arange(n) % cache.k[layer].shape[2]
    out += [np.asarray(buf[layer][row][:, slots], np.float32) for buf in (cache.k, cache.v)]
  return out


def next_logits(m: Model, cache: KVCache, prompts) -> np.ndarray:
  """The logits of each row's first step: its last prompt token at position L - 1."""
  last = jnp.asarray([[p[-1]] for p in prompts], jnp.int32)
  pos = jnp.asarray([[len(p) - 1] for p in prompts], jnp.int32)
  logits, _ = forward_pass(m, m.config, cache, last, pos, pos, pos[:, 0], np.ones((1, 1), bool))
  return np.asarray(logits, np.float32)


@pytest.mark.parametrize("dtype, windowed", [("bfloat16", False), ("float32", False), ("bfloat16", True)])
def test_a_prompts_kv_and_next_logits_are_the_same_bits_at_any_chunk_bucket_and_batch(dtype, windowed):
  """Prompts of 150 and 21 tokens prefilled together (bucket 256) in chunks of 256, 64 and 16 (cache of 320
  slots), and the 21-token prompt alone (bucket 32, one chunk of 32, a cache of 64 slots): every chunking
  gives both rows bitwise the same K/V at every position and the same next-step logits."""
  m = model(dtype, windowed)
  prompts = random_prompts((150, 21), m.config.vocab_size, seed=5)
  runs = {chunk: prefilled(m, prompts, 256, chunk, 320) for chunk in (256, 64, 16)}
  alone = prefilled(m, prompts[1:], 32, 32, 64)
  if windowed:
    assert runs[256].is_ring(0) and not alone.is_ring(0), "the windowed layer: a ring in one, linear in the other"
  ref_logits = next_logits(m, runs[256], prompts)
  for chunk, cache in runs.items():
    for row, p in enumerate(prompts):
      for a, b in zip(positions_kv(m, cache, row, len(p) - 1), positions_kv(m, runs[256], row, len(p) - 1)):
        np.testing.assert_array_equal(a, b, err_msg=f"chunk {chunk}, row {row}")
    np.testing.assert_array_equal(next_logits(m, cache, prompts), ref_logits, err_msg=f"chunk {chunk}")
  for a, b in zip(positions_kv(m, alone, 0, 20), positions_kv(m, runs[256], 1, 20)):
    np.testing.assert_array_equal(a, b, err_msg="the 21-token row alone")
  np.testing.assert_array_equal(next_logits(m, alone, prompts[1:]), ref_logits[1:])


def reference_attention(q, k, v, scale, window, softcap):
  """Causal softmax attention in float64: q [P, H, D], k/v [P, K, D] -> [P, H, D]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  n, h, _ = q.shape
  g = h // k.shape[1]
  i = np.arange(n)
  seen = i[None, :] <= i[:, None]
  if window is not None:
    seen &= i[None, :] > i[:, None] - window
  out = np.zeros_like(q)
  for head in range(h):
    logits = q[:, head] @ k[:, head // g].T * scale
    if softcap is not None:
      logits = np.tanh(logits / softcap) * softcap
    logits = np.where(seen, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    out[:, head] = (p / p.sum(-1, keepdims=True)) @ v[:, head // g]
  return out


@pytest.mark.parametrize("window, softcap, ring", [(None, None, 0), (20, None, 0), (None, 30.0, 0), (20, None, 64)])
def test_chunk_attention_matches_float64_numpy_and_is_the_same_bits_at_any_chunk(window, softcap, ring):
  """chunk_attention with tiles of (16 queries, 32 keys), 2 rows x 96 positions in chunks of 8, 16, 32 and 96
  (a ring of 64 slots, written and read by position % 64, in chunks up to 32: it holds the window and a
  chunk) against float64 numpy; every chunking the same bits."""
  fixed = dataclasses.replace(fixed_shapes(), prefill_tile=(16, 32))
  rng = np.random.default_rng(1)
  b, n, kh, g, d, s = 2, 96, 2, 3, 8, 112
  q = rng.normal(size=(b, n, kh * g, d)).astype(np.float32)
  k = rng.normal(size=(b, n, kh, d)).astype(np.float32)
  v = rng.normal(size=(b, n, kh, d)).astype(np.float32)
  fn = jax.jit(functools.partial(chunk_attention, scale=0.4, softcap=softcap, window=window, fixed=fixed, ring=ring))
  outs = []
  for t in (8, 16, 32) if ring else (8, 16, 32, 96):
    cache_k, cache_v = (np.zeros((b, kh, ring or s, d), np.float32) for _ in range(2))
    parts = []
    for c in range(0, n, t):
      slots = np.arange(c, c + t) % (ring or s)
      cache_k[:, :, slots] = k[:, c:c + t].transpose(0, 2, 1, 3)
      cache_v[:, :, slots] = v[:, c:c + t].transpose(0, 2, 1, 3)
      parts.append(np.asarray(fn(jnp.asarray(q[:, c:c + t]), jnp.asarray(cache_k), jnp.asarray(cache_v),
                                 jnp.int32(c))))
    outs.append(np.concatenate(parts, 1))
  for row in range(b):
    np.testing.assert_allclose(outs[0][row], reference_attention(q[row], k[row], v[row], 0.4, window, softcap),
                               atol=2e-6, rtol=1e-5)
  for out in outs[1:]:
    np.testing.assert_array_equal(out, outs[0])


def test_speculative_decoding_gives_plain_tokens_for_short_prompts_of_mixed_lengths():
  """Prompts of 5, 40 and 19 tokens (bucket 64, chunks of 64) and each alone (buckets 16, 64 and 32): a
  StreamingLLM chain gives plain decoding's greedy tokens, and every row alone gives the batch's tokens."""
  m = target()
  prompts = random_prompts((5, 40, 19), m.config.vocab_size, seed=9)
  kw = dict(max_new_tokens=12)
  ref = md.generate(m, prompts, **kw)
  assert md.generate(m, prompts, draft=StreamingDraft(sink=2, window=4), gamma=3, **kw).tokens == ref.tokens
  for i, p in enumerate(prompts):
    assert md.generate(m, [p], **kw).tokens[0] == ref.tokens[i], i
