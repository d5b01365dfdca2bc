"""Does shrinking a fixed batch as its rows finish (generate(..., shrink_batch=True)) pay? SmolLM2-135M, CPU or GPU.

For each batch x context: the demo's prompts (one shared document, a different passage per row) are
prefilled once, then decoded autoregressively, with MagicDec in a fixed batch, and with MagicDec in a
shrinking batch (shrink.py), alternately `--repeats` times, all from copies of the same caches. Recorded
per run: decode seconds (compilation excluded), rounds, the stages ([batch, rounds, seconds]) and the
seconds of each copy into a smaller batch; summed-time speedups over AR; whether every run's greedy
tokens equal AR's. JSON to benchmarks/results/.

  python -m benchmarks.shrink_batch --shapes 8x4096,8x8000
  python -m benchmarks.shrink_batch --smoke       # random tiny model, seconds
"""
from __future__ import annotations

import sys

from benchmarks import common
from magicdec_jax import drafts, prefilled, textdata
from magicdec_jax.cli import demo as cli_demo

KEYS = ("decode_s", "loop_rounds", "verify_steps", "batch_stages", "shrink_gather_s", "mean_accepted_length")


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--shapes", type=common.shape_list, default=[(8, 4096), (8, 8000)])
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--gamma", type=int, default=2)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--weights", default="bfloat16", choices=["bfloat16", "none"], help="the self-draft's weights")
  ap.add_argument("--repeats", type=int, default=2)
  args = common.parse(ap, argv, shapes=[(4, 300)], max_new=12, window=16, repeats=1)
  model, source = common.model(args.smoke)
  if min(args.max_new, args.gamma, args.window, args.repeats) < 1 or args.sink < 0:
    ap.error("--max-new, --gamma, --window and --repeats must be >= 1, --sink >= 0")
  weights = None if args.weights == "none" else args.weights
  draft = drafts.StreamingDraft(args.sink, args.window, weights=weights)
  doc = {"benchmark": "shrink_batch", "env": common.env_info(), "model": source, "dtype": model.config.dtype,
         "draft": {"kind": "StreamingDraft", "sink": args.sink, "window": args.window, "weights": weights},
         "gamma": args.gamma, "greedy": True, "max_new_tokens": args.max_new, "repeats": args.repeats,
         "command": common.command(), "shapes": []}
  for b, ctx in args.shapes:
    shared = cli_demo.default_shared_tokens(ctx)
    prompts = textdata.document_prompts(model.tokenizer, b, ctx, shared)
    pre = prefilled.prefill(model, prompts, max_new_tokens=args.max_new, progress=not args.smoke)
    rec = {"batch": b, "context": ctx, "shared_tokens": pre.shared_tokens, "prefill_s": pre.prefill_s,
           "runs": {"autoregressive": [], "fixed": [], "shrinking": []}}
    doc["shapes"].append(rec)
    ways = {"autoregressive": {}, "fixed": {"draft": draft, "gamma": args.gamma},
            "shrinking": {"draft": draft, "gamma": args.gamma, "shrink_batch": True}}
    tokens = {}
    for _ in range(args.repeats):
      for name, kw in ways.items():
        res = prefilled.decode(model, pre, **kw)
        rec["runs"][name].append({k: res.stats.get(k) for k in KEYS})
        tokens.setdefault(name, []).append(res.tokens)
        print(f"[shrink_batch] {b} x {ctx} {name}: {res.stats['decode_s']:.2f}s, stages "
              f"{res.stats['batch_stages']}", file=sys.stderr, flush=True)
    total = {name: sum(r["decode_s"] for r in runs) for name, runs in rec["runs"].items()}
    ar = tokens["autoregressive"][0]
    rec["identical_to_ar"] = all(t == ar for ts in tokens.values() for t in ts)
    rec["summed_decode_s"] = total
    rec["speedup_fixed"] = total["autoregressive"] / total["fixed"]
    rec["speedup_shrinking"] = total["autoregressive"] / total["shrinking"]
    rec["shrinking_over_fixed"] = total["fixed"] / total["shrinking"]
  common.finish(doc, args.output, f"shrink_batch_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
