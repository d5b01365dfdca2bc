"""Is a speculative run plain decoding bit for bit at this process's compile settings? Log-probs compared.

SmolLM2-135M (or --smoke's random tiny model) with fixed-shape numerics, greedy: prompts of --lengths
held-out Shakespeare tokens decoded plainly, with a StreamingDraft chain (gamma 3) and with a Sequoia-16
tree. Per run: rows whose tokens equal plain decoding's, rows whose log-probs are the same float32 bits, and
the largest difference. The test suite checks identity at its own compile flags (tests/conftest.py); run
this without XLA_FLAGS to check it at XLA's defaults, which is what users compile with. --xla-option
OPTION:VALUE adds an XLA option to every executable of the runs (DecodeSettings.xla_options).

  python -m benchmarks.decode.identity                                          # float32
  python -m benchmarks.decode.identity --dtype bfloat16 --xla-option xla_cpu_opt_preset:CPU_OPT_PRESET_FAST_COMPILE
  python -m benchmarks.decode.identity --smoke
"""
from __future__ import annotations

import os

import numpy as np

from benchmarks import common
from magicdec_jax import drafts, generation, trees


def compared(run, plain) -> dict:
  """Rows of `run` whose tokens / float32 log-prob bits equal `plain`'s, and the largest log-prob difference
  over the positions both rows have."""
  same_bits = diff = 0
  for a, b in zip(run.logprobs, plain.logprobs):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    n = min(len(a), len(b))
    same_bits += a.tobytes() == b.tobytes()
    diff = max(diff, float(np.max(np.abs(a[:n].astype(np.float64) - b[:n])) if n else 0.0))
  return {"rows": len(plain.tokens), "tokens_equal_rows": sum(a == b for a, b in zip(run.tokens, plain.tokens)),
          "logprob_bits_equal_rows": int(same_bits), "max_logprob_diff": diff}


def main(argv=None):
  ap = common.parser(__doc__)
  common.flags(ap, new=24, dtype="float32", lengths="300,260,120,37")
  ap.add_argument("--xla-option", type=common.xla_option, action="append", default=[])
  args = common.parse(ap, argv, new=6, lengths="40,9")
  model, source = common.model(args.smoke, args.dtype)
  lengths = common.int_list(args.lengths)
  prompts, text = common.text_prompts(model, len(lengths), max(lengths), model.config.vocab_size, held_out=True)
  prompts = [p[:n] for p, n in zip(prompts, lengths)]
  draft = drafts.StreamingDraft(4, 16 if args.smoke else 64)
  kw = dict(max_new_tokens=args.new, temperature=0.0, eos_token_id=[], logprobs=True, numerics="invariant",
            xla_options=dict(args.xla_option) or None)
  plain = generation.generate(model, prompts, **kw)
  runs = {"chain3": generation.generate(model, prompts, draft=draft, gamma=3, **kw),
          "sequoia16": generation.generate(model, prompts, draft=draft, tree=trees.default_tree("sequoia16"), **kw)}
  doc = {"benchmark": "identity", "env": common.env_info(), "command": common.command(), "model": source,
         "dtype": model.config.dtype, "text": text, "lengths": lengths, "new_tokens": args.new,
         "xla_flags": os.environ.get("XLA_FLAGS", ""), "xla_options": dict(args.xla_option),
         "draft": repr(draft), "runs": {k: compared(r, plain) for k, r in runs.items()}}
  for k, r in doc["runs"].items():
    print(f"{k}: tokens {r['tokens_equal_rows']}/{r['rows']} rows, log-prob bits {r['logprob_bits_equal_rows']}/"
          f"{r['rows']} rows, max difference {r['max_logprob_diff']:.3g}", flush=True)
  common.finish(doc, common.output_path(args.output, f"identity_{model.config.dtype}"))


if __name__ == "__main__":
  main()
