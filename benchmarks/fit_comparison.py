"""Held-out (leave-one-out) step-time error of the fitted linear model vs the old 3-parameter roofline fit
(costmodel.calibrate, 'sum' and 'max'), on the measurements of one hardware profile. No timing: reads the JSON.

  python -m benchmarks.fit_comparison benchmarks/results/cpu_profile_smollm2_streaming4+128_2026-11-23.json [OUT]
"""
import json

import numpy as np

from benchmarks import common
from magicdec_jax.measure import calibrate
from magicdec_jax.tuning import costmodel, profiles


def roofline_loo(rows, combine):
  errs = []
  for i, r in enumerate(rows):
    meas = [(costmodel.StepShape(q.cfg, q.batch, q.kv_context, q.new_tokens, q.dtype, kv_context=q.kv_context),
             q.seconds) for j, q in enumerate(rows) if j != i]
    hw = costmodel.calibrate("roofline", meas, combine=combine)
    pred = costmodel.step_time(r.cfg, hw, r.batch, r.kv_context, r.new_tokens, r.dtype, kv_context=r.kv_context)
    errs.append(abs(pred - r.seconds) / r.seconds)
  return np.asarray(errs)


def main(argv=None):
  ap = common.parser(__doc__, smoke=None)
  ap.add_argument("profile", help="a hardware profile JSON (its measurements are refitted)")
  ap.add_argument("out", nargs="?", default=None, help="also write the JSON here (as --output)")
  args = common.parse(ap, argv)
  compare(args.profile, args.output or args.out)


def compare(path: str, out: str | None = None) -> dict:
  """The comparison's document for the profile at `path` (printed; written to `out` if given)."""
  _, prof = profiles.load_profile(path)
  rows = calibrate.step_rows(prof["measurements"])
  stats = lambda e: {"mean": float(e.mean()), "median": float(np.median(e)), "p90": float(np.percentile(e, 90)),
                     "max": float(e.max())}
  noise = [m["median_s"] / m["seconds"] - 1 for m in prof["measurements"] if "median_s" in m]
  doc = {"profile": path, "device": prof.get("device"), "date": prof.get("date"), "steps": len(rows),
         "loadavg_during_profile": [prof.get("loadavg_start"), prof.get("loadavg_end")],
         "timing_noise_median_over_min_minus_1": float(np.median(noise)) if noise else None,
         "leave_one_out_rel_err": {"fitted_linear": stats(calibrate.holdout_errors(rows)),
                                   "roofline_sum": stats(roofline_loo(rows, "sum")),
                                   "roofline_max": stats(roofline_loo(rows, "max"))}}
  print(json.dumps(doc, indent=1))
  if out:
    common.write_json(doc, out, stamp=False)
  return doc


if __name__ == "__main__":
  main()
