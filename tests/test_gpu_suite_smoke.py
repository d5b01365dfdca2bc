"""benchmarks/gpu_suite.py --smoke in a subprocess: the JSON has the promised fields with sane values.

The Bernoulli(alpha) acceptance switch is checked against its definition on a large sample (per-position
conditional acceptance ~ alpha, mean accepted ~ the closed form (1 - a^(g+1)) / (1 - a) - 1; for a tree,
mean accepted ~ tree.expected_tokens(vector) - 1), and the decode loop must produce every requested token
for chains and trees. The fitted step-time model, compile seconds and the greedy-agreement figure are
present. About 1.5 minutes of CPU (compilation dominates).
"""
import pytest
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# slow: on the 2-vCPU Intel VM of 2026-11-24 the default suite took 96 min (CI allows 90); run with -m slow
@pytest.mark.slow
def test_gpu_suite_smoke(tmp_path):
  out = tmp_path / "smoke.json"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_suite.py"), "--smoke",
                         "--output", str(out)], capture_output=True, text=True, timeout=900,
                        env=dict(os.environ, PYTHONPATH=ROOT))     # this checkout's magicdec_jax
  assert proc.returncode == 0, proc.stderr[-3000:]
  doc = json.loads(out.read_text())
  assert doc["env"]["jax_version"] and doc["env"]["device"] and doc["env"]["date"]
  assert doc["bandwidth"]["bytes_per_s"] > 0
  assert any(chk["gamma"] is None for chk in doc["bernoulli_check"])        # a tree is checked too
  for chk in doc["bernoulli_check"]:
    if chk["gamma"] is not None:
      assert abs(chk["conditional_acceptance"] - chk["alpha"]) < 0.03, chk
    assert abs(chk["mean_accepted"] - chk["expected_mean_accepted"]) < 0.1, chk
  steps = [s for s in doc["steps"] if "skipped" not in s]
  assert steps
  for s in steps:
    assert s["ar_step_s"] > 0 and s["ar_floor_s"] > 0
    assert all(v > 0 for k, v in s.items() if k.endswith("_over_ar"))
    assert s["draft_feature_over_ar"] > 0                                 # the feature head's step
  fit = doc["fitted_model"]
  assert len(fit["coef"]) == 8 and fit["steps"] >= 10 and "holdout_rel_err_mean" in fit
  assert (tmp_path / "smoke.profile.json").exists()                     # a hardware profile beside it
  agree = doc["greedy_agreement"]
  assert agree["share_equal"] == 1.0, agree                             # float32 on CPU: exact
  e2e = doc["end_to_end"]
  assert {r["draft"] for r in e2e} == {"self", "model", "snapkv"}
  assert any(r["config"].startswith("sequoia") and r["tree_nodes"] > r["tree_depth"] + 1 for r in e2e)
  for r in e2e:
    for field in ("device", "jax_version", "date", "model_shape", "batch", "context", "draft", "gamma", "config",
                  "alpha", "ar_tokens_per_s", "spec_tokens_per_s", "speedup", "compile_s", "predicted_speedup"):
      assert field in r, field
    assert r["alpha"] in (0.8, 0.7)
    assert r["speedup"] > 0 and r["ar_tokens_per_s"] > 0 and r["spec_tokens_per_s"] > 0
    assert r["spec"]["new_tokens"] == r["batch"] * doc["args"]["max_new"]
    assert r["ar"]["new_tokens"] == r["batch"] * doc["args"]["max_new"]
    # forced acceptance really drives the loop: with real acceptance random weights accept ~nothing
    assert r["mean_accepted_length"] > 1.5
  assert "speedup" in proc.stdout.splitlines()[-len(e2e) - 1]       # the summary table is printed last
