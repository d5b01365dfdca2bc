"""benchmarks/feature_draft_speed.py --smoke (random tiny target and a random feature head): the script runs
end to end, its JSON has the promised fields, and every speculative run's greedy output equals the
autoregressive one (chains and a tree, all decoded from one prefill). A few seconds of CPU."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import feature_draft_speed  # noqa: E402


@pytest.mark.slow
def test_feature_draft_speed_smoke(tmp_path):
  out = tmp_path / "fds.json"
  feature_draft_speed.main(["--smoke", "--output", str(out)])
  doc = json.loads(out.read_text())
  assert doc["env"]["device"] and doc["env"]["jax_version"] and doc["env"]["date"]
  steps = doc["steps"]
  assert steps["feature_step_s"] > 0 and steps["self_draft_step_s"] > 0
  assert [r["context"] for r in steps["by_context"]] == [64] and steps["by_context"][0]["feature_over_ar"] > 0
  (shape,) = doc["shapes"]
  assert set(shape["runs"]) == {"autoregressive", "self_streaming_gamma3", "feature_head_gamma2",
                                "feature_head_tree2-1"}
  assert shape["runs"]["feature_head_tree2-1"]["tree_parents"] == [-1, 0, 0, 1]
  for name, run in shape["runs"].items():
    assert run["tokens_per_s"] > 0
    if name != "autoregressive":
      assert run["identical_to_ar"], name
      depth = run["gamma"] if "gamma" in run else 2
      assert 1.0 <= run["mean_accepted_length"] <= depth + 1
