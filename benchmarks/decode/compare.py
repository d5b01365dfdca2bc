"""Decoding settings compared from one prefill: tokens/s, acceptance, exactness. SmolLM2-135M, CPU or GPU.

A study (the first argument) names a set of settings, which decode copies of one prefill per shape (held-out
Shakespeare or the demo's document prompts) in turn `--repeats` times (common.interleaved_decodes). Per
setting: median decode seconds, tokens/s, ms per loop round, acceptance, and against its group's reference
the speedup and the rows with identical tokens. The self-draft is the demo's: StreamingDraft sink 4 + window
256 (`--window`) on a bfloat16 copy of the float32 weights.

  quantized  the self-draft on bfloat16 / int8 / int4 copies (`--weights`) against plain decoding, greedy and
             T 0.8 top-p 0.95 (sampled acceptance over `--seeds` seeds), the draft's step timed alone first
             (calibrate.time_step, the copies interleaved `--step-rounds` times; `--steps-only`: that alone);
             `--int4-group`, `--int4-keep-int8`, `--int4-symmetric` vary the copies' QuantForm (the draft's field)
  numerics   numerics "fast" and "invariant", plain and MagicDec, with invariant / fast per loop round over the
             repeats' pairs (median, 95% interval); `--design NAME=FIELD:VALUE,...` adds invariant
             numerics at other fixed shapes (backend.FixedShapes fields, ranges as lo-hi, e.g.
             `--design rows8=decode_rows:8-8 --design kb64=key_block:64`); `--dtype bfloat16` for GPUs' dtype
  lookup     prompt lookup (PromptLookupDraft, chains of `--gammas`) beside the self-draft, the demo's prompts
  sampling   invariant against rejection sampling at each of `--temperatures` (top-p `--top-p`)
  filters    greedy, T 0.8, T 0.8 top-p 0.95, T 0.8 top-k 50; and the filter alone (sampling.probabilities, ms
             per row on the model's logits and on Gumbel logits over `--vocabs`) beside the sorted filter
  logprobs   logprobs off / on / top-5, greedy and T 0.8 top-p 0.95 (invariant sampling)
  mixed      every row greedy, every row T 0.8 top-p 0.95, and half of each in one batch (row_sampling)
  trees      a chain of `--gamma` against each shipped Sequoia tree (`--trees`), greedy and T 0.8
  shrink     MagicDec in a fixed batch and in a shrinking one (shrink_batch=True), the demo's prompts
  identity   plain decoding, a chain of `--gamma` and a Sequoia-16 tree (StreamingDraft 4 + 64, the model's
             weights) by `generate`, fixed-shape numerics, greedy (or invariant sampling at `--temperature`,
             `--top-p`), on held-out prompts of `--lengths` tokens:
             rows with plain's tokens and float32 log-prob bits, the largest difference (not timed; without
             XLA_FLAGS: XLA's defaults; `--xla-option OPTION:VALUE` adds an option to every executable)

  python -m benchmarks.decode.compare quantized                     # 8 x 4096, 128 new tokens, ~25 min (2 CPUs)
  python -m benchmarks.decode.compare numerics --shapes 8x4096 --new 32
  python -m benchmarks.decode.compare filters --shapes 8x1024:64,8x4096:128
  python -m benchmarks.decode.compare identity --xla-option xla_cpu_opt_preset:CPU_OPT_PRESET_FAST_COMPILE
  python -m benchmarks.decode.compare lookup --smoke                # random tiny model, seconds
"""
from __future__ import annotations

import dataclasses
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import backend, drafts, generation, prefilled, sampling, textdata, trees
from magicdec_jax.cli import demo as cli_demo
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.measure import calibrate

GREEDY, TOPP = dict(temperature=0.0), dict(temperature=0.8, top_p=0.95)
FILTERS = {"greedy": GREEDY, "t0.8": dict(temperature=0.8), "t0.8-topp0.95": TOPP,
           "t0.8-topk50": dict(temperature=0.8, top_k=50)}
