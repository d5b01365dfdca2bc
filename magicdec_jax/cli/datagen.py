"""`run.py --mode=datagen`: --input JSONL -> --output JSONL, resumable (datagen.py); with jax.distributed
each process writes its shard and process 0 merges them. The summary goes to stdout."""
from __future__ import annotations

import json
import os

import jax
from absl import app

from magicdec_jax import datagen, datagen_files
from magicdec_jax.cli import build as cli_build, flags as cli_flags
from magicdec_jax.sharding import distributed

OWN_FLAGS = ("input", "output", "batch_size", "refill_at", "num_samples_per_prompt", "on_error", "input_format",
             "truncate", "chat", "mesh", "device_memory_gb")
SETTINGS_FLAGS = cli_flags.DECODE_FLAGS      # (decode_settings)


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.validate_acceptance_file(fv)
  cli_flags.need(fv, "input", "output")
  cli_flags.readable_file("input", fv.input)
  cli_flags.writable_target("output", fv.output)
  if fv.refill_at > fv.batch_size:
    raise app.UsageError(f"--refill_at={fv.refill_at} is larger than --batch_size={fv.batch_size}")
  if os.path.abspath(fv.input) == os.path.abspath(fv.output):
    raise app.UsageError("--input and --output are the same file")


def run(fv, log) -> None:
  model = cli_build.load_target(fv, log)
  kw = cli_build.gen_kwargs(fv, model)
  index, count = jax.process_index(), jax.process_count()
  try:
    summary = datagen.run(model, fv.input, fv.output, batch_size=fv.batch_size, refill_at=fv.refill_at,
                          num_samples=fv.num_samples_per_prompt, on_error=fv.on_error, truncate=fv.truncate,
                          chat=fv.chat, progress=fv.progress, process_index=index, process_count=count,
                          input_format=fv.input_format, **kw)
    if count > 1:        # every process has written its shard; process 0 merges them into --output
      distributed.barrier("datagen-shards-written")
      if index == 0:
        summary = dict(datagen_files.merge_shards(fv.output, fv.input, count), this_process=summary)
      distributed.barrier("datagen-merged")
  except datagen.DatagenError as e:
    raise app.UsageError(f"datagen: {e}") from None
  print(json.dumps(summary, indent=1))
