"""Offline generation throughput: static vs continuous batching, SmolLM2-135M chat prompts, natural EOS.

`--prompts` chat requests x `--samples` samples, T 0.8, up to `--max-new` tokens (or the model's EOS), on
`--batch` slots of `generate_stream`: static batching refills at `batch`, continuous at `--refill-at`; both
produce the same samples (checked: `same_outputs`), so only time is compared. Per configuration: useful
tokens/s (new tokens / (wall - compile)), slot utilization, prefill (+ insert) share; per mode the bound
(static row-rounds / useful row-rounds) and the speedup. A call runs one configuration into a part under
results/datagen_throughput_parts/; `--merge` joins the parts into one JSON + PNG (`--output`: the merged
JSON, its folder takes the parts too). `--smoke` runs every configuration and merges.

  python -m benchmarks.decode.datagen --run ar-static        # ar-continuous, streaming-static, ...
  python -m benchmarks.decode.datagen --merge
  python -m benchmarks.decode.datagen --smoke --output /tmp/x/d.json   # random tiny model, every configuration
"""
from __future__ import annotations

import hashlib
import json
import os
import time

from benchmarks import common
from magicdec_jax import compile as compiling
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.stream import generate_stream

CONFIGS = ("ar-static", "ar-continuous", "streaming-static", "streaming-continuous")
TEMPLATES = ("Write a short poem about {}.", "Explain {} to a child in two sentences.",
             "List three facts about {}.", "Tell a very short story about {}.")
TOPICS = ("the sea", "a cat", "the moon", "bread", "rain", "a library", "trains", "honey bees", "winter",
          "a lighthouse", "volcanoes", "friendship", "coffee", "the desert", "music", "a garden", "clocks",
          "owls", "bridges", "snow", "apples", "the wind", "robots", "a river")
PART_DIR = common.RESULTS_DIR / "datagen_throughput_parts"
NAME = "datagen_throughput_smollm2_cpu_2026-11-23"


