"""`run.py --mode=bench`: autoregressive vs speculative over a batch x context x gamma grid -> JSON + PNG.

The measurement is sweep.py: each (batch, context) point is prefilled once and decoded autoregressively and
with every gamma from copies of the same caches, on real text (Shakespeare windows, one per row), so both
methods see identical prompts and K/V. Decode seconds exclude compilation (compile seconds are recorded
apart), so no warm-up run is needed. `--bench_preset=long_context` is the README's long-context sweep
(sweep.LONG_CONTEXT). Decoding is one compiled while_loop: the time split is prefill vs decode, draft vs
verify time inside the loop is not observable from the host (the JSON says so).
"""
from __future__ import annotations

import json
import os
import platform
import time

import jax
import numpy as np
from absl import app

from magicdec_jax import datagen_files, settings, textdata
from magicdec_jax.cli import build as cli_build, flags as cli_flags
from magicdec_jax.measure import sweep

OWN_FLAGS = ("batches", "contexts", "gammas", "output_dir", "bench_preset")
# the decoding flags run_bench passes on (each point's chains come from --gammas; --hardware prices the
# predicted crossover); the others are refused, not ignored
SETTINGS_FLAGS = ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "attention_impl", "hardware")

GRID = (("batches", 1), ("contexts", 16), ("gammas", 1))    # the grid's list flags and their least values


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  for name, low in GRID:
    cli_flags.int_list(fv, name, low)
  cli_flags.refuse_no_draft(fv, "compares against a draft")
  gammas = cli_flags.int_list(fv, "gammas", 1)
  for g in gammas:
    if not cli_flags.gamma_ok(str(g)):
      raise app.UsageError(f"--gammas={','.join(fv.gammas)}: {g} is not in [1, {settings.MAX_GAMMA}]")
  cli_flags.check_fixed_depth(fv, f"--gammas={','.join(fv.gammas)}", max(gammas), None)
  cli_flags.writable_dir("output_dir", fv.output_dir)

def run(fv, log) -> None:
  """The grid from the flags (or --bench_preset, for the flags not given) -> run_bench; prints the paths."""
  preset = sweep.LONG_CONTEXT if fv.bench_preset == "long_context" else {}
  if preset and not fv["window"].present:
    fv.window = preset["window"]
  if preset and not fv["max_new_tokens"].present:
    fv.max_new_tokens = preset["max_new_tokens"]
  grid = {name: (cli_flags.int_list(fv, name, low) if fv[name].present or not preset else list(preset[name]))
          for name, low in GRID}
  model = cli_build.load_target(fv, log)
  st = cli_build.decode_settings(fv, model, priced=False)
  out = run_bench(
      model, st.draft, **grid, output_dir=fv.output_dir, log=log, hardware=fv.hardware,
      max_batch_tokens=preset.get("max_batch_tokens"),
      gen=dict(max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_k=st.top_k, top_p=st.top_p,
               seed=st.seed, attention_impl=st.attention_impl, numerics=st.numerics))
  if not out["result"]["points"]:
    raise app.UsageError(f"--mode=bench measured no point: every (batch, context) of the grid was skipped "
                         f"(the log says why); {out['json']} lists none")
  print(json.dumps({"json": out["json"], "plots": out["plots"]}, indent=1))


def _prompts(model, batch: int, context: int) -> list[list[int]]:
  if model.tokenizer is not None:
    return textdata.shakespeare_prompts(model.tokenizer, batch, context)
  rng = np.random.default_rng(context)
  return rng.integers(0, model.config.vocab_size, (batch, context)).tolist()


def run_bench(model, draft, *, batches, contexts, gammas, output_dir: str, gen: dict,
              max_batch_tokens: int | None = None, hardware=None, log=print) -> dict:
  """gen: sampling kwargs of prefilled.decode (temperature, top_k, top_p, seed, eos_token_id) and
  max_new_tokens. Writes OUTPUT_DIR/bench.json and speedup_vs_context.png."""
  os.makedirs(output_dir, exist_ok=True)
  gen = dict(gen)
  max_new = gen.pop("max_new_tokens")
  path = os.path.join(output_dir, "bench.json")
  doc = {"model": model.name, "draft": repr(draft), "max_new_tokens": max_new, "sampling": gen,
         "gammas": list(gammas), "device": str(jax.devices()[0].device_kind), "platform": platform.platform(),
         "jax_version": jax.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
         "notes": ("each point is prefilled once; AR and every gamma decode from copies of the same caches. "
                   "Decoding is one compiled lax.while_loop: the time split is prefill vs decode only; draft vs "
                   "verify time inside the loop is not measured. decode_tok_s = new tokens / decode seconds "
                   "(compilation excluded); e2e_tok_s = new tokens / (prefill + decode seconds).")}

  def save(d):                          # (whole or not at all: a kill keeps the last complete file)
    datagen_files.atomic_write(path, json.dumps(d, indent=1, default=str))

  sweep.run(model, draft, lambda b, n: _prompts(model, b, n), batches=batches, contexts=contexts,
            gammas=gammas, max_new=max_new, max_batch_tokens=max_batch_tokens, hardware=hardware, doc=doc,
            on_point=save, log=lambda m: log(f"bench: {m}"), **gen)
  save(doc)
  png = os.path.join(output_dir, "speedup_vs_context.png")
  if not doc["points"] and os.path.exists(png):
    os.remove(png)                       # (an earlier run's figure beside a file of no points)
  plots = [sweep.plot(doc, png, f"{model.name}: {type(draft).__name__} vs autoregressive, {doc['device']}")
           ] if doc["points"] else []
  return {"json": path, "plots": plots, "result": doc}
