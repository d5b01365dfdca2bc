"""Fit the cost model's effective CPU figures from measured SmolLM2-135M-shaped step times; prints JSON.

Random weights at the real shape (speed does not depend on weight values). Usage:
  python benchmarks/calibrate_cpu.py [--out benchmarks/results/cpu_calibration.json]
"""
import argparse
import datetime
import json
import platform

import jax

from magicdec_jax import autotune, costmodel, init_params, shapes


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=None)
  args = ap.parse_args()
  cfg = shapes.smollm2_135m(dtype="float32") if "dtype" in shapes.smollm2_135m.__code__.co_varnames \
      else shapes.smollm2_135m().replace(dtype="float32")
  params = init_params(cfg, jax.random.key(0))
  hw, meas = autotune.calibrate_here(params, cfg)
  rows = [{"batch": s.batch, "context": s.context, "new_tokens": s.new_tokens, "seconds": t,
           "predicted_s": costmodel.step_time(cfg, hw, s.batch, s.context, s.new_tokens, cfg.dtype)}
          for s, t in meas]
  out = {"device": jax.devices()[0].device_kind, "cpu": platform.processor() or platform.machine(),
         "jax": jax.__version__, "date": datetime.date.today().isoformat(), "model_shape": "smollm2_135m fp32",
         "fit": {"bytes_per_s": hw.hbm_bytes_per_s, "flops_per_s": hw.flops_per_s,
                 "step_overhead_s": hw.step_overhead_s, "combine": hw.combine},
         "measurements": rows}
  text = json.dumps(out, indent=1)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
