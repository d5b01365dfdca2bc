"""What log-probabilities cost: tokens/s with logprobs off, on (chosen tokens) and with top-5 alternatives.

SmolLM2-135M, held-out Shakespeare, `--batch` x `--context` distinct prompts prefilled once; plain decoding
and MagicDec (StreamingDraft sink 4 + window 256, bfloat16 weights, gamma `--gamma`), greedy and T 0.8
top-p 0.95 (invariant sampling, so the tokens, and hence the work, are the same in every run of a mode),
each setting decoded from copies of the same caches, interleaved `--repeats` times (common.interleaved_decodes).
Recorded: median decode seconds per setting, tokens/s, and the ratio with logprobs on / off measured in the
same run (issue 48's goal: logprobs cost <= 3% of tokens/s); the tokens must not change with logprobs.

  python -m benchmarks.logprobs_cost                 # 8 x 1024, 64 new tokens, 3 repeats
  python -m benchmarks.logprobs_cost --smoke         # random tiny model, seconds
"""
from __future__ import annotations

import statistics

from benchmarks import common

LOGPROBS = {"off": {}, "on": {"logprobs": True}, "top5": {"logprobs": True, "top_logprobs": 5}}


def main(argv=None):
  args = common.parse(common.self_draft_parser(__doc__), argv, batch=2, context=128, max_new=12, repeats=1)
  model, source, draft, pre = common.prefilled_self_draft(args)
  doc = {"benchmark": "logprobs_cost", "env": common.env_info(), "model": source, "batch": args.batch,
         "context": args.context, "max_new_tokens": args.max_new, "gamma": args.gamma, "draft": repr(draft),
         "repeats": args.repeats, "command": common.command(), "points": []}
  modes = {"greedy": {}, "t0.8_top_p0.95": dict(temperature=0.8, top_p=0.95, seed=0, sampling="invariant")}
  decoders = {"plain": {}, "magicdec": {"draft": draft, "gamma": args.gamma}}
  for mode, sampling_kw in modes.items():
    for dec, dec_kw in decoders.items():
      settings = {lp: {**sampling_kw, **dec_kw, **lp_kw} for lp, lp_kw in LOGPROBS.items()}
      runs = common.interleaved_decodes(model, pre, settings, args.repeats)
      point = {"sampling": mode, "decoder": dec}
      for lp, results in runs.items():
        secs = statistics.median(r.stats["decode_s"] for r in results)
        point[lp] = {"median_decode_s": secs, "tokens_per_s": results[0].stats["new_tokens"] / secs,
                     "all_decode_s": [r.stats["decode_s"] for r in results]}
      point["same_tokens"] = len({str(r[0].tokens) for r in runs.values()}) == 1
      point["on_over_off_tokens_per_s"] = point["on"]["tokens_per_s"] / point["off"]["tokens_per_s"]
      point["top5_over_off_tokens_per_s"] = point["top5"]["tokens_per_s"] / point["off"]["tokens_per_s"]
      doc["points"].append(point)
  common.finish(doc, args.output, f"logprobs_cost_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
