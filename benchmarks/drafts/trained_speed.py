"""Decode speed with a trained draft, SmolLM2-135M, greedy, one run: a distilled model draft and / or a feature head
against plain decoding and the self-draft, from one prefill per shape.

The draft is a directory written by `benchmarks.drafts.train model` (a ModelDraft), the head one written by
`train feature` (a FeatureDraft: chains of each `--gammas`, trees of `--trees`, children counts in BFS order).
Held-out Shakespeare prompts. Per method: tokens/s, mean accepted length, per-position acceptance, speedup over
plain decoding, identical greedy tokens; with a head, also its step cost against the target's AR step at each
`--step-contexts` and the self-draft's (calibrate harness, minimum over `--repeats`).

  python -m benchmarks.drafts.trained_speed --draft-dir /tmp/distill_q --shapes 4x1024,8x2048 --gammas 4
  python -m benchmarks.drafts.trained_speed --head-dir out/fh_vocab8k --shapes 8x4096 --gammas 1,2 --trees "3;3,1"
  python -m benchmarks.drafts.trained_speed --smoke        # random tiny target, 1-layer draft and head (seconds)
"""
from __future__ import annotations

import time

from benchmarks import common
from magicdec_jax import checkpoints, feature_head, prefilled
from magicdec_jax.drafts import FeatureDraft, ModelDraft, StreamingDraft
from magicdec_jax.measure import calibrate
from magicdec_jax.training import distill
from magicdec_jax.trees import Tree


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny target, 1-layer draft and random head, tiny shapes")
  ap.add_argument("--draft-dir", default=None, help="a distilled draft (orbax dir)")
  ap.add_argument("--head-dir", default=None, help="a trained feature head (feature_head.save_head dir)")
  ap.add_argument("--shapes", type=common.shape_list, default=[(8, 2048)])
  ap.add_argument("--gammas", type=common.int_list, default=[3, 4])
  ap.add_argument("--trees", type=lambda t: [tuple(int(c) for c in x.split(",")) for x in t.split(";") if x],
                  default=[], help='feature-head trees as children counts, ";"-separated: "3;3,1;2,2"')
  ap.add_argument("--step-contexts", type=common.int_list, default=[512, 1024, 2048, 4096])
  common.flags(ap, self_gamma=3, sink=4, window=256, max_new=128, repeats=5)
  a = common.parse(ap, argv, shapes=[(2, 64)], step_contexts=[64], max_new=8, gammas=[2], self_gamma=2, window=16,
                   trees=[(2, 1)], repeats=2)
  if not (a.smoke or a.draft_dir or a.head_dir):
    ap.error("give --draft-dir and / or --head-dir (or --smoke)")
  target, source = common.model(a.smoke)
  ways = {f"self_gamma{a.self_gamma}": dict(draft=StreamingDraft(a.sink, a.window), gamma=a.self_gamma)}
  doc = common.record("trained_speed", source, target.config.dtype, draft_dir=a.draft_dir, head_dir=a.head_dir,
                      greedy=True, max_new_tokens=a.max_new, sink=a.sink, window=a.window, shapes=[])
  if a.smoke or a.draft_dir:
    small = distill.init_draft(target, layers=1) if a.smoke else checkpoints.load_model(a.draft_dir, dtype=target.config.dtype)
    doc["draft_layers"], doc["target_layers"] = small.config.num_layers, target.config.num_layers
    ways.update({f"model_gamma{g}": dict(draft=ModelDraft(small, a.sink, a.window), gamma=g) for g in a.gammas})
  if a.smoke or a.head_dir:
    head = feature_head.init_head(target) if a.smoke else feature_head.load_head(a.head_dir)
    hd = FeatureDraft(head, sink=a.sink, window=a.window)
    ways.update({f"feature_gamma{g}": dict(draft=hd, gamma=g) for g in a.gammas})
    ways.update({f"feature_tree{'-'.join(map(str, c))}": dict(draft=hd, tree=Tree.from_children_counts(c))
                 for c in a.trees})
    b, ring = a.shapes[0][0], a.sink + a.window
    fs = calibrate.time_feature_step(head, target.params, b, ring, 1, a.repeats)["seconds"]
    ss = calibrate.time_step(target.params, target.config, b, ring, 1, "ring", a.repeats)["seconds"]
    ars = {c: calibrate.time_step(target.params, target.config, b, c, 1, "linear", a.repeats)["seconds"]
           for c in a.step_contexts}
    doc["steps"] = {"batch": b, "feature_step_s": fs, "self_draft_step_s": ss, "head_layers": list(head.layers),
                    "by_context": [{"context": c, "ar_step_s": t, "feature_over_ar": fs / t, "self_over_ar": ss / t}
                                   for c, t in ars.items()]}
  t_start = time.time()
  for b, ctx in a.shapes:
    prompts, text = common.text_prompts(target, b, ctx, target.config.vocab_size, held_out=not a.smoke)
    pre = prefilled.prefill(target, prompts, max_new_tokens=a.max_new, progress=not a.smoke)
    ar = prefilled.decode(target, pre, eos_token_id=[])
    rec = {"batch": b, "context": ctx, "text": text, "prefill_s": pre.prefill_s,
           "runs": {"plain": {"tokens_per_s": ar.stats["tokens_per_s"], "decode_s": ar.stats["decode_s"]}}}
    for name, kw in ways.items():
      s = (res := prefilled.decode(target, pre, eos_token_id=[], **kw)).stats
      rec["runs"][name] = {"tokens_per_s": s["tokens_per_s"], "decode_s": s["decode_s"], "gamma": kw.get("gamma"),
                           "mean_accepted_length": s["mean_accepted_length"],
                           "per_position_acceptance": s["per_position_acceptance"],
                           "speedup_vs_ar": s["tokens_per_s"] / ar.stats["tokens_per_s"],
                           "identical_to_ar": res.tokens == ar.tokens}
      if "tree" in kw:
        rec["runs"][name]["tree_parents"] = list(kw["tree"].parents)
      common.log(f"[trained_speed] {b} x {ctx} {name}: x{rec['runs'][name]['speedup_vs_ar']:.2f}, accepted length "
                 f"{s['mean_accepted_length']:.2f}")
    doc["shapes"].append(rec)
  doc["elapsed_s"] = time.time() - t_start
  common.finish(doc, a.output, f"trained_speed_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
