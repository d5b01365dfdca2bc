"""CLI: `python -m checkpoints_convert --src SRC --dst DST [--dtype float32|bfloat16]`.

SRC is anything `load_model` accepts (an HF dir, a .gguf file, an orbax dir, or a built-in name such as
smollm2-135m); DST is the orbax directory to write. Prints a JSON summary; exits 2 on a bad input.
"""
from __future__ import annotations

import argparse
import json
import sys

from magicdec_jax.checkpoints import convert


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m checkpoints_convert", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--src", required=True, help="HF model dir, .gguf file, orbax dir or a built-in name")
  ap.add_argument("--dst", required=True, help="output orbax directory")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  args = ap.parse_args(argv)
  try:
    summary = convert(args.src, args.dst, args.dtype)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  sys.exit(main())
