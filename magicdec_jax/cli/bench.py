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

from magicdec_jax import textdata
from magicdec_jax.tuning import sweep


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

  def save(d):
    with open(path, "w") as f:
      json.dump(d, f, indent=1, default=str)

  sweep.run(model, draft, lambda b, n: _prompts(model, b, n), batches=batches, contexts=contexts,
            gammas=gammas, max_new=max_new, max_batch_tokens=max_batch_tokens, hardware=hardware, doc=doc,
            on_point=save, log=lambda m: log(f"bench: {m}"), **gen)
  save(doc)
  plots = [sweep.plot(doc, os.path.join(output_dir, "speedup_vs_context.png"),
                      f"{model.name}: {type(draft).__name__} vs autoregressive, {doc['device']}")
           ] if doc["points"] else []
  return {"json": path, "plots": plots, "result": doc}
