"""benchmarks/distilled_draft_speed.py --smoke (random tiny target, a 1-layer draft cut from it): the script
runs end to end, its JSON has the promised fields, and every speculative run's greedy output equals the
autoregressive one. A few seconds of CPU."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import distilled_draft_speed  # noqa: E402


@pytest.mark.slow
def test_distilled_draft_speed_smoke(tmp_path):
  out = tmp_path / "dds.json"
  distilled_draft_speed.main(["--smoke", "--output", str(out)])
  doc = json.loads(out.read_text())
  assert doc["env"]["device"] and doc["env"]["jax_version"] and doc["env"]["date"]
  assert doc["draft_layers"] == 1 and doc["target_layers"] == 2
  (shape,) = doc["shapes"]
  assert set(shape["runs"]) == {"autoregressive", "self_streaming_gamma2", "distilled_model_gamma2"}
  for name, run in shape["runs"].items():
    assert run["tokens_per_s"] > 0
    if name != "autoregressive":
      assert run["identical_to_ar"], name
      assert 1.0 <= run["mean_accepted_length"] <= 3.0
