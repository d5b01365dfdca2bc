"""What fixed-shape numerics cost, and whether they deliver: plain decoding and MagicDec with
`numerics="fast"` and `"invariant"` (layers/invariant.py) from one shared prefill.

SmolLM2-135M (the demo's model; --dtype bfloat16 for the dtype GPU users run), B prompts of P tokens
(held-out Shakespeare plays, distinct passages), `--new` new tokens, the demo's draft (StreamingDraft sink 4 +
window 256; a float32 target drafts with a bfloat16 weight copy), gamma `--gamma`. Every setting decodes
the same prefilled caches, the settings interleaved `--repeats` times (the first call of each compiles and is
not timed: its decode is run once before). Per setting: the median decode seconds, ms per step / round,
tokens/s; per numerics: MagicDec's speedup over plain decoding of the same numerics and whether their tokens
are identical (rows identical of B); across numerics: the cost (fast tokens/s / invariant tokens/s).
`--temperature 0.8 --top_p 0.95` decodes with invariant sampling (samples are then plain decoding's).
`--design NAME=FIELD:VALUE,...` adds invariant numerics at other fixed shapes (backend.FixedShapes fields, e.g.
`--design rows8=decode_rows:8-8 --design padded=pad_query_tile:1`), decoded interleaved with the rest.

  python -m benchmarks.invariant_numerics                       # 8 x 4096 float32, ~15 min on the 2-core CPU
  python -m benchmarks.invariant_numerics --dtype bfloat16 --shape 4x512 --new 96
  python -m benchmarks.invariant_numerics --smoke               # random tiny model, seconds
"""
from __future__ import annotations

import dataclasses
import statistics

from benchmarks import common
from magicdec_jax import backend, drafts, prefilled


def design(text: str) -> tuple[str, backend.FixedShapes]:
  """'NAME=field:value,...' -> (NAME, the backend's FixedShapes with those fields; ranges as lo-hi)."""
  name, _, fields = text.partition("=")
  changes = {}
  for item in filter(None, fields.split(",")):
    key, _, value = item.partition(":")
    changes[key] = tuple(int(x) for x in value.split("-")) if "-" in value else int(value)
  if "pad_query_tile" in changes:
    changes["pad_query_tile"] = bool(changes["pad_query_tile"])
  return name, dataclasses.replace(backend.fixed_shapes(), **changes)


def main(argv=None) -> str:
  ap = common.parser(__doc__)
  ap.add_argument("--shape", default="8x4096", help="BxP: prompts x prompt tokens")
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--gamma", type=int, default=2)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--numerics", default="fast,invariant")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--top_p", type=float, default=1.0)
  ap.add_argument("--design", action="append", default=[],
                  help="NAME=field:value,...: invariant numerics at other fixed shapes (backend.FixedShapes)")
  a = common.parse(ap, argv, shape="4x64", new=8, repeats=1)
  designs = dict(design(d) for d in a.design)
  b, p = common.shape_list(a.shape)[0]
  model, source = common.model(a.smoke, a.dtype)
  prompts, text = common.text_prompts(model, b, p, model.config.vocab_size, held_out=not a.smoke)
  pre = prefilled.prefill(model, prompts, max_new_tokens=a.new, progress=False)
  weights = "bfloat16" if a.dtype == "float32" else None
  sample = dict(temperature=a.temperature, top_p=a.top_p, sampling="invariant" if a.temperature else "rejection")
  settings = {}
  numerics = {n: dict(numerics=n) for n in a.numerics.split(",")}
  numerics.update({name: dict(numerics="invariant", fixed_shapes=f) for name, f in designs.items()})
  for n, kw in numerics.items():
    settings[f"{n}/plain"] = dict(**kw, **sample)
    settings[f"{n}/magicdec"] = dict(**kw, draft=drafts.StreamingDraft(4, 256, weights=weights), gamma=a.gamma,
                                     **sample)
  runs = common.interleaved_decodes(model, pre, settings, a.repeats)
  rows = {}
  for k, rs in runs.items():
    sec = statistics.median(r.stats["decode_s"] for r in rs)
    steps = rs[0].stats["verify_steps"] / b
    rows[k] = {"decode_s": sec, "decode_s_all": [r.stats["decode_s"] for r in rs],
               "tokens_per_s": b * a.new / sec, "steps_per_row": steps, "ms_per_step": 1e3 * sec / max(steps, 1),
               "acceptance_rate": rs[0].stats.get("acceptance_rate")}
  tokens = {k: rs[0].tokens for k, rs in runs.items()}
  per_numerics = {}
  for n in numerics:
    plain, md = f"{n}/plain", f"{n}/magicdec"
    per_numerics[n] = {"speedup": rows[md]["tokens_per_s"] / rows[plain]["tokens_per_s"],
                       "rows_identical_to_plain": sum(x == y for x, y in zip(tokens[plain], tokens[md])),
                       "rows": b}
  names = list(numerics)
  cost = {}
  if "fast" in names:
    for n in names[1:] if names[0] == "fast" else [x for x in names if x != "fast"]:
      cost[n] = {kind: rows[f"fast/{kind}"]["tokens_per_s"] / rows[f"{n}/{kind}"]["tokens_per_s"]
                 for kind in ("plain", "magicdec")}
  doc = {"benchmark": "invariant_numerics", "env": common.env_info(), "command": common.command(),
         "model": source, "dtype": a.dtype, "text": text, "batch": b, "prompt_tokens": p, "new_tokens": a.new,
         "gamma": a.gamma, "draft": f"StreamingDraft(4, 256, weights={weights})", "sampling": sample,
         "repeats": a.repeats,
         "fixed_shapes": {n: dataclasses.asdict(kw.get("fixed_shapes") or backend.fixed_shapes())
                          for n, kw in numerics.items() if kw["numerics"] == "invariant"},
         "settings": rows, "per_numerics": per_numerics,
         "cost_fast_over_numerics_tokens_per_s": cost,
         "plain_tokens_identical_across_numerics": (tokens.get("fast/plain") == tokens.get("invariant/plain")
                                                    if len(names) > 1 else None)}
  tag = f"{b}x{p}_{a.dtype}" + ("_smoke" if a.smoke else "")
  return common.finish(doc, a.output, f"invariant_numerics_{tag}_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
