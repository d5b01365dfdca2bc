"""Long outputs: plain decoding, fixed gamma 1 / 2 / 3 and adaptive speculation (gamma="auto") in one run.

SmolLM2-135M, batch 8, held-out Shakespeare prompts, T 0.8 top-p 0.95 (rejection sampling), no stop token;
one prefill and seed for every setting (prefilled.py). The settings run interleaved, --chunk-rounds rounds
each in turn (the loop returns to the host between chunks: the same executable), so tokens/s is known per
--segment tokens of output, with which setting adaptive ran there. Adaptive is priced with --profile and an
acceptance vector measured first on --acceptance-windows held-out windows (0: the cost model's default);
`--schedule` forces its thresholds instead. Compilation is timed apart and left out of every figure.

  python -m benchmarks.decode.long_output --prompt 2048 --new 1024      # ~17 min on the 2-core CPU
  python -m benchmarks.decode.long_output --smoke
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import compile as compiling
from magicdec_jax import engine, plan, prefilled, schedule
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.settings import decode_settings
from magicdec_jax.measure import acceptance

PROFILE = "benchmarks/results/cpu_profile_smollm2_streaming4+256_bf16copy_2026-11-25_intel.json"


def run_setting(model, pre, st, chunk_rounds: int):
  """Decode the prefilled batch with settings `st` in chunks, yielding after each (the caller interleaves
  the settings chunk by chunk, so a shared machine's load falls on all of them alike); returns the time
  and mean tokens per row after each chunk."""
  p = int(pre.tokens.shape[1])
  eng = engine.Engine(model, plan.make_plan(model, st, batch=pre.batch, shortest=p, longest=p))
  keys = engine.stream_keys(st.seed, range(pre.batch))
  c0 = compiling.compile_seconds()
  t0 = time.perf_counter()
  target = jax.tree.map(jnp.copy, pre.target)
  ring = eng.prefill_draft(target, pre.tokens, pre.lengths, pre.chunk)
  jax.block_until_ready((target, ring))
  ring_s = time.perf_counter() - t0 - (compiling.compile_seconds() - c0)
  budget = jnp.full((pre.batch,), st.max_new_tokens, jnp.int32)
  state = eng.initial_state(pre.tokens, jnp.array(pre.lengths), budget, keys, target, ring)
  t, compile_s, records = 0.0, 0.0, [(0.0, 0.0, [0] * eng.plan.num_variants)]
  while not bool(np.asarray(state.done).all()):
    state = schedule.with_limit(state, int(state.step) + chunk_rounds)
    c0, t0 = compiling.compile_seconds(), time.perf_counter()
    state = eng.decode(state)
    jax.block_until_ready(state.out)
    dc = compiling.compile_seconds() - c0
    t += time.perf_counter() - t0 - dc
    compile_s += dc
    records.append((t, float(np.asarray(state.n_out).mean()), np.asarray(state.sched.rounds).tolist()))
    yield
  n_out, rounds, acc = np.asarray(state.n_out), np.asarray(state.rounds), np.asarray(state.accepted)
  out = {"decode_s": t, "tokens_per_s": float(n_out.sum()) / t, "new_tokens": int(n_out.sum()),
         "ring_s": ring_s, "decode_compile_s": compile_s, "loop_rounds": int(state.step),
         "mean_accepted_length": float((acc.sum() + rounds.sum()) / rounds.sum()), "records": records}
  variants = eng.plan.variants
  if variants is not None:
    out["schedule"] = schedule.report(variants, jax.device_get(state.sched))
    out["settings"] = schedule.names(variants)
    if eng.learning is not None:
      out["schedule"]["learning"] = eng.learning.report(variants)
  if eng.plan.report:
    out["plan"] = {k: v for k, v in eng.plan.report.items() if k != "schedule_points"}
  return out


def crossing(records, tokens: float) -> tuple[float, int]:
  """(time at which the mean output per row reached `tokens`, linearly interpolated; record index)."""
  for i in range(1, len(records)):
    (ta, na, _), (tb, nb, _) = records[i - 1], records[i]
    if nb >= tokens:
      return ta + (tb - ta) * (tokens - na) / max(nb - na, 1e-9), i
  return records[-1][0], len(records) - 1


def segments(runs: dict, batch: int, new: int, seg: int) -> list[dict]:
  out = []
  for k in range(-(-new // seg)):
    lo, hi = k * seg, min((k + 1) * seg, new)
    row = {"segment": k, "tokens": [lo, hi], "tokens_per_s": {}}
    for name, r in runs.items():
      (ta, ia), (tb, ib) = crossing(r["records"], lo), crossing(r["records"], hi)
      row["tokens_per_s"][name] = batch * (hi - lo) / max(tb - ta, 1e-9)
      if "settings" in r:     # adaptive: rounds per setting over the records spanning the segment
        d = np.asarray(r["records"][ib][2]) - np.asarray(r["records"][max(ia - 1, 0)][2])
        row.setdefault("adaptive_rounds", {})[name] = {s: int(x) for s, x in zip(r["settings"], d) if x}
        row.setdefault("adaptive_setting", {})[name] = r["settings"][int(np.argmax(d))]
    fixed = {n: v for n, v in row["tokens_per_s"].items() if not n.startswith("adaptive")}
    row["best"] = max(fixed, key=fixed.get)
    row["adaptive_vs_best"] = row["tokens_per_s"]["adaptive"] / fixed[row["best"]]
    out.append(row)
  return out


def matched_window(runs: dict, batch: int) -> dict:
  """Tokens/s of every setting over its first K chunks, K the fewest any setting ran: interleaved, those
  chunks ran in the same stretch of wall time, so under the same outside load (after it, only the settings
  that need more rounds are still running)."""
  k = min(len(r["records"]) - 1 for r in runs.values())
  tps = {n: batch * r["records"][k][1] / r["records"][k][0] for n, r in runs.items()}
  return {"chunks": k, "tokens_per_row": {n: r["records"][k][1] for n, r in runs.items()}, **versus(tps)}


def versus(tps: dict) -> dict:
  """Tokens/s per setting, the best fixed setting, and adaptive over plain and over that best."""
  best = max((n for n in tps if not n.startswith("adaptive")), key=tps.get)
  return {"tokens_per_s": tps, "best_fixed": best, "adaptive_speedup": tps["adaptive"] / tps["plain"],
          "adaptive_vs_best_fixed": tps["adaptive"] / tps[best]}


def prediction(model, batch: int, prompt: int, new: int, profile: str) -> dict:
  """The cost model's predicted speedup of each chain over plain decoding for a shape (whole-cache pricing)."""
  from magicdec_jax.tuning import autotune, costmodel
  hw = autotune.detect_hardware(profile)
  slots = plan.cache_slots(plan.bucket(prompt), new, 4)
  draft = StreamingDraft(sink=4, window=256, weights="bfloat16").cost()
  return {"prompt": prompt, "new": new, "cache_slots": slots, "alpha": autotune.DEFAULT_ALPHA,
          "predicted_speedup": {f"gamma={g}": costmodel.predicted_speedup(
              model.config, hw, draft, batch, slots, gamma=g, alpha=autotune.DEFAULT_ALPHA, dtype=model.config.dtype)
              for g in (1, 2, 3)}}


def plot(doc: dict, path: str) -> str:
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  segs = doc["segments"]
  x = [s["tokens"][1] for s in segs]
  for name in doc["runs"]:
    ax.plot(x, [s["tokens_per_s"][name] for s in segs], marker="o", lw=2.5 if name == "adaptive" else 1.2,
            label=name)
  for s in segs:
    ax.annotate(s.get("adaptive_setting", {}).get("adaptive", ""), (s["tokens"][1], s["tokens_per_s"]["adaptive"]), fontsize=7,
                textcoords="offset points", xytext=(0, 6), ha="center")
  ax.set(xlabel="tokens generated per row (end of segment)", ylabel="decode tokens/s (batch)")
  ax.set_title(f"{doc['model']}: batch {doc['batch']}, prompt {doc['prompt']}, T=0.8 top-p 0.95; "
               f"adaptive {doc['adaptive_speedup']:.2f}x plain", fontsize=9)
  ax.legend(fontsize=8)
  return common.save_figure(fig, path)


def main(argv=None):
  ap = common.parser(__doc__)
  common.flags(ap, batch=8, prompt=2048, new=1024, segment=512, chunk_rounds=32, seed=0)
  ap.add_argument("--gammas", type=common.int_list, default=[1, 2, 3])
  ap.add_argument("--profile", default=PROFILE, help="hardware profile for adaptive's cost model")
  ap.add_argument("--acceptance-windows", type=int, default=2,
                  help="held-out windows of --prompt tokens the acceptance vector is measured on (0: none)")
  ap.add_argument("--schedule", default=None,
                  help="force adaptive's thresholds: from_context:gamma,... (gamma 0: plain), e.g. 0:2,3000:3")
  args = common.parse(ap, argv, batch=2, prompt=64, new=96, segment=32, chunk_rounds=4, gammas=[1, 2],
                      profile=None, schedule="0:2,100:0,130:1", acceptance_windows=1)
  model, source = common.model(args.smoke)
  prompts, text = common.text_prompts(model, args.batch, args.prompt, model.config.vocab_size, seed=1,
                                      held_out=not args.smoke)
  draft = StreamingDraft(2, 16) if args.smoke else StreamingDraft(4, 256, weights="bfloat16")
  doc = common.record("long_output", source, model.config.dtype, batch=args.batch, prompt=args.prompt, new=args.new,
                      segment=args.segment, text=text, temperature=0.8, top_p=0.95, sampling="rejection",
                      draft=dict(kind="StreamingDraft", sink=draft.sink, window=draft.window, weights=draft.weights),
                      profile=args.profile, forced_schedule=args.schedule, stop_token=None)
  pre = prefilled.prefill(model, prompts, max_new_tokens=args.new, progress=False)
  doc["prefill_s"] = pre.prefill_s
  base = decode_settings(max_new_tokens=args.new, temperature=0.8, top_p=0.95, seed=args.seed, eos_token_id=[])
  settings = {"plain": base, **{f"gamma={g}": base.replace(draft=draft, gamma=g) for g in args.gammas}}
  acc = None
  if args.acceptance_windows:
    windows, _ = common.text_prompts(model, args.batch + args.acceptance_windows, args.prompt,
                                     model.config.vocab_size, seed=2, held_out=not args.smoke)
    t0 = time.perf_counter()
    acc = acceptance.profile(model, draft, windows[args.batch:], sampling=base.sampler)     # not the prompts
    doc["acceptance"] = dict(acc, seconds=time.perf_counter() - t0)
  forced = None if not args.schedule else [tuple(int(x) for x in p.split(":")) for p in args.schedule.split(",")]
  priced = {} if forced else dict(hardware=args.profile, acceptance=None if acc is None else acc["acceptance_vector"])
  settings["adaptive"] = base.replace(draft=draft, gamma="auto", schedule=forced, **priced)   # a schedule: not priced
  if forced is None:   # the same without learning: priced with the profile's acceptance
    settings["adaptive_profiled"] = settings["adaptive"].replace(learn_acceptance=False)
  runs, live = {}, {name: run_setting(model, pre, st, args.chunk_rounds) for name, st in settings.items()}
  while live:                      # one chunk of each setting in turn
    for name in list(live):
      try:
        next(live[name])
      except StopIteration as done:
        runs[name] = done.value
        del live[name]
        print(f"[long_output] {name}: {runs[name]['tokens_per_s']:.1f} tok/s ({runs[name]['decode_s']:.0f} s)",
              flush=True)
  doc["runs"] = runs = {name: runs[name] for name in settings}
  doc["interleaved"] = f"every setting advanced {args.chunk_rounds} rounds in turn"
  doc["segments"] = segments(runs, args.batch, args.new, args.segment)
  doc.update(versus({n: r["tokens_per_s"] for n, r in runs.items()}))
  tps = doc["tokens_per_s"]
  if "adaptive_profiled" in tps:
    doc["adaptive_profiled_vs_best_fixed"] = tps["adaptive_profiled"] / tps[doc["best_fixed"]]
  doc["matched_window"] = matched_window(runs, args.batch)
  doc["goals"] = {"adaptive_speedup>=1.10": doc["adaptive_speedup"] >= 1.10,
                  "adaptive_vs_best_fixed>=0.97": doc["adaptive_vs_best_fixed"] >= 0.97,
                  "every_segment_within_5%": all(s["adaptive_vs_best"] >= 0.95 for s in doc["segments"])}
  if not args.smoke:
    doc["full_shape_prediction"] = prediction(model, args.batch, 2048, 4096, args.profile)
    doc["this_shape_prediction"] = prediction(model, args.batch, args.prompt, args.new, args.profile)
  out = common.output_path(args.output, "long_output")
  doc["png"] = plot(doc, common.png_path(out))
  common.finish(doc, out)
  return doc


if __name__ == "__main__":
  main()
