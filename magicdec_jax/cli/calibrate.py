"""`run.py --mode=calibrate`: time this device's AR, verify and draft steps over a grid, fit the cost model's
step-time coefficients, and write the hardware profile JSON (--output) that --hardware accepts."""
from __future__ import annotations

import json

from absl import app

from magicdec_jax.cli import build as cli_build, flags as cli_flags
from magicdec_jax.measure import calibrate
from magicdec_jax.tuning import profiles

OWN_FLAGS = ("batches", "contexts", "output", "calibrate_repeats", "calibrate_tokens", "calibrate_draft_tokens",
             "calibrate_passes")
SETTINGS_FLAGS = ("acceptance_file",)

# drafts with no step of their own through model.forward (calibrate.cases_for), and how they are priced
UNTIMED_DRAFTS = {"none": "no draft", "lookup": "a prompt lookup runs no network: its step is priced at zero",
                  "feature": "a feature head's step is priced by the target's fitted step time at the head's "
                             "shape"}


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.validate_acceptance_file(fv)
  cli_flags.need(fv, "output")
  cli_flags.writable_target("output", fv.output)
  for name in ("batches", "contexts", "calibrate_tokens", "calibrate_draft_tokens"):
    cli_flags.int_list(fv, name, 1)
  if fv["calibrate_draft_tokens"].present and fv.draft in UNTIMED_DRAFTS:
    raise app.UsageError(f"--calibrate_draft_tokens times a draft's steps through the model's forward; "
                         f"--draft={fv.draft} has none to time ({UNTIMED_DRAFTS[fv.draft]})")


def run(fv, log) -> None:
  model = cli_build.load_target(fv, log)
  if fv["contexts"].present and max(cli_flags.int_list(fv, "contexts", 1)) > model.config.max_position_embeddings:
    raise app.UsageError(f"--contexts={','.join(fv.contexts)}: longer than {model.name}'s context of "
                         f"{model.config.max_position_embeddings} tokens (a step there is never run)")
  d = cli_build.build_draft(fv, model)
  under_test = [] if d is None else calibrate.cases_for(d, model)
  if d is not None and not under_test:
    log(f"calibrate: no draft step timed: {UNTIMED_DRAFTS.get(fv.draft, 'the draft runs no network')}")
  kw = {name: cli_flags.int_list(fv, name, 1) for name in ("batches", "contexts") if fv[name].present}
  kw["tokens"] = cli_flags.int_list(fv, "calibrate_tokens", 1)
  kw["draft_tokens"] = cli_flags.int_list(fv, "calibrate_draft_tokens", 1)
  vec = cli_flags.load_acceptance_vector(fv.acceptance_file) if fv.acceptance_file else None
  prof = calibrate.calibrate(model.params, model.config, drafts=under_test, model_name=model.name,
                             repeats=fv.calibrate_repeats, passes=fv.calibrate_passes,
                             acceptance_vector=vec, log=log, **kw)
  profiles.save_profile(prof, fv.output)
  fit = prof["fit"]
  ho = fit["holdout_rel_err"] or {}
  print(json.dumps({"profile": fv.output, "device": prof["device"], "measured_steps": len(prof["measurements"]),
                    "seconds": round(prof["total_s"], 1), "coef": dict(zip(fit["features"], fit["coef"])),
                    "train_rel_err": fit["train_rel_err"], "holdout_rel_err": ho}, indent=1))