# study -> its defaults (shapes BxP[:NEW], new tokens, repeats, gamma, warm-up call, prompts: held-out or the
# demo's document prompts) and the variant every group is compared with
STUDIES = {
    "quantized": dict(shapes="8x4096", new=128, repeats=2, gamma=2, warm=True, prompts="held_out", ref="plain"),
    "numerics": dict(shapes="8x4096", new=64, repeats=2, gamma=2, warm=True, prompts="held_out", ref="plain"),
    "lookup": dict(shapes="8x4096", new=256, repeats=1, gamma=2, warm=False, prompts="document", ref="plain"),
    "sampling": dict(shapes="8x4096", new=128, repeats=1, gamma=2, warm=False, prompts="held_out", ref="plain"),
    "filters": dict(shapes="8x1024:64,8x4096:128", new=64, repeats=1, gamma=2, warm=False, prompts="held_out",
                    ref="plain"),
    "logprobs": dict(shapes="8x1024", new=64, repeats=3, gamma=2, warm=True, prompts="held_out", ref="off"),
    "mixed": dict(shapes="8x1024", new=64, repeats=3, gamma=2, warm=True, prompts="held_out", ref="greedy"),
    "trees": dict(shapes="4x1024", new=48, repeats=1, gamma=4, warm=True, prompts="text", ref="plain", window=128),
    "shrink": dict(shapes="8x4096,8x8000", new=64, repeats=2, gamma=2, warm=False, prompts="document", ref="plain"),
    "identity": dict(shapes="4x300", new=24, repeats=1, gamma=3, warm=False, prompts="held_out", window=64),
}
SMOKE = dict(shapes="2x96", new=8, repeats=1, window=16, gammas=[2], vocabs=[512], lengths="40,9",
             filter_rows=4, trees="sequoia16", seeds=2, step_repeats=2, step_rounds=1)
KEYS = ("loop_rounds", "acceptance_rate", "mean_accepted_length", "batch_stages")


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


def settings_of(study: str, a) -> dict:
  """'group/variant' -> prefilled.decode keywords."""
  self_draft = dict(draft=drafts.StreamingDraft(4, a.window, weights=a.draft_weights), gamma=a.gamma)
  out = {}
  if study == "quantized":
    for s in a.samplings:
      out[f"{s}/plain"] = dict(FILTERS[s])
      for w in a.weights:
        out[f"{s}/{w}"] = dict(FILTERS[s], draft=common.QuantFormDraft(4, a.window, weights=w, form=a.form),
                               gamma=a.gamma)
  elif study == "numerics":
    sample = dict(temperature=a.temperature, top_p=a.top_p, sampling="invariant" if a.temperature else "rejection")
    groups = {"fast": dict(numerics="fast"), "invariant": dict(numerics="invariant"),
              **{n: dict(numerics="invariant", fixed_shapes=f) for n, f in a.designs.items()}}
    for n, kw in groups.items():
      out[f"{n}/plain"] = dict(sample, **kw)
      out[f"{n}/magicdec"] = dict(sample, **kw, **self_draft)
  elif study == "lookup":
    out["all/plain"], out[f"all/self_gamma{a.gamma}"] = {}, self_draft
    for g in a.gammas:
      out[f"all/lookup_gamma{g}"] = dict(draft=drafts.PromptLookupDraft(), gamma=g)
    out = {k: dict(v, temperature=a.temperature, top_p=a.top_p, seed=0) for k, v in out.items()}
  elif study == "sampling":
    for t in a.temperatures:
      for mode in sampling.MODES:
        kw = dict(temperature=t, top_p=a.top_p, seed=0, sampling=mode)
        out[f"t{t}/{mode}/plain"], out[f"t{t}/{mode}/magicdec"] = kw, dict(kw, **self_draft)
  elif study == "filters":
    for name, kw in FILTERS.items():
      out[f"{name}/plain"], out[f"{name}/magicdec"] = dict(kw, seed=0), dict(kw, seed=0, **self_draft)
  elif study == "logprobs":
    lps = {"off": {}, "on": dict(logprobs=True), "top5": dict(logprobs=True, top_logprobs=5)}
    for mode, kw in {"greedy": GREEDY, "t0.8-topp0.95": dict(TOPP, seed=0, sampling="invariant")}.items():
      for dec, dkw in {"plain": {}, "magicdec": self_draft}.items():
        out.update({f"{mode}/{dec}/{lp}": dict(kw, **dkw, **lkw) for lp, lkw in lps.items()})
  elif study == "mixed":
    mix = [{} if i % 2 == 0 else dict(TOPP) for i in range(a.batch)]
    out = {"all/greedy": dict(self_draft, seed=0), "all/sampled": dict(self_draft, seed=0, **TOPP),
           "all/mixed": dict(self_draft, seed=0, row_sampling=mix)}
  elif study == "trees":
    d = drafts.StreamingDraft(4, a.window)
    for t in a.temperatures:
      kw = dict(temperature=t, seed=0, eos_token_id=[])
      out[f"t{t}/plain"], out[f"t{t}/chain{a.gamma}"] = kw, dict(kw, draft=d, gamma=a.gamma)
      out.update({f"t{t}/{n}": dict(kw, draft=d, tree=trees.default_tree(n)) for n in a.trees.split(",") if n})
  elif study == "shrink":
    out = {"all/plain": {}, "all/fixed": self_draft, "all/shrinking": dict(self_draft, shrink_batch=True)}
  return out


