"""Chain versus Sequoia trees on SmolLM2-135M over Shakespeare (CPU): tokens per verify step, speed, exactness.

For one draft (StreamingDraft sink + window by default) and real prompts, runs autoregressive decoding and
speculative decoding with a chain of gamma and with each shipped Sequoia tree, greedy and sampled, through
the same `generate`. Records per configuration: mean accepted length (tokens emitted per verify step, bonus
included), acceptance rate, decode tokens/s and the speedup over the autoregressive run measured in the
same process; for greedy runs, whether the tokens equal the autoregressive ones. Each configuration is run
once untimed (compilation) and then timed.

  python -m benchmarks.trees_vs_chain                      # 4 x 1024-token prompts, 48 new tokens
  python -m benchmarks.trees_vs_chain --batch 2 --context 512 --max-new 32
"""
from __future__ import annotations

import sys

from benchmarks import common
from magicdec_jax import StreamingDraft, trees
from magicdec_jax.engine import generate


def run(model, prompts, draft, tree, gamma, temperature, max_new, seed=0):
  kw = dict(max_new_tokens=max_new, temperature=temperature, seed=seed, eos_token_id=[])
  if draft is not None:
    kw.update(draft=draft, gamma=gamma, tree=tree)
  generate(model, prompts, **kw)           # compile
  return generate(model, prompts, **kw)


def main(argv=None):
  ap = common.parser(__doc__, smoke=None)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--context", type=int, default=1024)
  ap.add_argument("--max-new", type=int, default=48)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=128)
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--trees", default="sequoia16,sequoia32,sequoia64")
  ap.add_argument("--temperatures", default="0,0.8")
  args = common.parse(ap, argv)
  model, source = common.model(args.smoke)
  prompts, text = common.text_prompts(model, args.batch, args.context, model.config.vocab_size)
  draft = StreamingDraft(sink=args.sink, window=args.window)
  doc = {"benchmark": "trees_vs_chain", "env": common.env_info(), "model": source, "text": text,
         "batch": args.batch, "context": args.context, "max_new_tokens": args.max_new,
         "draft": {"kind": "StreamingDraft", "sink": args.sink, "window": args.window}, "rows": []}
  for temp in [float(t) for t in args.temperatures.split(",")]:
    ar = run(model, prompts, None, None, 0, temp, args.max_new)
    ar_tps = ar.stats["tokens_per_s"]
    doc["rows"].append({"temperature": temp, "config": "autoregressive", "tokens_per_s": ar_tps})
    configs = [(f"chain{args.gamma}", None)] + [(n, trees.default_tree(n)) for n in args.trees.split(",") if n]
    for name, tree in configs:
      res = run(model, prompts, draft, tree, args.gamma, temp, args.max_new)
      s = res.stats
      row = {"temperature": temp, "config": name, "tree_nodes": s["tree_nodes"],
             "tree_depth": tree.max_depth if tree is not None else args.gamma,
             "mean_accepted_length": s["mean_accepted_length"], "acceptance_rate": s["acceptance_rate"],
             "tokens_per_s": s["tokens_per_s"], "speedup_vs_ar": s["tokens_per_s"] / ar_tps}
      if temp == 0:
        row["identical_to_ar"] = res.tokens == ar.tokens
      doc["rows"].append(row)
      print(f"[T={temp} {name}] mean accepted {s['mean_accepted_length']:.2f}, "
            f"{s['tokens_per_s']:.1f} tok/s vs AR {ar_tps:.1f}", file=sys.stderr, flush=True)
  common.finish(doc, args.output, f"trees_vs_chain_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
