"""Acceptance rate and speedup of the drafts on SmolLM2-135M over long Shakespeare text (CPU, greedy).

Two parts, both measured in this run:
  * `teacher_forced`: the greedy acceptance rate alpha of self-speculation (StreamingLLM sink + window over
    the target's own weights) versus context and window, from one plain full forward of the target and one
    windowed forward per window over the same text (magicdec_jax.measure.acceptance): alpha = P(draft argmax ==
    target argmax) at positions past sink + window. Cheap, so it covers contexts up to 4K.
  * `engine`: real `generate` runs (autoregressive, StreamingDraft, ModelDraft(truncate_layers), SnapKVDraft;
    a gamma sweep; both draft RoPE position schemes) at batch `--batch`, `--max-new` new tokens: acceptance
    rate, mean accepted length, decode tokens/s and the speedup over our own autoregressive decode in this
    run. Each configuration is run once to compile, then timed (decode_s excludes compilation).
JSON and a PNG (matplotlib, Agg) go to benchmarks/results/.

  python -m benchmarks.acceptance                 # defaults: about 15 minutes on a 2-core CPU
  python -m benchmarks.acceptance --quick         # a minute-scale subset
"""
from __future__ import annotations

import sys
import time

import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax.measure import acceptance as acc
from magicdec_jax import drafts
from magicdec_jax.engine import generate
from magicdec_jax.model import full_forward


def teacher_forced(model, contexts, windows, sink: int) -> list[dict]:
  """Greedy alpha of StreamingDraft(sink, window) per (context, window), one text window per context."""
  rows = []
  for ctx in contexts:
    (toks,), src = common.text_prompts(model, 1, ctx, model.config.vocab_size)
    arr = jnp.asarray([toks], jnp.int32)
    t0 = time.perf_counter()
    tl = np.asarray(full_forward(model.params, model.config, arr))[0]
    for w in windows:
      if sink + w + 16 >= ctx:
        continue
      dl = np.asarray(acc.windowed_logits(model.params, model.config, arr, sink, w))[0]
      start = sink + w
      ranks = acc.greedy_ranks(tl[start:ctx - 1], dl[start:ctx - 1], 1)
      rows.append({"context": ctx, "window": w, "sink": sink, "alpha": float(np.mean(ranks == 0)),
                   "positions": int(ranks.size), "text": src})
    print(f"[teacher-forced {ctx}] {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
  return rows


def engine_configs(model, ctx: int, args) -> list[tuple[str, object, int]]:
  """(label, draft, gamma) to run at this context; window sweep and gamma sweep at the smallest context."""
  small = ctx == min(args.engine_contexts)
  cfgs = [("AR", None, 0)]
  for w in (args.windows_engine if small else [args.window]):
    cfgs.append((f"stream w{w}", drafts.StreamingDraft(args.sink, w), args.gamma))
  if small:
    for g in args.gammas:
      if g != args.gamma:
        cfgs.append((f"stream w{args.window}", drafts.StreamingDraft(args.sink, args.window), g))
    cfgs.append((f"stream w{args.windows_engine[0]} rope=cache",
                 drafts.StreamingDraft(args.sink, args.windows_engine[0], positions="cache"), args.gamma))
  small_model = drafts.truncate_layers(model, args.draft_layers)
  cfgs.append((f"model L{args.draft_layers} w{args.window}",
               drafts.ModelDraft(small_model, args.sink, args.window), args.gamma))
  cfgs.append((f"snapkv b{args.snap_budget} w{args.snap_window}",
               drafts.SnapKVDraft(args.snap_budget, args.snap_window), args.gamma))
  return cfgs


def engine(model, args) -> list[dict]:
  rows = []
  for ctx in args.engine_contexts:
    prompts, src = common.text_prompts(model, args.batch, ctx, model.config.vocab_size)
    ar_tok_s = None
    for label, draft, gamma in engine_configs(model, ctx, args):
      kw = dict(max_new_tokens=args.max_new, eos_token_id=[], draft=draft)
      if draft is not None:
        kw["gamma"] = gamma
      t0 = time.perf_counter()
      generate(model, prompts, **kw)                                   # compile + warm
      warm = time.perf_counter() - t0
      r = generate(model, prompts, **kw)
      s = r.stats
      row = {"context": ctx, "batch": args.batch, "label": label, "draft": s["draft"] or "AR",
             "gamma": gamma, "acceptance_rate": s["acceptance_rate"],
             "mean_accepted_length": s["mean_accepted_length"], "verify_steps": s["verify_steps"],
             "new_tokens": s["new_tokens"], "prefill_s": s["prefill_s"], "decode_s": s["decode_s"],
             "decode_tok_s": s["tokens_per_s"], "warmup_call_s": warm, "text": src,
             "positions": getattr(draft, "positions", None) if draft is not None else None}
      if draft is None:
        ar_tok_s = s["tokens_per_s"]
      row["speedup_vs_ar"] = s["tokens_per_s"] / ar_tok_s if ar_tok_s else None
      rows.append(row)
      print(f"[engine {ctx}] {label:28s} g{gamma} acc {row['acceptance_rate']} tok/s "
            f"{row['decode_tok_s']:.2f} speedup {row['speedup_vs_ar']:.2f} ({warm:.0f}s warm)",
            file=sys.stderr, flush=True)
  return rows


def plot(doc: dict, path: str) -> None:
  fig, (a1, a2) = common.pyplot().subplots(1, 2, figsize=(13, 4.8))
  tf = doc["teacher_forced"]
  for w in sorted({r["window"] for r in tf}):
    pts = sorted((r["context"], r["alpha"]) for r in tf if r["window"] == w)
    a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"window {w}")
  a1.set_xscale("log", base=2)
  a1.set_xlabel("context (tokens)")
  a1.set_ylabel("greedy acceptance rate alpha")
  a1.set_title("StreamingLLM self-speculation, teacher-forced")
  a1.legend()
  eng = [r for r in doc["engine"] if r["draft"] != "AR"]
  labels = [f"{r['label']} g{r['gamma']}\nctx {r['context']}" for r in eng]
  x = np.arange(len(eng))
  a2.bar(x - 0.2, [r["acceptance_rate"] or 0 for r in eng], 0.4, label="acceptance rate")
  a2.bar(x + 0.2, [r["speedup_vs_ar"] or 0 for r in eng], 0.4, label="speedup vs our AR")
  a2.axhline(1.0, color="k", lw=0.5)
  a2.set_xticks(x, labels, rotation=70, fontsize=7)
  a2.set_title(f"generate(), batch {doc['batch']}, {doc['max_new_tokens']} new tokens (CPU)")
  a2.legend()
  fig.suptitle(f"{doc['model']} on {doc['env']['device']}, {doc['env']['date'][:10]}")
  common.save_figure(fig, path)


