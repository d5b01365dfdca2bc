"""The feature-head draft's cost and speed on SmolLM2-135M, greedy, one run: step ratios and decode tokens/s.

Step costs (calibrate harness, minimum over repeats after a compiling call): the target's AR step at batch
B and each context, the feature head's draft step (calibrate.time_feature_step: fc + one decoder layer +
the target's LM head against a sink + window ring), and the self-draft's step (the target's weights against
the same ring) for comparison. The head's shape does not depend on the context; its ratio to AR is
reported per context. Decode: for each batch x context shape, autoregressive, `StreamingDraft(sink,
window)` and `FeatureDraft(head, sink, window)` at each gamma and each `--trees` tree (children counts in
BFS order, e.g. "3" = the head's top 3 at depth 1, "3,1" = and one more after the first); each shape is
prefilled once and every method decodes from the same prefilled caches (prefilled.py); tokens/s from the
decode's stats (compile excluded), mean accepted length, per-depth acceptance, and whether the greedy
output equals AR's. Prompts: held-out Shakespeare (the last plays, never in the head's training text).

  python -m benchmarks.feature_draft_speed --head-dir out/feature_head_smollm2 --shapes 8x2048
  python -m benchmarks.feature_draft_speed --head-dir out/fh_vocab8k --shapes 8x4096 --gammas 1,2 --trees "3;3,1"
  python -m benchmarks.feature_draft_speed --smoke         # random tiny target and head (CPU, seconds)
"""
from __future__ import annotations

import sys
import time

from benchmarks import common
from magicdec_jax import feature_head, prefilled
from magicdec_jax.measure import calibrate
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.drafts import FeatureDraft
from magicdec_jax.trees import Tree


def tree_list(text: str) -> list[tuple[int, ...]]:
  """argparse type: "3;3,1" -> [(3,), (3, 1)] (children counts per node, BFS order)."""
  return [tuple(int(c) for c in x.split(",")) for x in text.split(";") if x]


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny target and head, tiny shapes")
  ap.add_argument("--head-dir", default=None, help="trained head (feature_head.save_head dir)")
  ap.add_argument("--shapes", type=common.shape_list, default=[(8, 2048)])
  ap.add_argument("--step-contexts", type=common.int_list, default=[512, 1024, 2048, 4096])
  ap.add_argument("--gammas", type=common.int_list, default=[3, 4])
  ap.add_argument("--self-gamma", type=int, default=3)
  ap.add_argument("--trees", type=tree_list, default=[],
                  help='feature-head trees as children counts, ";"-separated: "3;3,1;2,2"')
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--max-new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=5)
  args = common.parse(ap, argv, shapes=[(2, 64)], step_contexts=[64], max_new=8, gammas=[2], window=16,
                      trees=[(2, 1)])
  if not (args.smoke or args.head_dir):
    ap.error("--head-dir is required (a directory written by distill_feature / --mode=distill --draft=feature)")
  target, source = common.model(args.smoke)
  if args.smoke:
    head = feature_head.init_head(target)
  else:
    head = feature_head.load_head(args.head_dir)
  t_start = time.time()
  b_steps = args.shapes[0][0]
  ring = args.sink + args.window
  doc = {"benchmark": "feature_draft_speed", "env": common.env_info(), "model": source,
         "dtype": target.config.dtype, "head_dir": args.head_dir, "head_layers": list(head.layers),
         "greedy": True, "max_new_tokens": args.max_new, "sink": args.sink, "window": args.window,
         "command": common.command(), "steps": {}, "shapes": []}
  # step costs: one process, one quiet run
  fs = calibrate.time_feature_step(head, target.params, b_steps, ring, 1, args.repeats)
  ss = calibrate.time_step(target.params, target.config, b_steps, ring, 1, "ring", args.repeats)
  doc["steps"] = {"batch": b_steps, "feature_step_s": fs["seconds"], "self_draft_step_s": ss["seconds"],
                  "by_context": []}
  for ctx in args.step_contexts:
    ar = calibrate.time_step(target.params, target.config, b_steps, ctx, 1, "linear", args.repeats)
    doc["steps"]["by_context"].append({"context": ctx, "ar_step_s": ar["seconds"],
                                       "feature_over_ar": fs["seconds"] / ar["seconds"],
                                       "self_over_ar": ss["seconds"] / ar["seconds"]})
    print(f"[feature_draft_speed] b{b_steps} ctx {ctx}: AR {ar['seconds'] * 1e3:.1f} ms, head "
          f"{fs['seconds'] * 1e3:.1f} ms ({fs['seconds'] / ar['seconds']:.3f}), self {ss['seconds'] * 1e3:.1f} "
          f"ms", file=sys.stderr, flush=True)
  self_draft = StreamingDraft(sink=args.sink, window=args.window)
  head_draft = FeatureDraft(head, sink=args.sink, window=args.window)
  configs = ([(f"self_streaming_gamma{args.self_gamma}", self_draft, args.self_gamma, None)]
             + [(f"feature_head_gamma{g}", head_draft, g, None) for g in args.gammas]
             + [(f"feature_head_tree{'-'.join(map(str, c))}", head_draft, 1, Tree.from_children_counts(c))
                for c in args.trees])
  for b, ctx in args.shapes:
    prompts, text = common.text_prompts(target, b, ctx, target.config.vocab_size, held_out=True)
    pre = prefilled.prefill(target, prompts, max_new_tokens=args.max_new)
    rec = {"batch": b, "context": ctx, "text": text, "prefill_s": pre.prefill_s, "runs": {}}
    doc["shapes"].append(rec)
    ar = prefilled.decode(target, pre, eos_token_id=[])
    rec["runs"]["autoregressive"] = {"tokens_per_s": ar.stats["tokens_per_s"], "decode_s": ar.stats["decode_s"]}
    for key, draft, g, tree in configs:
      res = prefilled.decode(target, pre, eos_token_id=[], draft=draft, gamma=g, tree=tree)
      s = res.stats
      run = {"tokens_per_s": s["tokens_per_s"], "decode_s": s["decode_s"], "ring_s": s["ring_s"],
             "mean_accepted_length": s["mean_accepted_length"],
             "per_position_acceptance": s["per_position_acceptance"],
             "speedup_vs_ar": s["tokens_per_s"] / ar.stats["tokens_per_s"],
             "identical_to_ar": res.tokens == ar.tokens}
      if tree is None:
        run["gamma"] = g
      else:
        run["tree_parents"] = list(tree.parents)
      rec["runs"][key] = run
      print(f"[feature_draft_speed] b{b} x {ctx} {key}: {run['tokens_per_s']:.1f} tok/s "
            f"(AR {ar.stats['tokens_per_s']:.1f}, x{run['speedup_vs_ar']:.2f}), accepted length "
            f"{run['mean_accepted_length']:.2f}, identical {run['identical_to_ar']}", file=sys.stderr, flush=True)
  doc["elapsed_s"] = time.time() - t_start
  common.finish(doc, args.output, f"feature_draft_speed_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
