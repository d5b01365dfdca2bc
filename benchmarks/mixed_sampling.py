"""What a mixed request file costs: greedy and sampled rows in one batch (per-row sampling) against the two
uniform runs, speculating.

SmolLM2-135M, held-out Shakespeare, `--batch` x `--context` distinct prompts prefilled once; MagicDec
(StreamingDraft sink 4 + window 256, bfloat16 weights, gamma `--gamma`), rejection sampling. Three settings
decode copies of the same caches, interleaved `--repeats` times (common.interleaved_decodes): every row
greedy; every row T 0.8 top-p 0.95; half the rows each (`row_sampling`, one compiled loop for the mix).
Recorded: median decode seconds, tokens/s, acceptance, and mixed / the slower uniform run's tokens/s
(issue 48's goal: >= 0.95); the mixed run's greedy rows must equal the greedy run's rows.

  python -m benchmarks.mixed_sampling                 # 8 x 1024, 64 new tokens, 3 repeats
  python -m benchmarks.mixed_sampling --smoke         # random tiny model, seconds
"""
from __future__ import annotations

import statistics

from benchmarks import common

SAMPLED = {"temperature": 0.8, "top_p": 0.95}


def main(argv=None):
  args = common.parse(common.self_draft_parser(__doc__), argv, batch=4, context=128, max_new=12, repeats=1)
  model, source, draft, pre = common.prefilled_self_draft(args)
  spec = dict(draft=draft, gamma=args.gamma, seed=0)
  mix = [{} if i % 2 == 0 else dict(SAMPLED) for i in range(args.batch)]
  settings = {"greedy": dict(spec), "sampled": dict(spec, **SAMPLED), "mixed": dict(spec, row_sampling=mix)}
  runs = common.interleaved_decodes(model, pre, settings, args.repeats)
  doc = {"benchmark": "mixed_sampling", "env": common.env_info(), "command": common.command(), "model": source,
         "batch": args.batch, "context": args.context, "max_new_tokens": args.max_new, "gamma": args.gamma,
         "draft": repr(draft), "sampled": SAMPLED, "sampling": "rejection", "repeats": args.repeats,
         "mixed_rows": mix, "runs": {}}
  for name, results in runs.items():
    secs = statistics.median(r.stats["decode_s"] for r in results)
    doc["runs"][name] = {"median_decode_s": secs, "tokens_per_s": results[0].stats["new_tokens"] / secs,
                         "acceptance_rate": results[0].stats.get("acceptance_rate"),
                         "all_decode_s": [r.stats["decode_s"] for r in results]}
  tps = {k: v["tokens_per_s"] for k, v in doc["runs"].items()}
  doc["mixed_over_slower_uniform"] = tps["mixed"] / min(tps["greedy"], tps["sampled"])
  doc["mixed_greedy_rows_equal_greedy_run"] = all(
      runs["mixed"][0].tokens[i] == runs["greedy"][0].tokens[i] for i in range(0, args.batch, 2))
  common.finish(doc, args.output, f"mixed_sampling_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
