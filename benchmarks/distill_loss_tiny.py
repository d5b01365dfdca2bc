"""KL vs CE distillation on a tiny random target (3 layers, attention scaled up so context matters) with a
1-layer draft from its first layer: held-out KL (float64) and held-out greedy acceptance (sink 2 + window 8)
after the same number of steps, same data and schedule. Writes benchmarks/results/distill_loss_tiny_<dev>.json.

  python benchmarks/distill_loss_tiny.py
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from conftest import tiny_model  # noqa: E402
from magicdec_jax.training import distill  # noqa: E402


def main():
  env = common.env_info()
  target = tiny_model(0, layers=3, attn_scale=4.0)
  rng = np.random.default_rng(0)
  data = rng.integers(0, 64, size=(256, 64)).astype(np.int32)
  held = [np.random.default_rng(1000 + i).integers(0, 64, size=128).tolist() for i in range(8)]
  out = {"benchmark": "distill_loss_tiny", "env": env, "target": target.name, "draft": "first 1 of 3 layers",
         "data": "256 windows x 64 random tokens; held-out: 8 x 128 other random tokens", "runs": {}}
  for loss in ("kl", "ce"):
    cfg = distill.DistillConfig(steps=120, lr=1e-2, warmup_steps=10, batch=8, seq_len=64, loss=loss,
                                checkpoint_every=1000, eval_every=20, sink=2, window=8)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
      model, hist = distill.distill(target, distill.init_draft(target, layers=1), data, d + "/o", cfg,
                                    eval_windows=held, progress=False)
    out["runs"][loss] = {"heldout_kl_untrained": distill.heldout_kl(target, distill.init_draft(target, layers=1), held),
                         "heldout_kl": distill.heldout_kl(target, model, held),
                         "curve": [{"step": h["step"], "acceptance": h["acceptance"]} for h in hist],
                         "wall_s": round(time.perf_counter() - t0, 1)}
  out["env"]["loadavg_end"] = list(os.getloadavg())
  path = common.RESULTS_DIR / f"distill_loss_tiny_{common.device_tag()}.json"
  with open(path, "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps({k: {kk: v[kk] for kk in ("heldout_kl", "curve")} for k, v in out["runs"].items()}))
  print(path)


if __name__ == "__main__":
  main()
