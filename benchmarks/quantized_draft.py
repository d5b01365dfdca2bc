"""What a quantized self-draft keeps and costs: StreamingDraft on bfloat16, int8 and int4 copies of the
target's weights (layers/quant.py) against plain decoding, from one shared prefill.

SmolLM2-135M float32 (the CPU demo's target), B held-out prose prompts of P tokens, `--new` new tokens,
StreamingDraft(4, 256), gamma `--gamma`; greedy, and T 0.8 top-p 0.95 (speculative rejection sampling).
Per draft weights: acceptance rate, tokens/s, the speedup over plain decoding, whether greedy tokens equal
plain decoding's (they must: the target verifies with its own weights), and the draft's one-token step
timed alone (calibrate.time_step over its sink + window ring; the weights interleaved `--step_rounds`
times, `--steps_only` for that alone) against the bfloat16 copy's. Settings are
interleaved `--repeats` times after one untimed compile call each; medians. Sampled acceptance is the mean
over `--seeds` seeds (one sampled run of 8 x 128 tokens varies by about +-0.02).

  python -m benchmarks.quantized_draft                     # 8 x 4096, 128 new tokens, ~25 min on 2 CPU cores
  python -m benchmarks.quantized_draft --smoke             # random tiny model, about a minute
"""
from __future__ import annotations

import statistics

from benchmarks import common
from magicdec_jax import drafts, prefilled
from magicdec_jax.layers import quant
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.measure import calibrate

WEIGHTS = ("bfloat16", "int8", "int4")
SAMPLINGS = {"greedy": dict(temperature=0.0), "t0.8-topp0.95": dict(temperature=0.8, top_p=0.95)}


def main(argv=None) -> str:
  ap = common.parser(__doc__)
  ap.add_argument("--shape", default="8x4096", help="BxP: prompts x prompt tokens")
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--gamma", type=int, default=2)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--weights", default=",".join(WEIGHTS))
  ap.add_argument("--samplings", default=",".join(SAMPLINGS))
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--step_repeats", type=int, default=20, help="timed steps per weights and round")
  ap.add_argument("--step_rounds", type=int, default=3, help="rounds of step timing, the weights interleaved")
  ap.add_argument("--steps_only", action="store_true", help="time the draft steps only (no decoding)")
  ap.add_argument("--seeds", type=int, default=1,
                  help="sampled acceptance over this many seeds (0 .. n-1; seed 0 also timed, the rest decoded once)")
  ap.add_argument("--int4_group", type=int, default=None,
                  help="int4 group size (layers/quant.INT4_GROUP; 0: one scale per output channel; default by backend)")
  ap.add_argument("--int4_keep_int8", default=None,
                  help="comma-separated names an int4 copy keeps in int8 (layers/quant.INT4_KEEP_INT8; "
                       "'none': all int4; default: the library's)")
  ap.add_argument("--int4_symmetric", action="store_true",
                  help="int4 without offsets (layers/quant.INT4_OFFSETS = False: max |w| / 7, as before 2026-11-27)")
  a = common.parse(ap, argv, shape="4x96", new=16, repeats=1, window=32, step_repeats=3, step_rounds=1)
  b, p = common.shape_list(a.shape)[0]
  if a.int4_group is not None:
    quant.INT4_GROUP = a.int4_group
  if a.int4_symmetric:
    quant.INT4_OFFSETS = False
  if a.int4_keep_int8 is not None:
    quant.INT4_KEEP_INT8 = tuple(n for n in a.int4_keep_int8.split(",") if n and n != "none")
  model, source = common.model(a.smoke)
  cfg = model.config
  kinds = a.weights.split(",")
  copies = {w: weight_copy(model.params, w) for w in kinds}
  times = {w: [] for w in kinds}
  for _ in range(a.step_rounds):                           # the draft's step alone, its weights as it reads them,
    for w in kinds:                                        # the weights interleaved round by round
      times[w] += calibrate.time_step(copies[w], cfg, b, a.sink + a.window, 1, "ring", a.step_repeats)["times"]
  del copies
  steps = {w: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "steps_timed": len(t)}
           for w, t in times.items()}
  if "bfloat16" in steps:
    for w in kinds:
      steps[w]["over_bfloat16"] = steps[w]["median_ms"] / steps["bfloat16"]["median_ms"]
  doc = {"benchmark": "quantized_draft", "env": common.env_info(), "command": common.command(), "model": source,
         "dtype": cfg.dtype, "batch": b, "int8_dot": quant.int8_dot(), "int4_group": quant.int4_group(),
         "int4_keep_int8": list(quant.INT4_KEEP_INT8), "int4_offsets": quant.INT4_OFFSETS, "draft_step": steps}
  if a.steps_only:
    doc.update(benchmark="quantized_draft (steps only)", ring=a.sink + a.window)
    return common.finish(doc, a.output, f"quantized_draft_steps_{b}_{common.device_tag()}.json")
  prompts, text = common.text_prompts(model, b, p, cfg.vocab_size, held_out=not a.smoke)
  pre = prefilled.prefill(model, prompts, max_new_tokens=a.new, progress=False)
  settings = {}
  for sname in a.samplings.split(","):
    settings[(sname, "plain")] = dict(SAMPLINGS[sname])
    for w in kinds:
      settings[(sname, w)] = dict(SAMPLINGS[sname], draft=drafts.StreamingDraft(a.sink, a.window, weights=w),
                                  gamma=a.gamma)
  runs = common.interleaved_decodes(model, pre, settings, a.repeats)
  out = {}
  for (sname, w), rs in runs.items():
    sec = statistics.median(r.stats["decode_s"] for r in rs)
    rates = [rs[0].stats.get("acceptance_rate")]
    if w != "plain" and SAMPLINGS[sname].get("temperature", 0.0) > 0:      # more seeds: acceptance only
      rates += [prefilled.decode(model, pre, **settings[(sname, w)], seed=seed).stats["acceptance_rate"]
                for seed in range(1, a.seeds)]
    out.setdefault(sname, {})[w] = {"decode_s": sec, "tokens_per_s": b * a.new / sec,
                                    "acceptance_rate": None if rates[0] is None else statistics.mean(rates),
                                    "decode_s_all": [r.stats["decode_s"] for r in rs]}
    if len(rates) > 1:
      out[sname][w]["acceptance_by_seed"] = rates
  for sname, rows in out.items():
    plain = rows["plain"]
    for w in kinds:
      rows[w]["speedup"] = rows[w]["tokens_per_s"] / plain["tokens_per_s"]
      if "bfloat16" in rows and rows["bfloat16"]["acceptance_rate"]:
        rows[w]["acceptance_over_bfloat16"] = rows[w]["acceptance_rate"] / rows["bfloat16"]["acceptance_rate"]
      if sname == "greedy":
        want = runs[(sname, "plain")][0].tokens
        rows[w]["rows_identical_to_plain"] = sum(x == y for x, y in zip(want, runs[(sname, w)][0].tokens))
  doc.update(env=common.env_info(), text=text, prompt_tokens=p, new_tokens=a.new, gamma=a.gamma,
             draft=f"StreamingDraft({a.sink}, {a.window}, weights=...)", repeats=a.repeats, seeds=a.seeds,
             decode=out)
  tag = f"{b}x{p}" + ("_smoke" if a.smoke else "")
  return common.finish(doc, a.output, f"quantized_draft_{tag}_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
