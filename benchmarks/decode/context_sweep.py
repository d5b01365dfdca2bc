"""Where does MagicDec start to win? Decode and end-to-end throughput of AR vs StreamingDraft over context x batch.

SmolLM2-135M on held-out Shakespeare, greedy; the measurement is magicdec_jax/measure/sweep.py (prefill once per
point, AR and each gamma from copies of the same caches; measured crossover beside the cost model's
predicted one, labelled). JSON (rewritten after every point, so an interrupted run keeps what it measured)
+ PNG (speedup vs context per batch). `run.py --mode=bench --bench_preset=long_context` runs the same grid.

  python -m benchmarks.decode.context_sweep --batches 1,4,8 --contexts 1024,2048,4096,8000 --budget-min 30
  python -m benchmarks.decode.context_sweep --profile my_cpu_profile.json      # predictions from a calibrated profile
  python -m benchmarks.decode.context_sweep --smoke                             # random tiny model (seconds)
"""
from __future__ import annotations

import json

import numpy as np

from benchmarks import common
from magicdec_jax import StreamingDraft
from magicdec_jax.measure import sweep
from magicdec_jax.tuning import autotune

PRESET = sweep.LONG_CONTEXT


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--batches", type=common.int_list, default=list(PRESET["batches"]))
  ap.add_argument("--contexts", type=common.int_list, default=list(PRESET["contexts"]))
  ap.add_argument("--gammas", type=common.int_list, default=list(PRESET["gammas"]))
  common.flags(ap, max_new=PRESET["max_new_tokens"], sink=4, window=PRESET["window"])
  ap.add_argument("--max-batch-tokens", type=int, default=PRESET["max_batch_tokens"],
                  help="skip points with batch x context above this (prefill time)")
  ap.add_argument("--draft-weights", default="none", choices=["none", "bfloat16"],
                  help="StreamingDraft.weights: the self-draft on the target's weights or a bfloat16 copy "
                       "(the demo's draft)")
  ap.add_argument("--profile", default=None, help="hardware profile JSON for the predictions (default: nominal)")
  ap.add_argument("--budget-min", type=float, default=30.0, help="start no new point after this many minutes")
  ap.add_argument("--repredict", default=None, metavar="SWEEP_JSON",
                  help="measure nothing: add the cost model's predictions with --profile to a recorded sweep")
  ap.add_argument("--combine", nargs="+", default=None, metavar="SWEEP_JSON",
                  help="measure nothing: one figure of several recorded sweeps (each run's points and their "
                       "mean) -> --output (a .png); PATH:4,8 takes only those batches of a run")
  args = common.parse(ap, argv, batches=[1, 2], contexts=[64, 128], gammas=[2], max_new=8, window=16)
  if args.combine:
    return combine(args.combine, args.output or str(common.RESULTS_DIR / "context_sweep_combined.png"))
  if args.repredict:
    return repredict(args.repredict, args.profile, args.smoke)
  model, source = common.model(args.smoke)
  out = common.output_path(args.output, "context_sweep")
  weights = None if args.draft_weights == "none" else args.draft_weights
  doc = common.record("context_sweep", source, model.config.dtype, greedy=True, max_new_tokens=args.max_new,
                      draft=dict(kind="StreamingDraft", sink=args.sink, window=args.window, weights=weights),
                      gammas=args.gammas)

  def prompts_for(batch: int, context: int) -> list[list[int]]:
    return common.text_prompts(model, batch, context, model.config.vocab_size, seed=context, held_out=True)[0]

  sweep.run(model, StreamingDraft(args.sink, args.window, weights=weights), prompts_for, batches=args.batches,
            contexts=args.contexts, gammas=args.gammas, max_new=args.max_new,
            max_batch_tokens=args.max_batch_tokens, budget_min=args.budget_min, hardware=args.profile, doc=doc,
            on_point=lambda d: common.write_json(d, out), log=lambda m: print(m, flush=True))
  png = common.png_path(out)
  if doc["points"]:
    sweep.plot(doc, png, f"MagicDec StreamingDraft vs autoregressive, {source}, {doc['env']['device']}")
  common.finish(doc, out)


def combine(paths: list[str], png: str) -> dict:
  """Best-gamma decode speedup vs context per batch over several sweeps: every run's points (markers) and
  the mean over runs (line), so run-to-run spread is visible. Returns {batch: {context: [speedups]}}."""
  plt = common.pyplot()
  runs = []
  for spec in paths:
    path, _, only = spec.partition(":")
    runs.append((common.read_json(path), set(common.int_list(only)) if only else None))
  table: dict = {}
  for doc, only in runs:
    for p in doc["points"]:
      if only is None or p["batch"] in only:
        table.setdefault(p["batch"], {}).setdefault(p["context"], []).append(p["best_decode_speedup"])
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for i, b in enumerate(sorted(table)):
    xs = sorted(table[b])
    color = f"C{i}"
    for x in xs:
      ax.plot([x] * len(table[b][x]), table[b][x], "o", color=color, alpha=0.45, ms=5)
    n = max(len(v) for v in table[b].values())
    ax.plot(xs, [float(np.mean(table[b][x])) for x in xs], "-", color=color, lw=2,
            label=f"batch {b} ({f'mean of {n} runs' if n > 1 else 'one run'})")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_xscale("log", base=2)
  ax.set(xlabel="context (prompt tokens)", ylabel="decode speedup over AR (best gamma)")
  env = runs[0][0]["env"]
  where = env["device"] + (f" ({env['cpu_model']})" if env.get("cpu_model") else "")
  ax.set_title(f"MagicDec StreamingDraft vs AR, {runs[0][0]['model']}, {where}", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  common.save_figure(fig, png)
  print(json.dumps({"png": png, "runs": paths, "speedups": {str(b): {str(n): v for n, v in t.items()}
                                                            for b, t in table.items()}}, indent=1))
  return table


def repredict(path: str, profile: str | None, smoke: bool = False) -> dict:
  """Predictions of a recorded sweep recomputed with another hardware profile, stored beside the first ones
  as crossover[batch]["predicted_with_profile"] (the measured figures are not touched); priced with the
  fixed batch's tail over the sweep's max_new_tokens, as it was measured."""
  doc = common.read_json(path)
  model = common.model(smoke)[0]
  hw = autotune.detect_hardware(profile)
  draft = StreamingDraft(doc["draft"]["sink"], doc["draft"]["window"], weights=doc["draft"].get("weights"))
  for b, entry in doc["crossover"].items():
    pts = [p for p in doc["points"] if p["batch"] == int(b)]
    entry["predicted_with_profile"] = dict(
        sweep.predicted_crossover(model, hw, autotune.cost_draft(draft), int(b), pts, doc["gammas"],
                                  doc.get("max_new_tokens")),
        profile=profile)
  common.write_json(doc, path, stamp=False)
  print(json.dumps({b: e["predicted_with_profile"] for b, e in doc["crossover"].items()}, indent=1))
  return doc


if __name__ == "__main__":
  main()
