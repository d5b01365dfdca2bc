"""`run.py --mode=bench`: autoregressive vs speculative over a batch x context x gamma grid -> JSON + PNGs.

Every configuration runs on real text (Shakespeare windows, one per row) with the same prompts for both
methods; with warmup each configuration is run once untimed first; either way `generate` itself reports
prefill / decode seconds without compile time (and the compile seconds of each phase apart), so timings
are steady-state.
`generate` runs decoding as one compiled while_loop, so we report prefill vs decode time; a split of draft
vs verify time inside the loop is not observable from the host (the JSON says so).
"""
from __future__ import annotations

import json
import os
import platform
import time

import jax
import numpy as np

from magicdec_jax import engine, textdata


def _prompts(model, batch: int, context: int) -> list[list[int]]:
  if model.tokenizer is not None:
    return textdata.shakespeare_prompts(model.tokenizer, batch, context)
  rng = np.random.default_rng(context)
  return rng.integers(0, model.config.vocab_size, (batch, context)).tolist()


def _timed(model, prompts, warmup: bool, **kw) -> dict:
  if warmup:
    engine.generate(model, prompts, **kw)
  s = engine.generate(model, prompts, **kw).stats
  keys = ("prefill_s", "decode_s", "new_tokens", "tokens_per_s", "verify_steps", "acceptance_rate",
          "mean_accepted_length", "per_position_acceptance", "prefill_compile_s", "decode_compile_s")
  return {k: s.get(k) for k in keys}


def run_bench(model, draft, *, batches, contexts, gammas, output_dir: str, warmup: bool = True, gen: dict,
              log=print) -> dict:
  """gen: generate() kwargs except draft/gamma/tree (max_new_tokens, sampling, seed, attention_impl)."""
  os.makedirs(output_dir, exist_ok=True)
  max_pos, max_new = model.config.max_position_embeddings, gen["max_new_tokens"]
  rows, skipped = [], []
  for context in contexts:
    if context + max_new > max_pos:
      skipped.append({"context": context, "reason": f"context + max_new_tokens > {max_pos}"})
      log(f"bench: skipping context {context} (model context {max_pos})")
      continue
    for batch in batches:
      prompts = _prompts(model, batch, context)
      log(f"bench: batch {batch}, context {context}: autoregressive ...")
      ar = _timed(model, prompts, warmup, draft=None, **gen)
      for gamma in gammas:
        log(f"bench: batch {batch}, context {context}: speculative gamma={gamma} ...")
        sp = _timed(model, prompts, warmup, draft=draft, gamma=gamma, **gen)
        rows.append({
            "batch": batch, "context": context, "gamma": gamma, "autoregressive": ar, "speculative": sp,
            "decode_speedup": sp["tokens_per_s"] / ar["tokens_per_s"],
            "end_to_end_speedup": (ar["prefill_s"] + ar["decode_s"]) / (sp["prefill_s"] + sp["decode_s"])})
        log(f"bench:   decode speedup {rows[-1]['decode_speedup']:.2f}x, acceptance {sp['acceptance_rate']:.3f}")
  result = {
      "model": model.name, "draft": repr(draft), "generate": {k: v for k, v in gen.items()},
      "device": str(jax.devices()[0].device_kind), "platform": platform.platform(),
      "warmup": warmup, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows, "skipped": skipped,
      "notes": ("decode is one compiled lax.while_loop: the time split is prefill vs decode only; draft vs "
                "verify time inside the loop is not measured. tokens_per_s = new tokens / decode seconds."),
  }
  path = os.path.join(output_dir, "bench.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=1, default=str)
  plots = plot(rows, output_dir) if rows else []
  return {"json": path, "plots": plots, "result": result}


def plot(rows: list[dict], output_dir: str) -> list[str]:
  """speedup_vs_context.png, acceptance_vs_context.png, time_split.png."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  batches = sorted({r["batch"] for r in rows})
  gammas = sorted({r["gamma"] for r in rows})
  series = [(b, g, sorted((r for r in rows if r["batch"] == b and r["gamma"] == g), key=lambda r: r["context"]))
            for b in batches for g in gammas]
  paths = []
  for name, key, ylabel in (("speedup_vs_context", "decode_speedup", "decode speedup (spec / AR tokens/s)"),
                            ("acceptance_vs_context", "acceptance", "acceptance rate")):
    fig, ax = plt.subplots(figsize=(6, 4))
    for b, g, rs in series:
      ys = [r[key] if key != "acceptance" else r["speculative"]["acceptance_rate"] for r in rs]
      ax.plot([r["context"] for r in rs], ys, marker="o", label=f"batch {b}, gamma {g}")
    if key == "decode_speedup":
      ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (prompt tokens)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(output_dir, name + ".png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
  fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) * 2), 4))
  labels, pre, dec, seen = [], [], [], set()
  for r in rows:
    runs = [(f"g{r['gamma']}", r["speculative"])]
    if (r["batch"], r["context"]) not in seen:          # the AR run is shared by every gamma
      seen.add((r["batch"], r["context"]))
      runs.insert(0, ("AR", r["autoregressive"]))
    for tag, m in runs:
      labels.append(f"b{r['batch']} c{r['context']} {tag}")
      pre.append(m["prefill_s"])
      dec.append(m["decode_s"])
  x = np.arange(len(labels))
  ax.bar(x, pre, label="prefill")
  ax.bar(x, dec, bottom=pre, label="decode (draft + verify, one compiled loop)")
  ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("seconds")
  ax.legend(fontsize=7)
  fig.tight_layout()
  paths.append(os.path.join(output_dir, "time_split.png"))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)
  return paths
