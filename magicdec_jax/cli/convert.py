"""`run.py --mode=convert`: a checkpoint (--src: HF dir, .gguf, name) -> an orbax directory (--dst)."""
from __future__ import annotations

import json

from magicdec_jax import checkpoints
from magicdec_jax.cli import flags as cli_flags

OWN_FLAGS = ("src", "dst")
# the run-wide flags a conversion has no use for: one process writes the files, nothing compiles, no bar
RUN_FLAGS = ("coordinator_address", "num_processes", "process_id", "compilation_cache_dir", "progress")


def validate(fv) -> None:
  cli_flags.refuse_flags(fv, ("model",) + cli_flags.DRAFT_FLAGS + RUN_FLAGS, "it converts --src into --dst")
  cli_flags.need(fv, "src", "dst")


def run(fv, log) -> None:
  log(f"converting {fv.src} -> {fv.dst} (orbax) ...")
  print(json.dumps(checkpoints.convert(fv.src, fv.dst)))