def main(argv=None):
  ap = common.parser(__doc__, smoke=None)
  ap.add_argument("--tf-contexts", type=common.int_list, default=[512, 1024, 2048, 4096])
  ap.add_argument("--tf-windows", type=common.int_list, default=[64, 128, 256, 512])
  ap.add_argument("--engine-contexts", type=common.int_list, default=[512, 2048])
  ap.add_argument("--windows-engine", type=common.int_list, default=[64, 256])
  ap.add_argument("--gammas", type=common.int_list, default=[2, 4, 6])
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--draft-layers", type=int, default=8)
  ap.add_argument("--snap-budget", type=int, default=192)
  ap.add_argument("--snap-window", type=int, default=64)
  ap.add_argument("--batch", type=int, default=2)
  ap.add_argument("--max-new", type=int, default=48)
  ap.add_argument("--quick", action="store_true", help="tiny subset: 512 context only, fewer configs")
  args = common.parse(ap, argv)
  if args.quick:
    args.tf_contexts, args.tf_windows, args.engine_contexts = [512], [64, 256], [512]
    args.windows_engine, args.gammas, args.max_new, args.batch = [64], [4], 16, 1

  t_start = time.perf_counter()
  model, source = common.load_smollm("float32")
  doc = {"benchmark": "acceptance", "env": common.env_info(), "model": model.name, "weights": source,
         "dtype": "float32", "sampling": "greedy", "batch": args.batch, "max_new_tokens": args.max_new,
         "rope_positions_note": "StreamingDraft offers positions='absolute' (default: keys at their true "
                                "positions) and 'cache' (StreamingLLM positions within the cache); both are "
                                "in the engine sweep (label 'rope=cache').",
         "args": {k: v for k, v in vars(args).items() if k != "output"}}
  doc["teacher_forced"] = teacher_forced(model, args.tf_contexts, args.tf_windows, args.sink)
  doc["engine"] = engine(model, args)
  doc["wall_s"] = time.perf_counter() - t_start
  tag = common.device_tag()
  png = common.png_path(args.output) if args.output else common.RESULTS_DIR / f"acceptance_{tag}.png"
  doc["png"] = str(png)
  plot(doc, str(png))
  common.finish(doc, args.output, f"acceptance_{tag}.json")


if __name__ == "__main__":
  main()
