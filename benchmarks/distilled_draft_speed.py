"""Decode tokens/s with a distilled draft vs autoregressive vs self-speculation, SmolLM2-135M, greedy, one run.

The draft is a directory written by `run.py --mode=distill` / `benchmarks/distill_smollm2.py` (loaded with
`load_model`, used as `ModelDraft(draft, sink, window)`). Prompts are held-out Shakespeare
(`textdata.shakespeare_prompts(..., held_out=True)`: plays read from the end of the list, which the
distillation benchmark's training text never reaches). For each batch x context shape, in one process:
autoregressive, `StreamingDraft(sink, window)` (the target itself with a StreamingLLM cache) and the
distilled `ModelDraft(sink, window)` at each gamma; tokens/s from `generate`'s stats (compile time excluded),
mean accepted tokens per round, and whether the greedy output equals the autoregressive one.

  python -m benchmarks.distilled_draft_speed --draft-dir /tmp/distill_q --shapes 4x1024,8x2048
  python -m benchmarks.distilled_draft_speed --smoke          # random tiny target and draft (CPU, seconds)
"""
from __future__ import annotations

import sys
import time

from benchmarks import common
from magicdec_jax import checkpoints
from magicdec_jax.training import distill
from magicdec_jax.drafts import ModelDraft, StreamingDraft
from magicdec_jax.engine import generate


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny target and 1-layer draft, tiny shapes")
  ap.add_argument("--draft-dir", default=None, help="distilled draft (orbax dir); required unless --smoke")
  ap.add_argument("--shapes", type=common.shape_list, default=[(4, 1024), (8, 2048)])
  ap.add_argument("--gammas", type=common.int_list, default=[4])
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--max-new", type=int, default=64)
  args = common.parse(ap, argv, shapes=[(2, 64)], max_new=8, gammas=[2], window=16)
  if not (args.smoke or args.draft_dir):
    ap.error("--draft-dir is required (a directory written by --mode=distill)")
  target, source = common.model(args.smoke)
  if args.smoke:
    draft_model = distill.init_draft(target, layers=1)
  else:
    draft_model = checkpoints.load_model(args.draft_dir, dtype=target.config.dtype)
  t_start = time.time()
  doc = {"benchmark": "distilled_draft_speed", "env": common.env_info(), "model": source,
         "dtype": target.config.dtype, "draft_dir": args.draft_dir, "draft_layers": draft_model.config.num_layers,
         "target_layers": target.config.num_layers, "greedy": True, "max_new_tokens": args.max_new,
         "sink": args.sink, "window": args.window, "command": common.command(), "shapes": []}
  drafts = {"self_streaming": StreamingDraft(sink=args.sink, window=args.window),
            "distilled_model": ModelDraft(draft_model, sink=args.sink, window=args.window)}
  for b, ctx in args.shapes:
    prompts, text = common.text_prompts(target, b, ctx, target.config.vocab_size, held_out=True)
    rec = {"batch": b, "context": ctx, "text": text, "runs": {}}
    doc["shapes"].append(rec)
    ar = generate(target, prompts, max_new_tokens=args.max_new, eos_token_id=[])
    rec["runs"]["autoregressive"] = {"tokens_per_s": ar.stats["tokens_per_s"], "decode_s": ar.stats["decode_s"]}
    for name, draft in drafts.items():
      for g in args.gammas:
        res = generate(target, prompts, max_new_tokens=args.max_new, eos_token_id=[], draft=draft, gamma=g)
        s = res.stats
        run = {"tokens_per_s": s["tokens_per_s"], "decode_s": s["decode_s"], "gamma": g,
               "mean_accepted_length": s.get("mean_accepted_length"),
               "speedup_vs_ar": s["tokens_per_s"] / ar.stats["tokens_per_s"],
               "identical_to_ar": res.tokens == ar.tokens}
        rec["runs"][f"{name}_gamma{g}"] = run
        print(f"[distilled_draft_speed] b{b} x {ctx} {name} gamma {g}: {run['tokens_per_s']:.1f} tok/s "
              f"(AR {ar.stats['tokens_per_s']:.1f}), accepted/round {run['mean_accepted_length']:.2f}",
              file=sys.stderr, flush=True)
  doc["elapsed_s"] = time.time() - t_start
  common.finish(doc, args.output, f"distilled_draft_speed_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
