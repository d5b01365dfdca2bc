"""Prompt lookup (PromptLookupDraft) beside the self-draft on the demo's shape, SmolLM2-135M, CPU or GPU.

The demo's workload: `--batch` prompts of `--context` tokens that share one document (a different passage
after it per row), `--max-new` new tokens, greedy or sampled. Prefilled once; then decoded autoregressively,
with the demo's self-draft (StreamingDraft sink 4 + window 256, bfloat16 weights, gamma `--self-gamma`) and
with prompt lookup at each of `--gammas`, alternately `--repeats` times, all from copies of the same caches.
Per way: summed decode seconds (compilation excluded), tokens/s, speedup over AR (of the summed times),
acceptance, mean accepted length; whether every greedy output equals AR's. A text that repeats itself
(long documents, code, extraction) is where lookup proposes well; this prose shares a document in the prompt
but its continuations are new text. JSON to benchmarks/results/.

  python -m benchmarks.lookup_draft                      # 8 x 4096, 256 new tokens (the CPU demo's shape)
  python -m benchmarks.lookup_draft --temperature 0.8 --top-p 0.95
  python -m benchmarks.lookup_draft --smoke              # random tiny model, seconds
"""
from __future__ import annotations

import sys

from benchmarks import common
from magicdec_jax import drafts, prefilled, textdata
from magicdec_jax.cli import demo as cli_demo

KEYS = ("decode_s", "new_tokens", "loop_rounds", "acceptance_rate", "mean_accepted_length")


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--batch", type=int, default=cli_demo.CPU_SHAPE[0])
  ap.add_argument("--context", type=int, default=cli_demo.CPU_SHAPE[1])
  ap.add_argument("--max-new", type=int, default=cli_demo.DEMO_NEW_TOKENS)
  ap.add_argument("--self-gamma", type=int, default=cli_demo.CPU_GAMMA)
  ap.add_argument("--gammas", type=common.int_list, default=[2, 4, 6])
  ap.add_argument("--ngram", type=int, default=drafts.lookup.DEFAULT_MAX_NGRAM)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--top-p", type=float, default=1.0)
  ap.add_argument("--repeats", type=int, default=1)
  args = common.parse(ap, argv, batch=2, context=300, max_new=16, gammas=[2], repeats=1)
  model, source = common.model(args.smoke)
  sampling = dict(temperature=args.temperature, top_p=args.top_p, seed=0)
  self_draft = drafts.StreamingDraft(4, 16 if args.smoke else 256, weights="bfloat16")
  ways = {"autoregressive": {}, f"self_gamma{args.self_gamma}": {"draft": self_draft, "gamma": args.self_gamma}}
  for g in args.gammas:
    ways[f"lookup_gamma{g}"] = {"draft": drafts.PromptLookupDraft(args.ngram), "gamma": g}
  shared = cli_demo.default_shared_tokens(args.context)
  prompts = textdata.document_prompts(model.tokenizer, args.batch, args.context, shared)
  pre = prefilled.prefill(model, prompts, max_new_tokens=args.max_new, progress=not args.smoke)
  doc = {"benchmark": "lookup_draft", "env": common.env_info(), "model": source, "batch": args.batch,
         "context": args.context, "shared_tokens": pre.shared_tokens, "max_new_tokens": args.max_new,
         "sampling": sampling, "self_draft": repr(self_draft), "lookup_ngram": args.ngram,
         "repeats": args.repeats, "prefill_s": pre.prefill_s, "command": common.command(), "runs": {}}
  tokens = {}
  for _ in range(args.repeats):
    for name, kw in ways.items():
      res = prefilled.decode(model, pre, **sampling, **kw)
      doc["runs"].setdefault(name, []).append({k: res.stats.get(k) for k in KEYS})
      tokens.setdefault(name, []).append(res.tokens)
      print(f"[lookup_draft] {name}: {res.stats['decode_s']:.2f}s, acceptance {res.stats['acceptance_rate']}",
            file=sys.stderr, flush=True)
  total = {name: sum(r["decode_s"] for r in runs) for name, runs in doc["runs"].items()}
  new = {name: sum(r["new_tokens"] for r in runs) for name, runs in doc["runs"].items()}
  doc["summary"] = {name: {"tokens_per_s": new[name] / total[name],
                           "speedup": total["autoregressive"] / total[name] * new[name] / new["autoregressive"],
                           "acceptance_rate": runs[-1]["acceptance_rate"],
                           "mean_accepted_length": runs[-1]["mean_accepted_length"]}
                    for name, runs in doc["runs"].items()}
  if args.temperature == 0:
    ar = tokens["autoregressive"][0]
    doc["identical_to_ar"] = all(t == ar for ts in tokens.values() for t in ts)
  common.finish(doc, args.output, f"lookup_draft_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
