"""`run.py --mode=profile_acceptance`: the draft's acceptance vector (how often the target's token is the
draft's k-th choice) on held-out Shakespeare or the user's --input prompts -> --output JSON, which plan,
calibrate and gamma=auto / tree=auto read (--acceptance_file)."""
from __future__ import annotations

import json

from absl import app

from magicdec_jax import datagen_files, textdata
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.cli import build as cli_build, draft_flags, flags as cli_flags
from magicdec_jax.sampling import Sampling
from magicdec_jax.measure import acceptance

OWN_FLAGS = ("input", "output", "chat", "width", "profile_tokens", "profile_windows")
SETTINGS_FLAGS = ("seed", "temperature", "top_k", "top_p")


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.need(fv, "output")
  cli_flags.writable_target("output", fv.output)
  if fv.input:
    cli_flags.readable_file("input", fv.input)
  if fv["draft_weights"].present and fv.draft_weights != "none":
    raise app.UsageError(f"--draft_weights={fv.draft_weights}: acceptance is profiled on the draft's network "
                         "in its own precision, not on a weight copy")
  e = draft_flags.entry(fv)
  if e is None or not e.profiles_acceptance:
    raise app.UsageError("--mode=profile_acceptance needs " + " or ".join(
        f"--draft={n}" for n in draft_flags.names(lambda e: e.profiles_acceptance)))


def _windows(fv, model, n: int) -> tuple[list[list[int]], str]:
  """(token windows of <= n tokens, their source): each --input prompt's last n tokens, else Shakespeare."""
  if not fv.input:
    return textdata.shakespeare_prompts(model.tokenizer, fv.profile_windows, n, held_out=True), \
        "shakespeare (held out)"
  windows = []
  for p in cli_build.read_prompts_file(fv.input, "input"):
    ids = tok_lib.encode(model.tokenizer, cli_build.prompt_text(fv, model, p))[-n:]
    if len(ids) >= 32:
      windows.append(ids)
  if not windows:
    raise app.UsageError(f"--input={fv.input}: no prompt has >= 32 tokens to profile on")
  return windows, fv.input


def run(fv, log) -> None:
  model = cli_build.load_target(fv, log)
  draft = cli_build.build_draft(fv, model)
  n = min(fv.profile_tokens, model.config.max_position_embeddings)
  windows, source = _windows(fv, model, n)
  log(f"profiling {len(windows)} windows ({source}) of <= {n} tokens, width {fv.width} ...")
  out = acceptance.profile(model, draft, windows, width=fv.width, seed=fv.seed,
                           sampling=Sampling(fv.temperature, fv.top_k, fv.top_p))
  out["source"] = source
  datagen_files.atomic_write(fv.output, json.dumps(out, indent=1))     # (a kill keeps the last complete file)
  print(json.dumps(out, indent=1))
