"""The prefill chunk attention (causal triangle, block by block) against float64 numpy softmax attention."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax.layers.prefill_attention import causal_chunk_attention

from conftest import float64_attention


def causal_reference(q, k_all, v_all, start):
  """q [B,T,H,D]; k_all/v_all [B,K,S,D] with the chunk's K/V already at slots start..start+T-1."""
  return float64_attention(q, k_all, v_all, start, np.tril(np.ones((q.shape[1],) * 2, bool)))


@pytest.mark.parametrize("chunk,num_chunks,heads,kv_heads", [(8, 4, 6, 2), (16, 3, 4, 4), (4, 5, 3, 1)])
def test_every_chunk_matches_float64_causal_attention(chunk, num_chunks, heads, kv_heads):
  b, d = 2, 8
  s = chunk * num_chunks + 8                    # extra never-written slots hold garbage (must be unseen)
  keys = jax.random.split(jax.random.key(chunk * 31 + heads), 4)
  cache_k = jax.random.normal(keys[0], (b, kv_heads, s, d)) * 2
  cache_v = jax.random.normal(keys[1], (b, kv_heads, s, d))
  cache_k = cache_k.at[:, :, chunk * num_chunks:].set(1e4)   # poison past the prompt
  cache_v = cache_v.at[:, :, chunk * num_chunks:].set(jnp.nan)
  fn = jax.jit(causal_chunk_attention)
  for c in range(num_chunks):
    start = c * chunk
    q = jax.random.normal(jax.random.fold_in(keys[2], c), (b, chunk, heads, d)) * 2
    k_new = jnp.swapaxes(cache_k[:, :, start:start + chunk], 1, 2)
    v_new = jnp.swapaxes(cache_v[:, :, start:start + chunk], 1, 2)
    got = fn(q, k_new, v_new, cache_k, cache_v, jnp.int32(start))
    want = causal_reference(q, cache_k, cache_v, start)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_bfloat16_inputs_keep_float32_math():
  b, chunk, h, kh, d = 1, 8, 4, 2, 16
  keys = jax.random.split(jax.random.key(3), 3)
  cache_k = jax.random.normal(keys[0], (b, kh, 3 * chunk, d)).astype(jnp.bfloat16)
  cache_v = jax.random.normal(keys[1], (b, kh, 3 * chunk, d)).astype(jnp.bfloat16)
  q = jax.random.normal(keys[2], (b, chunk, h, d)).astype(jnp.bfloat16)
  start = 2 * chunk
  got = causal_chunk_attention(q, jnp.swapaxes(cache_k[:, :, start:], 1, 2),
                               jnp.swapaxes(cache_v[:, :, start:], 1, 2), cache_k, cache_v, jnp.int32(start))
  assert got.dtype == jnp.bfloat16
  want = causal_reference(np.asarray(q, np.float32), np.asarray(cache_k, np.float32),
                         np.asarray(cache_v, np.float32), start)
  np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-2, atol=2e-2)


def test_vectorised_rows_under_a_mesh_match_float64():
  """Under a mesh the rows are attended together (the partitioner splits them), not one by one."""
  b, chunk, h, kh, d = 3, 8, 4, 2, 8
  keys = jax.random.split(jax.random.key(5), 3)
  cache_k = jax.random.normal(keys[0], (b, kh, 3 * chunk, d))
  cache_v = jax.random.normal(keys[1], (b, kh, 3 * chunk, d))
  q = jax.random.normal(keys[2], (b, chunk, h, d))
  start = 2 * chunk
  mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    got = jax.jit(causal_chunk_attention)(q, jnp.swapaxes(cache_k[:, :, start:], 1, 2),
                                          jnp.swapaxes(cache_v[:, :, start:], 1, 2), cache_k, cache_v,
                                          jnp.int32(start))
  np.testing.assert_allclose(np.asarray(got), causal_reference(q, cache_k, cache_v, start), rtol=2e-5, atol=2e-5)
