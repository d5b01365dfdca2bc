"""CLI: `python -m magicdec_jax.checkpoints_convert SRC DST [--dtype float32|bfloat16]`."""
from __future__ import annotations

import argparse
import json
import sys

from magicdec_jax.checkpoints_convert import convert


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m magicdec_jax.checkpoints_convert", description=__doc__)
  ap.add_argument("src", help="HF model dir, .gguf file, or a built-in name such as smollm2-135m")
  ap.add_argument("dst", help="output orbax directory")
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
