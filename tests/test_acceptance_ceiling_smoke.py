"""benchmarks/acceptance_ceiling.py at a tiny shape: it runs and writes its JSON; its margin statistic is
checked against numpy on the same logits recomputed independently (a plain full forward). A few seconds."""
import json
import os
import sys

import jax.numpy as jnp
import numpy as np

from magicdec_jax import testing
from magicdec_jax.model import full_forward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import acceptance_ceiling  # noqa: E402


def test_acceptance_ceiling_smoke(tmp_path):
  out = tmp_path / "c.json"
  acceptance_ceiling.main(["--smoke", "--output", str(out)])
  doc = json.loads(out.read_text())
  model = testing.random_tiny_model(0)
  ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 64))
  lg = np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)), np.float64)
  lg = lg.reshape(-1, lg.shape[-1])
  p = np.exp(lg - lg.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  s = np.sort(p, -1)
  assert doc["positions"] == 128
  assert abs(doc["target_top1_prob"]["mean"] - s[:, -1].mean()) < 1e-4
  assert abs(doc["top1_over_top2_below"]["2.0"] - np.mean(s[:, -1] / s[:, -2] < 2.0)) <= 1 / 128
  assert 0 <= doc["truncated_target_agreement"]["1"] <= 1
