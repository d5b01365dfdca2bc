"""What structured output costs inside the speculative loop: constrained against unconstrained decoding.

SmolLM2-135M, 8 held-out prompts of 2048 tokens, prefilled once; plain decoding and MagicDec (StreamingDraft
self-draft, gamma 2), each unconstrained and under a JSON schema (at least 8 strings of at least 40 characters:
no row completes before 64 tokens), decoded in turn `--repeats` times (common.interleaved_decodes), greedy and
T 0.8 top-p 0.95. Per sampling: tokens/s of the four (summed over the repeats), constrained over unconstrained
MagicDec (goal >= 0.95), both speedups (goal: constrained >= unconstrained), acceptance, whether MagicDec's
greedy tokens equal plain decoding's, and whether the constrained outputs keep the schema's automaton alive.

  python -m benchmarks.constraints.decode --new 64
  python -m benchmarks.constraints.decode --smoke      # the random tiny model, tiny shapes: seconds
"""
from __future__ import annotations

from benchmarks import common
from magicdec_jax import constraints, drafts, prefilled

SCHEMA = {"type": "object", "required": ["lines"], "properties": {
    "lines": {"type": "array", "minItems": 8, "items": {"type": "string", "minLength": 40}}}}
SAMPLINGS = {"greedy": dict(temperature=0.0), "t0.8_p0.95": dict(temperature=0.8, top_p=0.95)}


def automaton(model):
  """SCHEMA compiled for `model`'s vocabulary (seconds: once per run)."""
  vocab = constraints.token_vocabulary(model.tokenizer, model.config.eos_token_ids, model.config.vocab_size)
  return constraints.compile_constraint(constraints.Constraint.json_schema(SCHEMA), vocab)


def walks(a, tokens: list[int]) -> bool:
  """Whether `tokens` keep automaton `a` alive from its start (a valid prefix of a valid output)."""
  s = 0
  for t in tokens:
    s = int(a.next_state[s, a.token_class[t]])
    if s < 0:
      return False
  return True


def summed(results) -> dict:
  s = sum(r.stats["decode_s"] for r in results)
  n = sum(r.stats["new_tokens"] for r in results)
  last = results[-1].stats
  return {"decode_s": round(s, 3), "new_tokens": n, "tokens_per_s": round(n / s, 2),
          "acceptance_rate": last["acceptance_rate"], "mean_accepted_length": last["mean_accepted_length"],
          "runs_tokens_per_s": [round(r.stats["tokens_per_s"], 2) for r in results]}


def main(argv=None):
  ap = common.parser(__doc__)
  common.flags(ap, batch=8, context=2048, new=64, gamma=2, sink=4, window=256, repeats=2)
  args = common.parse(ap, argv, batch=2, context=64, new=8, window=16, repeats=1)
  env = common.env_info()
  model, source = common.model(args.smoke)
  prompts, text = common.text_prompts(model, args.batch, args.context, model.config.vocab_size, held_out=True)
  pre = prefilled.prefill(model, prompts, max_new_tokens=args.new, progress=False)
  draft = drafts.StreamingDraft(args.sink, args.window)
  doc = common.record("constraint_decode", source, env=env, text=text, batch=args.batch, context=args.context,
                      new_tokens=args.new, gamma=args.gamma, draft=f"StreamingDraft({args.sink}, {args.window})",
                      schema=SCHEMA, repeats=args.repeats, prefill_s=round(pre.prefill_s, 2), samplings={})
  schema_automaton = automaton(model)
  for name, samp in SAMPLINGS.items():
    settings = {"plain": dict(samp), "magicdec": dict(samp, draft=draft, gamma=args.gamma),
                "plain_constrained": dict(samp, json_schema=SCHEMA),
                "magicdec_constrained": dict(samp, draft=draft, gamma=args.gamma, json_schema=SCHEMA)}
    runs = common.interleaved_decodes(model, pre, settings, args.repeats)
    row = {k: summed(v) for k, v in runs.items()}
    row["constrained_over_unconstrained_magicdec"] = round(
        row["magicdec_constrained"]["tokens_per_s"] / row["magicdec"]["tokens_per_s"], 3)
    row["speedup_unconstrained"] = round(row["magicdec"]["tokens_per_s"] / row["plain"]["tokens_per_s"], 3)
    row["speedup_constrained"] = round(
        row["magicdec_constrained"]["tokens_per_s"] / row["plain_constrained"]["tokens_per_s"], 3)
    row["valid_prefixes"] = all(walks(schema_automaton, t) for k in ("plain_constrained", "magicdec_constrained")
                                for r in runs[k] for t in r.tokens)
    if samp["temperature"] == 0:
      for kind, suffix in (("constrained", "_constrained"), ("unconstrained", "")):
        row[f"identical_{kind}"] = all(a.tokens == b.tokens for a, b in zip(runs["plain" + suffix],
                                                                            runs["magicdec" + suffix]))
    doc["samplings"][name] = row
    print(f"{name}: plain {row['plain']['tokens_per_s']:.1f}, MagicDec {row['magicdec']['tokens_per_s']:.1f}, "
          f"plain constrained {row['plain_constrained']['tokens_per_s']:.1f}, MagicDec constrained "
          f"{row['magicdec_constrained']['tokens_per_s']:.1f} tokens/s; constrained / unconstrained MagicDec "
          f"{row['constrained_over_unconstrained_magicdec']:.3f}; speedup {row['speedup_unconstrained']:.2f}x "
          f"unconstrained, {row['speedup_constrained']:.2f}x constrained", flush=True)
  common.finish(doc, args.output, f"constraint_decode_{common.device_tag()}.json")
  return doc


if __name__ == "__main__":
  main()
