"""CLI: `python -m checkpoints_convert --src SRC --dst DST [--dtype float32|bfloat16]`.

SRC is anything `load_model` accepts (an HF dir, a .gguf file, an orbax dir, or a built-in name such as
smollm2-135m); DST is the orbax directory to write. Prints a JSON summary; exits 2 on a refused input. Flags are
absl flags, as every launch script's (run.py): defined into any `FlagValues` (`define_flags`; the command
line uses the global FLAGS, `main(argv)` a fresh one).
"""
from __future__ import annotations

import json
import sys

from absl import app, flags

from magicdec_jax.checkpoints import convert

DTYPES = ("float32", "bfloat16")


def define_flags(fv: flags.FlagValues) -> flags.FlagValues:
  """--src, --dst (both required) and --dtype, defined into `fv`."""
  flags.DEFINE_string("src", None, "HF model dir, .gguf file, orbax dir or a built-in name", flag_values=fv)
  flags.DEFINE_string("dst", None, "output orbax directory", flag_values=fv)
  flags.DEFINE_enum("dtype", "float32", DTYPES, "dtype of the written weights", flag_values=fv)
  flags.mark_flags_as_required(["src", "dst"], flag_values=fv)
  return fv


def run(fv: flags.FlagValues) -> int:
  """Convert as the parsed flags say: 0, or 2 (the error on stderr) where the input is refused."""
  try:
    summary = convert(fv.src, fv.dst, fv.dtype)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(summary))
  return 0


def main(argv=None) -> int:
  """The command line `argv` (without the program name; None: sys.argv's) parsed into a fresh FlagValues
  and run: 0, or 2 on bad flags or a refused input."""
  fv = define_flags(flags.FlagValues())
  args = sys.argv[1:] if argv is None else list(argv)
  try:
    rest = fv(["checkpoints_convert", *args])
  except flags.Error as e:
    print(f"error: {e}\n\n{__doc__}\n{fv.get_help()}", file=sys.stderr)
    return 2
  if len(rest) > 1:
    print(f"error: unexpected arguments {rest[1:]}", file=sys.stderr)
    return 2
  return run(fv)


def _app_main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  return run(flags.FLAGS)


if __name__ == "__main__":
  define_flags(flags.FLAGS)
  app.run(_app_main)
