"""benchmarks/datagen_throughput.py --smoke (random tiny model, 6 prompts x 2 samples, 2 slots): every
configuration runs, the merged JSON has the promised fields, static and continuous batching give the same
samples, and the utilization figures are consistent with the row-round counts. A few seconds of CPU."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import datagen_throughput  # noqa: E402


@pytest.mark.slow
def test_datagen_throughput_smoke(tmp_path):
  runs = [a for c in datagen_throughput.CONFIGS for a in ("--run", c)]
  datagen_throughput.main(["--smoke", *runs, "--merge", "--out-dir", str(tmp_path)])
  doc = json.loads((tmp_path / f"{datagen_throughput.NAME}.json").read_text())
  assert (tmp_path / f"{datagen_throughput.NAME}.png").stat().st_size > 0
  assert set(doc["configs"]) == set(datagen_throughput.CONFIGS)
  for c in doc["configs"].values():
    assert c["samples"] == 12 and c["useful_tokens_per_s"] > 0 and 0 <= c["prefill_share"] < 1
    assert c["slot_utilization"] == c["active_row_rounds"] / c["row_rounds"]
    assert c["row_rounds"] == 2 * c["rounds"]                         # 2 slots every round
    assert c["active_row_rounds"] == c["sample_verify_steps"]         # = the rows' own round counters
  for mode in ("ar", "streaming"):
    s = doc["summary"][mode]
    assert s["same_outputs"] and s["bound"] >= 1.0 and s["speedup"] > 0
