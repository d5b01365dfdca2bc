"""benchmarks/auto_vs_sweep.py --smoke (random tiny model, one tiny shape, calibrating first): the script runs
end to end and its JSON has the promised fields. ~1 minute of CPU."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import auto_vs_sweep  # noqa: E402


@pytest.mark.slow
def test_auto_vs_sweep_smoke(tmp_path):
  out = tmp_path / "avs.json"
  auto_vs_sweep.main(["--smoke", "--output", str(out)])
  doc = json.loads(out.read_text())
  assert doc["env"]["device"] and doc["env"]["jax_version"] and doc["env"]["date"]
  assert doc["env"]["loadavg_start"] and doc["profile"]["holdout_rel_err"]["method"] == "leave-one-out"
  (shape,) = doc["shapes"]
  assert {"autoregressive", "gamma1", "gamma2", "sequoia16"} <= set(shape["runs"])
  picks = shape["auto_picks"]
  assert picks["auto_gamma"]["chain"] and picks["auto_tree"]["nodes"] >= 1
  assert all(p["measured_by"] in shape["runs"] for p in picks.values()), picks   # every pick was run
  s = shape["summary"]
  for k in ("best_gamma", "auto_gamma", "auto_gamma_over_best", "best_shipped_tree", "auto_tree_over_best_shipped",
            "auto_gamma_over_best_of_sweep", "auto_tree_over_best_of_sweep"):
    assert k in s, k
  assert all(r["identical_to_ar"] for name, r in shape["runs"].items() if name != "autoregressive")
  assert (tmp_path / "avs.profile.json").exists()
  again = tmp_path / "rescored.json"
  auto_vs_sweep.main(["--smoke", "--rescore", str(out), "--output", str(again)])
  re = json.loads(again.read_text())
  assert re["rescored"]["from"] == "avs.json" and re["shapes"][0]["runs"] == shape["runs"]   # runs untouched
  assert "auto_gamma_over_best_of_sweep" in re["shapes"][0]["summary"]