def prompts_of(a, model, b: int, p: int) -> list:
  if a.prompts == "document":
    return textdata.document_prompts(model.tokenizer, b, p, cli_demo.default_shared_tokens(p))
  return common.text_prompts(model, b, p, model.config.vocab_size, held_out=a.prompts == "held_out"
                             and not a.smoke)[0]


def measure(model, pre, settings: dict, a, ref: str) -> dict:
  """name -> figures of each setting, with speedup and identical rows against its group's `ref` setting."""
  runs = common.interleaved_decodes(model, pre, settings, a.repeats, warm=a.warm)
  rows = {}
  for name, rs in runs.items():
    sec = statistics.median(r.stats["decode_s"] for r in rs)
    s = rs[0].stats
    rows[name] = dict({k: s.get(k) for k in KEYS}, decode_s=sec, decode_s_all=[r.stats["decode_s"] for r in rs],
                      tokens_per_s=s["new_tokens"] / sec, ms_per_round=1e3 * sec / max(s["loop_rounds"], 1))
    common.log(f"[compare] {name}: {rows[name]['tokens_per_s']:.1f} tok/s, acceptance {s.get('acceptance_rate')}")
  for name, row in rows.items():
    base = name.rsplit("/", 1)[0] + "/" + ref
    if base in rows:
      row["speedup"] = row["tokens_per_s"] / rows[base]["tokens_per_s"]
      row["rows_identical_to_" + ref] = sum(x == y for x, y in zip(runs[base][0].tokens, runs[name][0].tokens))
  return rows, runs


def draft_steps(model, a) -> dict:
  """The self-draft's one-token step over its sink + window ring on each weight copy, alone, interleaved."""
  b = common.shape_list(a.shapes.split(":")[0])[0][0]
  copies = {w: weight_copy(model.params, w, a.form) for w in a.weights}
  times = {w: [] for w in a.weights}
  for _ in range(a.step_rounds):
    for w in a.weights:
      times[w] += calibrate.time_step(copies[w], model.config, b, 4 + a.window, 1, "ring", a.step_repeats)["times"]
  steps = {w: {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "steps_timed": len(t)}
           for w, t in times.items()}
  for w in steps:
    if "bfloat16" in steps:
      steps[w]["over_bfloat16"] = steps[w]["median_ms"] / steps["bfloat16"]["median_ms"]
  return steps


