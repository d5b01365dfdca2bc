"""Drafter-invariant vs rejection sampling: acceptance and speedup, SmolLM2-135M, the self-draft, CPU or GPU.

Held-out Shakespeare, `--batch` x `--context` distinct prompts, prefilled once; at each temperature (top-p
`--top-p`) plain decoding and MagicDec (StreamingDraft sink 4 + window 256, bfloat16 weights, gamma
`--gamma`) are decoded in both modes from copies of the same caches. Recorded per temperature and mode:
acceptance, mean accepted length, decode seconds, speedup over plain decoding in the same mode (summed
times), and, for invariant sampling, whether MagicDec's samples equal plain decoding's (they must). The
bound of Daliri et al. (arXiv 2408.07978): invariant acceptance >= (1 - TV) / (1 + TV) where rejection
sampling gets 1 - TV (per position). JSON + PNG to benchmarks/results/.

  python -m benchmarks.invariant_sampling                 # 8 x 4096, 128 new tokens, T 0.6 / 0.8 / 1.0
  python -m benchmarks.invariant_sampling --smoke         # random tiny model, seconds
"""
from __future__ import annotations

import sys

from benchmarks import common
from magicdec_jax import drafts, prefilled
from magicdec_jax.sampling import MODES

KEYS = ("decode_s", "new_tokens", "loop_rounds", "acceptance_rate", "mean_accepted_length")


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--context", type=int, default=4096)
  ap.add_argument("--max-new", type=int, default=128)
  ap.add_argument("--gamma", type=int, default=2)
  ap.add_argument("--temperatures", type=lambda t: [float(x) for x in t.split(",")], default=[0.6, 0.8, 1.0])
  ap.add_argument("--top-p", type=float, default=0.95)
  ap.add_argument("--repeats", type=int, default=1)
  args = common.parse(ap, argv, batch=2, context=128, max_new=12, temperatures=[0.8], repeats=1)
  model, source = common.model(args.smoke)
  draft = drafts.StreamingDraft(4, 16 if args.smoke else 256, weights="bfloat16")
  prompts = common.text_prompts(model, args.batch, args.context, model.config.vocab_size,
                                held_out=not args.smoke)[0]
  pre = prefilled.prefill(model, prompts, max_new_tokens=args.max_new, progress=not args.smoke)
  doc = {"benchmark": "invariant_sampling", "env": common.env_info(), "model": source, "batch": args.batch,
         "context": args.context, "max_new_tokens": args.max_new, "gamma": args.gamma, "top_p": args.top_p,
         "draft": repr(draft), "repeats": args.repeats, "command": common.command(), "points": []}
  for t in args.temperatures:
    point = {"temperature": t}
    for mode in MODES:
      kw = dict(temperature=t, top_p=args.top_p, seed=0, sampling=mode)
      runs = {"plain": [], "magicdec": []}
      toks = {}
      for _ in range(args.repeats):
        for name, extra in (("plain", {}), ("magicdec", {"draft": draft, "gamma": args.gamma})):
          res = prefilled.decode(model, pre, **kw, **extra)
          runs[name].append({k: res.stats.get(k) for k in KEYS})
          toks[name] = res.tokens
          print(f"[invariant_sampling] T {t} {mode} {name}: {res.stats['decode_s']:.2f}s, acceptance "
                f"{res.stats['acceptance_rate']}", file=sys.stderr, flush=True)
      secs = {n: sum(r["decode_s"] for r in rs) for n, rs in runs.items()}
      new = {n: sum(r["new_tokens"] for r in rs) for n, rs in runs.items()}
      point[mode] = {"runs": runs, "acceptance_rate": runs["magicdec"][-1]["acceptance_rate"],
                     "mean_accepted_length": runs["magicdec"][-1]["mean_accepted_length"],
                     "speedup": secs["plain"] / secs["magicdec"] * new["magicdec"] / new["plain"],
                     "samples_equal_plain": toks["magicdec"] == toks["plain"]}
    point["invariant_over_rejection_acceptance"] = (point["invariant"]["acceptance_rate"] /
                                                    point["rejection"]["acceptance_rate"])
    doc["points"].append(point)
  out = common.finish(doc, args.output, f"invariant_sampling_{common.device_tag()}.json")
  plt = common.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  ts = [p["temperature"] for p in doc["points"]]
  for mode in MODES:
    axes[0].plot(ts, [p[mode]["acceptance_rate"] for p in doc["points"]], "o-", label=mode)
    axes[1].plot(ts, [p[mode]["speedup"] for p in doc["points"]], "o-", label=mode)
  for ax, title in zip(axes, ("acceptance rate", "speedup over plain decoding (same mode)")):
    ax.set_xlabel("temperature")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(f"invariant vs rejection sampling, {source}, {args.batch} x {args.context}, top-p {args.top_p}, "
               f"gamma {args.gamma}", fontsize=9)
  common.save_figure(fig, common.png_path(out))


if __name__ == "__main__":
  main()
