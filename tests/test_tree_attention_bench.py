"""benchmarks/tree_attention_bench.py --smoke: every backend that runs on CPU (XLA, Pallas interpreter) lowers
and runs at every smoke shape and agrees with XLA. Guards the [B, K, S, D] cache layout the kernel takes
(the script once built [B, S, K, D] and every shape errored). A few seconds of CPU."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import tree_attention_bench  # noqa: E402


@pytest.mark.slow
def test_tree_attention_bench_smoke(tmp_path):
  doc = tree_attention_bench.main(["--smoke", "--strict", "--out", str(tmp_path / "smoke.json")])
  assert doc["impls"][0] == "xla" and "pallas_interpret" in doc["impls"]
  assert doc["results"]
  for row in doc["results"]:
    assert not [k for k in row if k.endswith("_error")], row
    assert row["xla_ms"] > 0 and row["pallas_interpret_ms"] > 0
    assert row["pallas_interpret_max_abs_diff_vs_xla"] < 1e-2, row   # bfloat16 inputs, float32 math
  assert (tmp_path / "smoke.json").exists()
