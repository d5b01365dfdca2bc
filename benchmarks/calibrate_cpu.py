"""Measure SmolLM2-135M-shaped step times on this CPU and fit the step-time model -> a hardware profile JSON.

Random weights at the real shape (speed does not depend on weight values), StreamingLLM self-draft (4 + 128).
The same as `run.py --mode=calibrate --model=smollm2-135m` without loading the checkpoint. Usage:
  python -m benchmarks.calibrate_cpu [--output benchmarks/results/cpu_profile_random_smollm2.json] [--quick]
"""
import json

import jax

from benchmarks import common
from magicdec_jax import init_params
from magicdec_jax.measure import calibrate
from magicdec_jax.tuning import profiles, shapes


def main(argv=None):
  ap = common.parser(__doc__, smoke=None)
  ap.add_argument("--out", dest="output", help="the same as --output (the profile's path; default: not written)")
  ap.add_argument("--quick", action="store_true", help="a smaller grid (about a minute)")
  args = common.parse(ap, argv)
  cfg = shapes.smollm2_135m(dtype="float32")
  params = init_params(cfg, jax.random.key(0))
  grid = dict(batches=(1, 4), contexts=(256, 1024), tokens=(1, 4), repeats=2, passes=1) if args.quick else {}
  prof = calibrate.calibrate(params, cfg, drafts=[calibrate.DraftUnderTest("self", 4 + 128)],
                             model_name="smollm2_135m fp32 (random weights)", **grid)
  if args.output:
    profiles.save_profile(prof, args.output)
  print(json.dumps({"fit": {k: prof["fit"][k] for k in ("features", "coef", "train_rel_err", "holdout_rel_err")},
                    "measured_steps": len(prof["measurements"]), "seconds": prof["total_s"]}, indent=1))


if __name__ == "__main__":
  main()
