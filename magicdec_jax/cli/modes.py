"""The --mode registry: each name's module (cli/<name>.py) has `validate(fv)`, its own cross-flag checks,
and `run(fv, log)`, and may list in `OWN_FLAGS` the flags only some modes read (that mode and any other
listing them; `validate` refuses them elsewhere) and in `SETTINGS_FLAGS` the decoding-settings flags it reads
(`cli_flags.DECODE_FLAGS`: the others are refused). A new mode is a module with those and one line in MODES;
`define_flags` gives the `--mode` enum these names, `validate` runs the checks common to every mode, then
the mode's own."""
from __future__ import annotations

from absl import app, flags

from magicdec_jax.cli import (bench, calibrate, convert, datagen, demo, distill, generate, plan,
                              profile_acceptance)
from magicdec_jax.cli import flags as cli_flags

MODES = {
    "demo": demo,                              # the default: AR vs MagicDec where MagicDec wins
    "generate": generate,
    "bench": bench,
    "datagen": datagen,
    "convert": convert,
    "plan": plan,
    "profile_acceptance": profile_acceptance,
    "distill": distill,
    "calibrate": calibrate,
}


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> flags.FlagValues:
  """Every flag of run.py into `fv` (run.py: the global FLAGS; tests: a fresh FlagValues)."""
  return cli_flags.define_flags(fv, tuple(MODES))


def flag_modes() -> dict[str, tuple[str, ...]]:
  """Each flag only some modes read -> those modes (their modules' OWN_FLAGS)."""
  out: dict[str, tuple[str, ...]] = {}
  for name, module in MODES.items():
    for flag in getattr(module, "OWN_FLAGS", ()):
      out[flag] = out.get(flag, ()) + (name,)
  return out


def validate(fv) -> None:
  """All of --mode's checks (app.UsageError naming the flag), before any model is loaded: a flag given to a
  mode that does not read it is refused, not ignored."""
  readers_of = flag_modes()
  for flag in cli_flags.DECODE_FLAGS:
    readers_of[flag] = tuple(name for name, m in MODES.items() if flag in getattr(m, "SETTINGS_FLAGS", ()))
  for flag, readers in readers_of.items():
    if fv[flag].present and fv.mode not in readers:
      raise app.UsageError(f"--{flag} is for --mode={'|'.join(readers)}, not --mode={fv.mode} (which would "
                           "ignore it)")
  cli_flags.validate(fv)
  MODES[fv.mode].validate(fv)