def sorted_probabilities(logits, s: sampling.Sampling):
  """The top-k / top-p filter as it was before the sort-free one (lax.top_k, a full sort + cumsum)."""
  x = logits.astype(jnp.float32) / s.temperature
  if s.top_k and s.top_k < x.shape[-1]:
    x = jnp.where(x < jax.lax.top_k(x, s.top_k)[0][..., -1:], -jnp.inf, x)
  if s.top_p < 1.0:
    sx = jnp.sort(x, axis=-1)[..., ::-1]
    sp = jax.nn.softmax(sx, axis=-1)
    keep = jnp.cumsum(sp, axis=-1) - sp < s.top_p
    x = jnp.where(x < jnp.min(jnp.where(keep, sx, jnp.inf), axis=-1, keepdims=True), -jnp.inf, x)
  return jax.nn.softmax(x, axis=-1)


def filter_timings(model, a) -> list[dict]:
  """ms per row of the sort-free filter and the sorted one, per vocabulary and sampled setting."""
  text = common.text_prompts(model, 1, 4 * a.filter_rows, model.config.vocab_size, held_out=not a.smoke)[0]
  own = generation.logits(model, text)[0, ::4]
  out = []
  for v in [model.config.vocab_size] + a.vocabs:
    x = own if v == model.config.vocab_size else 4.0 * jax.random.gumbel(jax.random.key(v), (a.filter_rows, v))
    for name, kw in list(FILTERS.items())[1:]:
      s, rec, probs = sampling.Sampling(**kw), {"vocab": v, "setting": name}, {}
      rec["logits"] = "the model's on held-out text" if x is own else "gumbel x 4"
      for impl, fn in (("sortfree", sampling.probabilities), ("sort", sorted_probabilities)):
        jf = jax.jit(lambda y, fn=fn: fn(y, s))
        rec[f"{impl}_ms_per_row"] = common.median_time(lambda: jf(x), 5)[0] * 1e3 / x.shape[0]
        probs[impl] = np.asarray(jf(x))
      rec["same_kept_set"] = bool(((probs["sortfree"] > 0) == (probs["sort"] > 0)).all())
      rec["max_abs_prob_diff"] = float(np.abs(probs["sortfree"] - probs["sort"]).max())
      out.append(rec)
  return out


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


def identity(model, source: str, a) -> str:
  """The identity study (not timed): plain decoding, a chain and a tree by `generate`, compared."""
  lengths = common.int_list(a.lengths)
  prompts, text = common.text_prompts(model, len(lengths), max(lengths), model.config.vocab_size, held_out=True)
  prompts = [p[:n] for p, n in zip(prompts, lengths)]
  draft = drafts.StreamingDraft(4, a.window)
  kw = dict(max_new_tokens=a.new, temperature=a.temperature, top_p=a.top_p, seed=0, eos_token_id=[], logprobs=True,
            sampling="invariant", numerics="invariant", xla_options=dict(a.xla_option) or None)
  plain = generation.generate(model, prompts, **kw)
  runs = {f"chain{a.gamma}": generation.generate(model, prompts, draft=draft, gamma=a.gamma, **kw),
          "sequoia16": generation.generate(model, prompts, draft=draft, tree=trees.default_tree("sequoia16"), **kw)}
  doc = common.record("identity", source, model.config.dtype, text=text, lengths=lengths, new_tokens=a.new,
                      temperature=a.temperature, top_p=a.top_p,
                      xla_flags=os.environ.get("XLA_FLAGS", ""), xla_options=dict(a.xla_option), draft=repr(draft),
                      runs={k: compared(r, plain) for k, r in runs.items()})
  tag = f"_t{a.temperature:g}_topp{a.top_p:g}" if a.temperature else ""
  return common.finish(doc, common.output_path(a.output, f"identity_{model.config.dtype}{tag}"))


