"""KL vs CE distillation on a tiny random target (3 layers, attention scaled up so context matters) with a
1-layer draft from its first layer: held-out KL (float64) and held-out greedy acceptance (sink 2 + window 8)
after the same number of steps, same data and schedule. Writes benchmarks/results/distill_loss_tiny_<dev>.json.

  python -m benchmarks.distill_loss_tiny
"""
from __future__ import annotations

import json
import tempfile
import time

import jax
import numpy as np

from benchmarks import common
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params
from magicdec_jax.training import distill


def tiny_target() -> Model:
  """tests/conftest.py's tiny_model(0, layers=3, attn_scale=4.0): vocab 64, hidden 32, attention x 4."""
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=512)
  params = init_params(cfg, jax.random.key(0), scale=0.5)
  params["layers"] = tuple(dict(lp, attn=jax.tree.map(lambda a: a * 4.0, lp["attn"])) for lp in params["layers"])
  return Model(cfg, params, name="tiny0-v64-l3-a4.0")


def main(argv=None):
  args = common.parse(common.parser(__doc__, smoke=None), argv)
  env = common.env_info()
  target = tiny_target()
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
  path = common.write_json(out, common.output_path(args.output, "distill_loss_tiny"))
  print(json.dumps({k: {kk: v[kk] for kk in ("heldout_kl", "curve")} for k, v in out["runs"].items()}))
  print(path)


if __name__ == "__main__":
  main()