def chat_requests(model, n: int) -> list[list[int]]:
  """n distinct chat prompts as token ids (template i % 4 about topic i // 4 ...)."""
  qs = [TEMPLATES[i % len(TEMPLATES)].format(TOPICS[(i // len(TEMPLATES) + i) % len(TOPICS)]) for i in range(n)]
  if len(set(qs)) < n:
    qs = [f"{q} (#{i})" for i, q in enumerate(qs)]
  if not model.chat_template:      # the random tiny model of --smoke: the plain text
    return [model.tokenizer.encode(q).ids for q in qs]
  return [tok_lib.encode(model.tokenizer, tok_lib.chat_prompt(model, [{"role": "user", "content": q}])) for q in qs]


def run_config(model, source: str, config: str, args) -> dict:
  mode, batching = config.split("-")
  draft = StreamingDraft(sink=args.sink, window=args.window) if mode == "streaming" else None
  requests = chat_requests(model, args.prompts)
  refill = args.batch if batching == "static" else args.refill_at
  kw = dict(max_new_tokens=args.max_new, batch_size=args.batch, refill_at=refill, num_samples=args.samples,
            temperature=args.temperature, top_p=args.top_p, seed=args.seed, draft=draft,
            gamma=None if draft is None else args.gamma)
  c0 = compiling.compile_seconds()
  t0 = time.perf_counter()
  g = generate_stream(model, requests, **kw)
  results = sorted(g, key=lambda r: (r.index, r.sample))
  wall = time.perf_counter() - t0
  compile_s = compiling.compile_seconds() - c0
  st = dict(g.stats)
  run_s = wall - compile_s
  lengths = [len(r.tokens) for r in results]
  digest = hashlib.sha256(json.dumps([r.tokens for r in results]).encode()).hexdigest()
  return {
      "config": config, "mode": mode, "batching": batching, "refill_at": refill, "model": source,
      "settings": {k: (str(v) if k == "draft" else v) for k, v in kw.items()},
      "prompt_tokens": [len(r) for r in requests], "samples": len(results), "new_tokens": sum(lengths),
      "lengths": lengths, "eos_fraction": sum(r.finish_reason == "eos" for r in results) / len(results),
      "outputs_sha256": digest, "wall_s": wall, "compile_s": compile_s, "run_s": run_s,
      "useful_tokens_per_s": sum(lengths) / run_s, "slot_utilization": st["slot_utilization"],
      "sample_verify_steps": sum(r.stats["verify_steps"] for r in results),
      "rounds": st["rounds"], "row_rounds": st["row_rounds"], "active_row_rounds": st["active_row_rounds"],
      "prefill_s": st["prefill_s"], "insert_s": st["insert_s"], "decode_s": st["decode_s"],
      "prefill_share": st["prefill_s"] / run_s, "insert_share": st["insert_s"] / run_s,
      "prefills": st["prefills"], "decode_calls": st["decode_calls"], "env": common.env_info(),
  }


def merge(part_dir, out_dir, name: str = NAME) -> dict:
  parts = {}
  for c in CONFIGS:
    path = os.path.join(part_dir, f"{c}.json")
    if os.path.exists(path):
      parts[c] = common.read_json(path)
  modes = {}
  for mode in ("ar", "streaming"):
    s, c = parts.get(f"{mode}-static"), parts.get(f"{mode}-continuous")
    if not (s and c):
      continue
    bound = s["row_rounds"] / s["active_row_rounds"]
    speedup = c["useful_tokens_per_s"] / s["useful_tokens_per_s"]
    goal = 1.5 if bound >= 1.7 else 0.85 * bound
    modes[mode] = {"bound": bound, "speedup": speedup, "speedup_over_bound": speedup / bound,
                   "speedup_goal": goal, "speedup_goal_met": speedup >= goal,
                   "utilization_continuous": c["slot_utilization"], "utilization_static": s["slot_utilization"],
                   "utilization_goal_met": c["slot_utilization"] >= 0.90,
                   "same_outputs": s["outputs_sha256"] == c["outputs_sha256"]}
  doc = {"benchmark": "datagen_throughput", "configs": parts, "summary": modes}
  os.makedirs(out_dir, exist_ok=True)
  _plot(parts, modes, os.path.join(out_dir, f"{name}.png"))
  common.finish(doc, os.path.join(out_dir, f"{name}.json"), name)
  return doc


def _plot(parts, modes, path):
  fig, ax = common.pyplot().subplots(1, 3, figsize=(15, 4.2))
  names = [c for c in CONFIGS if c in parts]
  colors = ["#999999" if "static" in c else "#1f77b4" for c in names]
  ax[0].bar(names, [parts[c]["useful_tokens_per_s"] for c in names], color=colors)
  ax[0].set_ylabel("useful tokens / s")
  ax[0].set_title(", ".join(f"{m}: {v['speedup']:.2f}x (bound {v['bound']:.2f}x)" for m, v in modes.items()),
                  fontsize=9)
  ax[1].bar(names, [parts[c]["slot_utilization"] for c in names], color=colors)
  ax[1].axhline(0.9, ls="--", c="k", lw=0.8)
  ax[1].set(ylabel="slot utilization (active / all row-rounds)", ylim=(0, 1.05))
  for a in ax[:2]:
    a.tick_params(axis="x", labelrotation=20, labelsize=8)
  first = parts[names[0]] if names else None
  if first:
    ax[2].hist(first["lengths"], bins=32, color="#2ca02c")
    ax[2].set(xlabel="new tokens per sample", ylabel="samples")
    ax[2].set_title(f"lengths ({first['samples']} samples, eos {first['eos_fraction']:.0%})", fontsize=9)
  fig.suptitle("datagen: static vs continuous batching (batch %s, SmolLM2-135M, CPU)" %
               (first["settings"]["batch_size"] if first else "?"), fontsize=10)
  common.save_figure(fig, path)


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny model, tiny workload, every configuration, merged (seconds)")
  ap.add_argument("--run", choices=CONFIGS, action="append", default=[])
  ap.add_argument("--merge", action="store_true")
  common.flags(ap, prompts=64, samples=2, batch=8, refill_at=1, max_new=256, temperature=0.8, top_p=1.0, seed=0,
               gamma=2, sink=4, window=64)
  args = common.parse(ap, argv, prompts=6, max_new=8, batch=2, window=8)
  if args.smoke:
    args.run, args.merge = args.run or list(CONFIGS), True
  out_dir, part_dir, name = str(common.RESULTS_DIR), str(PART_DIR), NAME
  if args.output:            # the merged JSON's path; its folder takes the parts too
    out_dir, name = os.path.split(os.path.splitext(os.path.abspath(args.output))[0])
    part_dir = os.path.join(out_dir, "parts")
  if args.run:
    model, source = common.model(args.smoke)
  os.makedirs(part_dir, exist_ok=True)
  for config in args.run:
    part = run_config(model, source, config, args)
    common.write_json(part, os.path.join(part_dir, f"{config}.json"), stamp=False)
    print(json.dumps({k: v for k, v in part.items() if k not in ("lengths", "prompt_tokens", "env")}), flush=True)
  if args.merge:
    merge(part_dir, out_dir, name)


if __name__ == "__main__":
  main()
