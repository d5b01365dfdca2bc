"""magicdec_jax command line: the demo (no flags), generate, bench, datagen, convert, plan, profile_acceptance,
distill, calibrate (one module each under magicdec_jax/cli/, registered in cli/modes.py).

  python run.py                                   # SmolLM2-135M: autoregressive vs MagicDec on Shakespeare
  python run.py --mode=generate --prompt="To be, or not to be" --draft=streaming --gamma=3
  python run.py --mode=datagen --input=prompts.jsonl --output=out.jsonl --batch_size=8
  python run.py --mode=distill --distill_data=out.jsonl --distill_out=draft --draft_layers=8
  python run.py --mode=distill --draft=feature --distill_data=text.txt --distill_out=head
  python run.py --mode=generate --draft=feature --draft_model=head --prompt="To be, or not to be"
  python run.py --mode=bench --bench_preset=long_context  # where MagicDec wins: AR vs gamma over batch x context
  python run.py --mode=calibrate --output=profile.json   # measure this device -> hardware profile
  python run.py --mode=plan --hardware=profile.json      # plan with it (datasheet column beside)
  python run.py --helpfull                        # every flag

Flags are validated (magicdec_jax/cli/flags.py, then the mode's module) before any model is loaded;
progress goes to stderr, results (generated text, tables, summaries) to stdout.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time

import jax
from absl import app, flags
from absl import logging as absl_logging

from magicdec_jax import compile as compiling
from magicdec_jax.cli import build as cli_build, flags as cli_flags, modes
from magicdec_jax.sharding import distributed
from magicdec_jax.sharding.planner import DoesNotFit

FLAGS = modes.define_flags(flags.FLAGS)
flags.adopt_module_key_flags(cli_flags)   # --help lists them


def log(msg: str):
  if FLAGS.progress:
    print(f"[magicdec {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv):
  """Run --mode; a bad flag, input or request ends the process with its one-line reason (exit 1; a model
  that does not fit: exit 2) instead of absl's full help or a traceback (--verbosity=1 shows the traceback)."""
  try:
    run_mode(argv)
  except (app.UsageError, ValueError) as e:
    if FLAGS.verbosity >= 1:
      raise
    print(f"magicdec: {e}", file=sys.stderr)
    if not isinstance(e, DoesNotFit):         # refused before compiling: the figures say why
      print("(python run.py --helpfull lists every flag; --verbosity=1 shows the traceback)", file=sys.stderr)
    sys.exit(2 if isinstance(e, DoesNotFit) else 1)


def run_mode(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]} (flags need --name=value)")
  if not FLAGS["verbosity"].present:          # absl's default verbosity shows jax's and orbax's INFO chatter
    logging.getLogger("jax").setLevel(logging.WARNING)
    absl_logging.set_verbosity(absl_logging.WARNING)
  modes.validate(FLAGS)
  t = time.perf_counter()
  if FLAGS.num_processes > 1:                 # before anything touches a device
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    log(f"jax.distributed: process {FLAGS.process_id} of {FLAGS.num_processes}")
  cache_dir = compiling.enable_persistent_cache(FLAGS.compilation_cache_dir)   # None: the env var / default
  log(f"persistent compilation cache: {cache_dir or 'off'}")
  mesh = cli_build.setup_mesh(FLAGS)          # None without --mesh
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    modes.MODES[FLAGS.mode].run(FLAGS, log)
  log(f"--mode={FLAGS.mode} done in {time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
  app.run(main)
