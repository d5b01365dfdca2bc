"""Where does MagicDec start to win? Decode and end-to-end throughput of AR vs StreamingDraft over context x batch.

SmolLM2-135M on held-out Shakespeare, greedy. For each batch and context (ascending) the prompts are prefilled
**once** (magicdec_jax/prefilled.py) and decoded autoregressively and with each gamma from copies of the same
caches. Recorded per point: decode tokens/s, end-to-end tokens/s (new tokens / (prefill + decode)), acceptance,
mean accepted length, identical-to-AR flag, best gamma. Per batch: the measured crossover (the smallest measured
context from which the best decode speedup stays above 1) next to the cost model's predictions, labelled as such:
the context where its predicted speedup of the best gamma first exceeds 1 (at the acceptance measured there) and
its S_inflection (costmodel.s_inflection: where the speedup starts to grow with batch). JSON (rewritten after
every point, so an interrupted run keeps what it measured) + PNG (speedup vs context per batch).

  python benchmarks/context_sweep.py --batches 1,4,8 --contexts 1024,2048,4096,8000 --budget-min 30
  python benchmarks/context_sweep.py --profile my_cpu_profile.json      # predictions from a calibrated profile
  python benchmarks/context_sweep.py --smoke                             # random tiny model (seconds)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import matplotlib  # noqa: E402
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import StreamingDraft, autotune, cli_flags, costmodel, prefilled, textdata  # noqa: E402


def prompts_for(model, batch: int, context: int) -> list[list[int]]:
  if model.tokenizer is not None:
    return textdata.shakespeare_prompts(model.tokenizer, batch, context, held_out=True)
  rng = np.random.default_rng(context)
  return rng.integers(0, model.config.vocab_size, (batch, context)).tolist()


def measure_point(model, batch: int, context: int, gammas, draft, max_new: int) -> dict:
  pre = prefilled.prefill(model, prompts_for(model, batch, context), max_new_tokens=max_new, progress=False)
  ar = prefilled.decode(model, pre)
  point = {"batch": batch, "context": context, "prefill_s": pre.prefill_s,
           "prefill_tok_s": batch * context / pre.prefill_s, "ar": _figures(ar.stats, pre.prefill_s), "spec": []}
  for g in gammas:
    r = prefilled.decode(model, pre, draft=draft, gamma=g)
    f = _figures(r.stats, pre.prefill_s)
    f.update(gamma=g, identical_to_ar=r.tokens == ar.tokens,
             decode_speedup=f["decode_tok_s"] / point["ar"]["decode_tok_s"],
             e2e_speedup=f["e2e_tok_s"] / point["ar"]["e2e_tok_s"])
    point["spec"].append(f)
  best = max(point["spec"], key=lambda f: f["decode_speedup"])
  point["best_gamma"], point["best_decode_speedup"] = best["gamma"], best["decode_speedup"]
  point["best_e2e_speedup"] = best["e2e_speedup"]
  return point


def _figures(stats: dict, prefill_s: float) -> dict:
  return {"decode_tok_s": stats["tokens_per_s"], "decode_s": stats["decode_s"], "new_tokens": stats["new_tokens"],
          "e2e_tok_s": stats["new_tokens"] / (prefill_s + stats["decode_s"]),
          "acceptance_rate": stats["acceptance_rate"], "mean_accepted_length": stats["mean_accepted_length"],
          "decode_compile_s": stats["decode_compile_s"]}


def measured_crossover(points: list[dict]) -> int | None:
  """Smallest measured context from which every larger measured context has best decode speedup > 1."""
  ctxs = sorted(points, key=lambda p: p["context"])
  out = None
  for p in reversed(ctxs):
    if p["best_decode_speedup"] > 1:
      out = p["context"]
    else:
      break
  return out


def predicted(model, hw, draft_cost, batch: int, points: list[dict], gammas) -> dict:
  """The cost model's view (a prediction): crossover context at this batch and S_inflection per gamma."""
  cfg = model.config
  accs = [f["acceptance_rate"] for p in points for f in p["spec"] if f["acceptance_rate"] is not None]
  alpha = float(np.mean(accs)) if accs else 0.8
  dtype = cfg.dtype
  best = lambda n: max(costmodel.predicted_speedup(cfg, hw, draft_cost, batch, n, gamma=g, alpha=alpha, dtype=dtype)
                       for g in gammas)
  grid = [int(n) for n in np.unique(np.round(np.geomspace(128, cfg.max_position_embeddings, 96)))]
  cross = next((n for n in grid if best(n) > 1), None)
  s_infl = {str(g): costmodel.s_inflection(cfg, hw, draft_cost, g, alpha, dtype=dtype,
                                           n_max=cfg.max_position_embeddings * 16) for g in gammas}
  return {"label": "predicted by the cost model", "hardware": getattr(hw, "name", str(hw)), "alpha": alpha,
          "crossover_context": cross, "s_inflection": s_infl}