def main(argv=None) -> str:
  ap = common.parser(__doc__)
  ap.add_argument("study", choices=list(STUDIES))
  ap.add_argument("--shapes", default=None, help="BxP[:NEW],... (default: the study's)")
  for flag, typ in (("--new", int), ("--repeats", int), ("--gamma", int)):
    ap.add_argument(flag, type=typ, default=None, help="default: the study's")
  ap.add_argument("--prompts", choices=["held_out", "document", "text"], default=None,
                  help="default: the study's (document: the demo's shared document, a passage per row)")
  ap.add_argument("--window", type=int, default=None, help="the self-draft's window (default 256; trees 128)")
  ap.add_argument("--draft-weights", default="bfloat16", help="the self-draft's weights ('none': the model's)")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--weights", type=lambda t: t.split(","), default=["bfloat16", "int8", "int4"])
  ap.add_argument("--samplings", type=lambda t: t.split(","), default=["greedy", "t0.8-topp0.95"])
  ap.add_argument("--seeds", type=int, default=1, help="quantized: sampled acceptance over seeds 0 .. n-1")
  ap.add_argument("--steps-only", action="store_true")
  common.flags(ap, step_repeats=20, step_rounds=3, filter_rows=24, lengths="300,260,120,37")
  ap.add_argument("--xla-option", type=common.xla_option, action="append", default=[], help="identity: OPTION:VALUE")
  ap.add_argument("--int4-group", type=int, default=None, help="QuantForm.group (0: one scale per channel)")
  ap.add_argument("--int4-keep-int8", default=None, help="QuantForm.keep_int8, comma-separated ('none': all int4)")
  ap.add_argument("--int4-symmetric", action="store_true", help="QuantForm.offsets = False")
  ap.add_argument("--design", action="append", default=[],
                  help="numerics: NAME=field:value,... invariant numerics at other fixed shapes (backend.FixedShapes)")
  ap.add_argument("--temperature", type=float, default=0.0, help="numerics, lookup, identity: the sampling")
  ap.add_argument("--temperatures", type=lambda t: [float(x) for x in t.split(",")], default=None)
  ap.add_argument("--top-p", type=float, default=None)
  ap.add_argument("--gammas", type=common.int_list, default=[2, 4, 6])
  ap.add_argument("--trees", default="sequoia16,sequoia32,sequoia64")
  ap.add_argument("--vocabs", type=common.int_list, default=[152064])
  ap.add_argument("--label", default="", help="a tag for the output's name (e.g. 'before')")
  a = common.parse(ap, argv, **SMOKE)
  st = STUDIES[a.study]
  a.designs = dict(design(d) for d in a.design)
  for k in ("shapes", "new", "repeats", "gamma"):
    if getattr(a, k) is None or (a.smoke and k == "gamma"):
      setattr(a, k, st[k])
  a.warm, a.prompts = st["warm"], a.prompts or st["prompts"]
  if a.temperatures is None:
    a.temperatures = {"sampling": [0.8] if a.smoke else [0.6, 0.8, 1.0], "trees": [0.0, 0.8]}.get(a.study, [0.8])
  if a.top_p is None:
    a.top_p = 0.95 if a.study == "sampling" else 1.0
  a.window = a.window or st.get("window", 256)
  a.draft_weights = None if a.draft_weights == "none" or a.dtype == "bfloat16" else a.draft_weights
  model, source = common.model(a.smoke, a.dtype)
  if a.study == "identity":
    return identity(model, source, a)
  keep = None if a.int4_keep_int8 is None else tuple(n for n in a.int4_keep_int8.split(",") if n and n != "none")
  doc = common.record("compare", source, model.config.dtype, study=a.study, draft=f"StreamingDraft(4, {a.window}, "
                      f"weights={a.draft_weights})", gamma=a.gamma, repeats=a.repeats, prompts=a.prompts, points=[])
  shape_tag = a.shapes.split(",")[0].split(":")[0]
  path = a.output or str(common.RESULTS_DIR / f"compare_{a.study}{'_' + a.label if a.label else ''}_{shape_tag}_"
                         f"{common.device_tag()}.json")
  a.form = common.int4_form(a.int4_group, keep, a.int4_symmetric)
  if a.study == "quantized":
    doc["int4"] = {"group": a.form.group, "keep_int8": list(a.form.keep_int8), "offsets": a.form.offsets}
    doc["draft_step"] = draft_steps(model, a)
    if a.steps_only:
      return common.finish(doc, path)
  if a.study == "numerics":
    doc["fixed_shapes"] = {n: dataclasses.asdict(f) for n, f in
                           {"invariant": backend.fixed_shapes(), **a.designs}.items()}
  if a.study == "filters":
    doc["filter"] = filter_timings(model, a)
  for spec in a.shapes.split(","):
    (b, p), new = common.shape_list(spec.split(":")[0])[0], int(spec.split(":")[1]) if ":" in spec else a.new
    a.batch = b
    prompts = prompts_of(a, model, b, p)
    # the numerics study decodes each numerics and design from its own prefill (prefilled.decode refuses others)
    groups = {None: (None, None)}
    if a.study == "numerics":
      groups = {"fast": ("fast", None), "invariant": ("invariant", None),
                **{n: ("invariant", f) for n, f in a.designs.items()}}
    pres = {n: prefilled.prefill(model, prompts, max_new_tokens=new, progress=not a.smoke, numerics=num,
                                 fixed_shapes=f) for n, (num, f) in groups.items()}
    pre = {groups[n]: x for n, x in pres.items()} if a.study == "numerics" else pres[None]
    rows, runs = measure(model, pre, settings_of(a.study, a), a, st["ref"])
    prefill_s = {n: x.prefill_s for n, x in pres.items()} if a.study == "numerics" else pres[None].prefill_s
    point = {"batch": b, "context": p, "new": new, "prefill_s": prefill_s,
             "shared_tokens": next(iter(pres.values())).shared_tokens,
             "settings": rows}
    extra(a, model, pre, point, runs)
    doc["points"].append(point)
    common.write_json(doc, path)
  return common.finish(doc, path)


