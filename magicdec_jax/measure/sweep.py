"""Where does MagicDec start to win? AR vs speculative decoding over a batch x context grid.

For each batch and context (ascending) the prompts are prefilled **once** (prefilled.py) and decoded
autoregressively and with each gamma from copies of the same caches, so every method sees identical K/V and
the (long) prefill is paid once per point. Recorded per point: decode tokens/s, end-to-end tokens/s (new
tokens / (prefill + decode)), acceptance, mean accepted length, identical-to-AR flag (greedy), best gamma.
Per batch: the measured crossover (the smallest measured context from which the best decode speedup stays
above 1) next to the cost model's predictions, labelled as such: the context where its predicted speedup of
the best gamma first exceeds 1 (at the acceptance measured) and its S_inflection (costmodel.s_inflection).

Used by `run.py --mode=bench` (cli/bench.py, `--bench_preset=long_context`) and
`benchmarks/decode/context_sweep.py` (the recorded results and figure).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import numpy as np

from magicdec_jax import prefilled
from magicdec_jax.tuning import autotune, costmodel
from magicdec_jax.model import Model

# run.py --bench_preset=long_context: the sweep the README's figure comes from (CPU: ~25 min; docs/measurements.md)
LONG_CONTEXT = {"batches": (8, 4, 1), "contexts": (1024, 2048, 4096, 8000), "gammas": (2, 3), "window": 256,
                "max_new_tokens": 64, "max_batch_tokens": 33000}


def _figures(stats: dict, prefill_s: float) -> dict:
  return {"decode_tok_s": stats["tokens_per_s"], "decode_s": stats["decode_s"], "new_tokens": stats["new_tokens"],
          "e2e_tok_s": stats["new_tokens"] / (prefill_s + stats["decode_s"]),
          "acceptance_rate": stats["acceptance_rate"], "mean_accepted_length": stats["mean_accepted_length"],
          "decode_compile_s": stats["decode_compile_s"]}


def measure_point(model: Model, prompts, draft, gammas: Sequence[int], max_new: int, *,
                  progress: bool = False, **decode_kw) -> dict:
  """Prefill `prompts` once; decode AR and each gamma from copies of the caches -> one point's figures.
  decode_kw: sampling arguments of prefilled.decode (temperature, top_k, top_p, seed, eos_token_id)."""
  pre = prefilled.prefill(model, prompts, max_new_tokens=max_new, progress=progress,
                          numerics=decode_kw.get("numerics"), attention_impl=decode_kw.get("attention_impl", "auto"))
  ar = prefilled.decode(model, pre, **decode_kw)
  point = {"batch": len(prompts), "context": max(len(p) for p in prompts), "prefill_s": pre.prefill_s,
           "prefill_tok_s": sum(len(p) for p in prompts) / pre.prefill_s, "ar": _figures(ar.stats, pre.prefill_s),
           "spec": []}
  for g in gammas:
    r = prefilled.decode(model, pre, draft=draft, gamma=g, **decode_kw)
    f = _figures(r.stats, pre.prefill_s)
    f.update(gamma=g, identical_to_ar=r.tokens == ar.tokens,
             decode_speedup=f["decode_tok_s"] / point["ar"]["decode_tok_s"],
             e2e_speedup=f["e2e_tok_s"] / point["ar"]["e2e_tok_s"])
    point["spec"].append(f)
  best = max(point["spec"], key=lambda f: f["decode_speedup"])
  point["best_gamma"], point["best_decode_speedup"] = best["gamma"], best["decode_speedup"]
  point["best_e2e_speedup"] = best["e2e_speedup"]
  return point


def measured_crossover(points: list[dict]) -> int | None:
  """Smallest measured context from which every larger measured context has best decode speedup > 1."""
  out = None
  for p in sorted(points, key=lambda p: p["context"], reverse=True):
    if p["best_decode_speedup"] <= 1:
      break
    out = p["context"]
  return out


def predicted_crossover(model: Model, hw, draft_cost, batch: int, points: list[dict], gammas,
                        new_tokens: int | None = None) -> dict:
  """The cost model's view (a prediction): crossover context at this batch and S_inflection per gamma, at
  the mean acceptance measured in `points`; new_tokens: the speedups priced with the fixed batch's tail
  over that many new tokens (batch_tail), as the sweep measures them."""
  cfg = model.config
  accs = [f["acceptance_rate"] for p in points for f in p["spec"] if f["acceptance_rate"] is not None]
  alpha = float(np.mean(accs)) if accs else 0.8
  best = lambda n: max(costmodel.predicted_speedup(cfg, hw, draft_cost, batch, n, gamma=g, alpha=alpha,
                                                   dtype=cfg.dtype, new_tokens=new_tokens) for g in gammas)
  grid = [int(n) for n in np.unique(np.round(np.geomspace(128, cfg.max_position_embeddings, 96)))]
  cross = next((n for n in grid if best(n) > 1), None)
  s_infl = {str(g): costmodel.s_inflection(cfg, hw, draft_cost, g, alpha, dtype=cfg.dtype,
                                           n_max=cfg.max_position_embeddings * 16) for g in gammas}
  return {"label": "predicted by the cost model", "hardware": getattr(hw, "name", str(hw)), "alpha": alpha,
          "crossover_context": cross, "s_inflection": s_infl, "tail_new_tokens": new_tokens}


def run(model: Model, draft, prompts_for: Callable[[int, int], list], *, batches: Sequence[int],
        contexts: Sequence[int], gammas: Sequence[int], max_new: int, max_batch_tokens: int | None = None,
        budget_min: float | None = None, hardware=None, doc: dict | None = None,
        on_point: Callable[[dict], None] | None = None, log=print, **decode_kw) -> dict:
  """Measure the grid (batch-major, contexts ascending) into `doc` ("points", "crossover", "skipped"):
  `prompts_for(batch, context)` gives the prompts; points above max_batch_tokens (batch x context) are
  skipped; no point starts after budget_min minutes; on_point(doc) runs after every point (saving)."""
  doc = {} if doc is None else doc
  doc.setdefault("points", [])
  doc.setdefault("crossover", {})
  doc.setdefault("skipped", [])
  hw, draft_cost = autotune.detect_hardware(hardware), autotune.cost_draft(draft)
  limit = model.config.max_position_embeddings
  t0 = time.time()
  for b in batches:
    for n in sorted(contexts):
      if n + max_new > limit:
        reason = f"context + max_new_tokens > the model's {limit}"
      elif max_batch_tokens is not None and b * n > max_batch_tokens:
        reason = f"batch x context above max_batch_tokens={max_batch_tokens}"
      elif budget_min is not None and (time.time() - t0) / 60 > budget_min:
        reason = f"time budget of {budget_min} min spent"
      else:
        reason = None
      if reason:
        doc["skipped"].append({"batch": b, "context": n, "reason": reason})
        log(f"skip {b} x {n}: {reason}")
        continue
      p = measure_point(model, prompts_for(b, n), draft, gammas, max_new, **decode_kw)
      doc["points"].append(p)
      pts = [q for q in doc["points"] if q["batch"] == b]
      doc["crossover"][str(b)] = {"measured": measured_crossover(pts),
                                  **predicted_crossover(model, hw, draft_cost, b, pts, gammas, max_new)}
      doc["elapsed_s"] = time.time() - t0
      log(f"{b} x {n}: prefill {p['prefill_tok_s']:.0f} tok/s; AR {p['ar']['decode_tok_s']:.1f} tok/s; best "
          f"gamma {p['best_gamma']}: decode {p['best_decode_speedup']:.2f}x, end-to-end "
          f"{p['best_e2e_speedup']:.3f}x; acceptance {[round(f['acceptance_rate'], 3) for f in p['spec']]}; "
          f"identical {all(f['identical_to_ar'] for f in p['spec'])}")
      if on_point is not None:
        on_point(doc)
  return doc


def plot(doc: dict, path: str, title: str) -> str:
  """Best-gamma decode and end-to-end speedup vs context, one line per batch (the paper's figure)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for b in sorted({p["batch"] for p in doc["points"]}):
    pts = sorted((p for p in doc["points"] if p["batch"] == b), key=lambda p: p["context"])
    x = [p["context"] for p in pts]
    axes[0].plot(x, [p["best_decode_speedup"] for p in pts], "o-", label=f"batch {b}")
    axes[1].plot(x, [p["best_e2e_speedup"] for p in pts], "o-", label=f"batch {b}")
  for ax, name in zip(axes, ("decode speedup (best gamma) vs AR", "end-to-end (prefill + decode) speedup")):
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (prompt tokens)")
    ax.set_title(name)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  tmp = f"{path}.tmp{os.getpid()}"
  fig.savefig(tmp, dpi=110, format="png")           # (then renamed: a kill keeps the last complete figure)
  os.replace(tmp, path)
  plt.close(fig)
  return path