def plot(doc: dict, path: str):
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for b in sorted({p["batch"] for p in doc["points"]}):
    pts = sorted((p for p in doc["points"] if p["batch"] == b), key=lambda p: p["context"])
    x = [p["context"] for p in pts]
    axes[0].plot(x, [p["best_decode_speedup"] for p in pts], "o-", label=f"batch {b}")
    axes[1].plot(x, [p["best_e2e_speedup"] for p in pts], "o-", label=f"batch {b}")
  for ax, title in zip(axes, ("decode speedup (best gamma) vs AR", "end-to-end (prefill + decode) speedup")):
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (prompt tokens)")
    ax.set_title(title)
    ax.legend()
  fig.suptitle(f"MagicDec StreamingDraft vs autoregressive, {doc['model']}, {doc['env']['device']}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batches", type=common.int_list, default=[1, 4, 8])
  ap.add_argument("--contexts", type=common.int_list, default=[1024, 2048, 4096, 8000])
  ap.add_argument("--gammas", type=common.int_list, default=[2, 3])
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--max-batch-tokens", type=int, default=40000,
                  help="skip points with batch x context above this (prefill time)")
  ap.add_argument("--profile", default=None, help="hardware profile JSON for the predictions (default: nominal)")
  ap.add_argument("--budget-min", type=float, default=30.0, help="start no new point after this many minutes")
  ap.add_argument("--output", default=None)
  ap.add_argument("--smoke", action="store_true", help="random tiny model, tiny shapes (checks the script)")
  args = ap.parse_args(argv)
  if args.smoke:
    args.batches, args.contexts, args.gammas, args.max_new, args.window = [1, 2], [64, 128], [2], 8, 16
    model, source = cli_flags.random_tiny_model(0), "random-tiny"
  else:
    model, source = common.load_smollm(allow_random=False)
  out = args.output or str(common.RESULTS_DIR / f"context_sweep_{common.device_tag()}.json")
  draft = StreamingDraft(args.sink, args.window)
  hw = autotune.detect_hardware(args.profile)
  doc = {"benchmark": "context_sweep", "env": common.env_info(), "model": source, "dtype": model.config.dtype,
         "draft": {"kind": "StreamingDraft", "sink": args.sink, "window": args.window}, "greedy": True,
         "max_new_tokens": args.max_new, "gammas": args.gammas, "points": [], "crossover": {}}
  t0 = time.time()
  for b in args.batches:
    for n in sorted(args.contexts):
      if b * n > args.max_batch_tokens:
        print(f"skip {b}x{n}: above --max-batch-tokens", flush=True)
        continue
      if (time.time() - t0) / 60 > args.budget_min:
        print(f"budget of {args.budget_min} min spent: stopping before {b}x{n}", flush=True)
        break
      p = measure_point(model, b, n, args.gammas, draft, args.max_new)
      doc["points"].append(p)
      pts = [q for q in doc["points"] if q["batch"] == b]
      doc["crossover"][str(b)] = {"measured": measured_crossover(pts),
                                  **predicted(model, hw, autotune.cost_draft(draft), b, pts, args.gammas)}
      doc["env"]["loadavg_end"] = list(os.getloadavg())
      doc["elapsed_s"] = time.time() - t0
      with open(out, "w") as f:
        json.dump(doc, f, indent=1)
      print(f"{b}x{n}: prefill {p['prefill_tok_s']:.0f} tok/s; AR {p['ar']['decode_tok_s']:.1f} tok/s; best gamma "
            f"{p['best_gamma']}: decode {p['best_decode_speedup']:.2f}x, end-to-end {p['best_e2e_speedup']:.3f}x, "
            f"acceptance {[round(f['acceptance_rate'], 3) for f in p['spec']]}, identical "
            f"{all(f['identical_to_ar'] for f in p['spec'])}", flush=True)
  png = out.replace(".json", ".png")
  if doc["points"]:
    plot(doc, png)
  print(json.dumps({"output": out, "png": png, "crossover": doc["crossover"]}, indent=1))


if __name__ == "__main__":
  main()