def extra(a, model, pre, point: dict, runs: dict) -> None:
  """A study's own figures beyond the common ones."""
  rows = point["settings"]
  if a.study == "quantized" and a.seeds > 1:
    settings = settings_of("quantized", a)
    for name, row in rows.items():
      kw = settings[name]
      if kw.get("draft") is not None and kw.get("temperature", 0) > 0:
        row["acceptance_by_seed"] = [row["acceptance_rate"]] + [
            prefilled.decode(model, pre, **kw, seed=s).stats["acceptance_rate"] for s in range(1, a.seeds)]
        row["acceptance_rate"] = statistics.mean(row["acceptance_by_seed"])
  if a.study == "quantized":
    for name, row in rows.items():
      bf = rows.get(name.split("/")[0] + "/bfloat16", {}).get("acceptance_rate")
      if bf and row["acceptance_rate"]:
        row["acceptance_over_bfloat16"] = row["acceptance_rate"] / bf
  if a.study == "numerics":
    point["cost_fast_over_invariant"] = {k: rows[f"fast/{k}"]["tokens_per_s"] / rows[f"invariant/{k}"]["tokens_per_s"]
                                         for k in ("plain", "magicdec")}
    per_round = lambda name: [t / rows[name]["loop_rounds"] for t in rows[name]["decode_s_all"]]
    point["invariant_over_fast_per_round_paired"] = {
        k: common.paired_ratios(per_round(f"invariant/{k}"), per_round(f"fast/{k}")) for k in ("plain", "magicdec")}
  if a.study == "filters":
    for name, row in rows.items():
      g = rows.get("greedy/" + name.split("/")[-1])
      if g:
        row["ms_per_round_over_greedy"] = row["ms_per_round"] / g["ms_per_round"]
  if a.study == "mixed":
    tps = {k.split("/")[1]: v["tokens_per_s"] for k, v in rows.items()}
    point["mixed_over_slower_uniform"] = tps["mixed"] / min(tps["greedy"], tps["sampled"])
    point["mixed_greedy_rows_equal_greedy_run"] = all(
        runs["all/mixed"][0].tokens[i] == runs["all/greedy"][0].tokens[i] for i in range(0, a.batch, 2))


if __name__ == "__main__":
  main()
