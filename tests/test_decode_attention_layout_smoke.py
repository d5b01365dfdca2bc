"""benchmarks/decode_attention_layout.py at a tiny shape: it runs, writes its JSON, and its two alternative
formulations (K transposed, logits as [S, Q]) agree with a float64 numpy attention. A few seconds."""
import json
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import decode_attention_layout as dal  # noqa: E402


def _numpy_attention(q, k, v, mask):
  """float64 reference: q [B,T,H,D], k/v [B,K,S,D], mask [B,T,S]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  g = q.shape[2] // k.shape[1]
  k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)                      # [B,H,S,D]
  logits = np.einsum("bthd,bhsd->bhts", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(np.asarray(mask)[:, None], logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhts,bhsd->bthd", p, v)


def test_formulations_match_numpy():
  rng = np.random.default_rng(1)
  b, t, kh, g, s, d = 2, 3, 2, 3, 40, 8
  q = rng.standard_normal((b, t, kh * g, d), np.float32)
  k = rng.standard_normal((b, kh, s, d), np.float32)
  v = rng.standard_normal((b, kh, s, d), np.float32)
  lengths = np.array([30, 17])
  mask = np.arange(s)[None, None, :] < (lengths[:, None, None] + np.arange(t)[None, :, None])
  ref = _numpy_attention(q, k, v, mask)
  kt = np.ascontiguousarray(np.swapaxes(k, 2, 3))
  np.testing.assert_allclose(dal.kt_attention(jnp.asarray(q), jnp.asarray(kt), jnp.asarray(v), jnp.asarray(mask)),
                             ref, atol=2e-5)
  np.testing.assert_allclose(dal.sq_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask)),
                             ref, atol=2e-5)


@pytest.mark.slow
def test_smoke_json(tmp_path):
  out = tmp_path / "dal.json"
  dal.main(["--shape", "2x128", "--layers", "2", "--tokens", "1,3", "--repeats", "1", "--output", str(out)])
  doc = json.loads(out.read_text())
  assert doc["env"]["device"] and doc["env"]["jax_version"] and doc["env"]["date"]
  assert [r["tokens"] for r in doc["by_tokens"]] == [1, 3]
  for row in doc["by_tokens"]:
    assert max(row["max_abs_diff"].values()) < 1e-4
    for how in ("cache_layout", "kt_layout", "sq_orientation"):
      assert row["attention"][how]["min_ms"] > 0
  assert set(doc["ratio_to_T1"]) == {"1", "3"}
