"""How often each draft kind's tokens are accepted: SmolLM2-135M on held-out Shakespeare (CPU or GPU).

Parts (`--parts`):
  drafts  each draft kind through the engine's own loop, from one prefill of `--shape` held-out prompts: the
          StreamingLLM self-draft (sink + window), SnapKV (budget + window), a model draft (the target's first
          `--draft-layers` layers, untrained: SmolLM2 has no small sibling) and the self-draft on int8 and int4
          copies; greedy and T 0.8 top-p 0.95, chain `--gamma`, the GPU harness's budgets. Per kind and
          sampling: acceptance rate, mean accepted length, per-position acceptance p_k and `alpha` =
          sum_k p_k / (1 + sum_{k<gamma} p_k), what the GPU harness simulates (benchmarks/gpu reads this
          file); greedy rows identical to plain decoding's.
  window  the self-draft's teacher-forced greedy alpha over context x window (measure.acceptance).
  ceiling what any imperfect draft can reach on `--windows` held-out windows of `--tokens`: the target's top-1
          probability, how often its top-1 is within a factor of its top-2, how often the target without its
          last k layers (`--drop`, truncate_layers) picks the same argmax, and (`--head-dir`) how many argmaxes
          a feature head's draft vocabulary holds.

  python -m benchmarks.drafts.acceptance --parts drafts     # 4 x 4096, 64 new tokens: ~10 min on 2 CPU cores
  python -m benchmarks.drafts.acceptance --parts window     # contexts 512..4096 x windows 64..512
  python -m benchmarks.drafts.acceptance --parts ceiling --head-dir out/fh_bf16
  python -m benchmarks.drafts.acceptance --smoke            # random tiny model, seconds
"""
from __future__ import annotations

import os
import time

import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import drafts, prefilled, textdata
from magicdec_jax.measure import acceptance as acc
from magicdec_jax.model import full_forward

SAMPLINGS = {"greedy": dict(temperature=0.0), "t0.8-topp0.95": dict(temperature=0.8, top_p=0.95, seed=0)}


def chain_alpha(per_position) -> float | None:
  """The per-token acceptance of a chain whose draft tokens are accepted independently given the ones
  before: sum_k p_k / (1 + sum_{k < last} p_k), p_k the share of rounds that accepted position k."""
  p = list(per_position)
  return float(sum(p) / (1 + sum(p[:-1]))) if p else None


def draft_objects(model, a) -> dict:
  """Kind -> the draft measured (the budgets of benchmarks/gpu's drafts)."""
  small = drafts.truncate_layers(model, a.draft_layers)
  return {"streaming": drafts.StreamingDraft(a.sink, a.window),
          "snapkv": drafts.SnapKVDraft(a.budget, a.snap_window),
          "model": drafts.ModelDraft(small, a.sink, a.window),
          "int8": drafts.StreamingDraft(a.sink, a.window, weights="int8"),
          "int4": drafts.StreamingDraft(a.sink, a.window, weights="int4")}


def part_drafts(model, a) -> dict:
  b, p = a.shape
  prompts, text = common.text_prompts(model, b, p, model.config.vocab_size, held_out=not a.smoke)
  pre = prefilled.prefill(model, prompts, max_new_tokens=a.new, progress=False)
  plain = prefilled.decode(model, pre, temperature=0.0).tokens
  out = {"batch": b, "prompt_tokens": p, "new_tokens": a.new, "gamma": a.gamma, "text": text, "kinds": {}}
  for kind, draft in draft_objects(model, a).items():
    rec = out["kinds"][kind] = {"draft": repr(draft)}
    for name, kw in SAMPLINGS.items():
      t0 = time.perf_counter()
      res = prefilled.decode(model, pre, draft=draft, gamma=a.gamma, **kw)
      s = res.stats
      rec[name] = {"acceptance_rate": s["acceptance_rate"], "mean_accepted_length": s["mean_accepted_length"],
                   "per_position_acceptance": s["per_position_acceptance"],
                   "alpha": chain_alpha(s["per_position_acceptance"]), "verify_steps": s["verify_steps"]}
      if name == "greedy":
        rec[name]["rows_identical_to_plain"] = sum(x == y for x, y in zip(plain, res.tokens))
      common.log(f"[acceptance] {kind} {name}: alpha {rec[name]['alpha']:.3f}, rate {s['acceptance_rate']:.3f} "
                 f"({time.perf_counter() - t0:.0f}s)")
  return out


def part_window(model, contexts, windows, sink: int) -> list[dict]:
  """Teacher-forced greedy alpha of StreamingDraft(sink, window) per (context, window), one text window each."""
  rows = []
  for ctx in contexts:
    (toks,), src = common.text_prompts(model, 1, ctx, model.config.vocab_size)
    arr = jnp.asarray([toks], jnp.int32)
    tl = np.asarray(full_forward(model.params, model.config, arr))[0]
    for w in windows:
      if sink + w + 16 >= ctx:
        continue
      dl = np.asarray(acc.windowed_logits(model.params, model.config, arr, sink, w))[0]
      ranks = acc.greedy_ranks(tl[sink + w:ctx - 1], dl[sink + w:ctx - 1], 1)
      rows.append({"context": ctx, "window": w, "sink": sink, "alpha": float(np.mean(ranks == 0)),
                   "positions": int(ranks.size), "text": src})
  return rows


def part_ceiling(model, a) -> dict:
  ids = jnp.asarray(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 64)) if a.smoke else
                    textdata.shakespeare_prompts(model.tokenizer, a.windows, a.tokens, held_out=True), jnp.int32)
  logits = np.asarray(full_forward(model.params, model.config, ids)).reshape(-1, model.config.vocab_size)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  top = np.sort(p / p.sum(-1, keepdims=True), -1)
  argmax = logits.argmax(-1)
  out = {"text": "random ids" if a.smoke else "shakespeare held-out plays", "windows": a.windows, "tokens": a.tokens,
         "positions": int(argmax.size),
         "target_top1_prob": {"mean": float(top[:, -1].mean()), "median": float(np.median(top[:, -1]))},
         "top1_over_top2_below": {str(r): float(np.mean(top[:, -1] / top[:, -2] < r)) for r in (1.25, 1.5, 2.0)},
         "truncated_target_agreement": {}}
  for k in a.drop:
    small = drafts.truncate_layers(model, model.config.num_layers - k)
    other = np.asarray(full_forward(small.params, small.config, ids)).reshape(-1, model.config.vocab_size)
    out["truncated_target_agreement"][str(k)] = float(np.mean(other.argmax(-1) == argmax))
  if a.head_dir and (vocab := common.read_json(os.path.join(a.head_dir, "feature_head.json")).get("vocab")):
    out["argmax_in_head_vocab"] = float(np.isin(argmax, np.asarray(vocab)).mean())
  return out


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--parts", default="drafts", help="drafts,window,ceiling")
  ap.add_argument("--shape", type=lambda t: common.shape_list(t)[0], default=(4, 4096), help="BxP")
  ap.add_argument("--budget", type=int, default=512, help="SnapKV's selected prompt positions")
  common.flags(ap, new=64, gamma=3, sink=16, window=512, snap_window=64, draft_layers=8, tf_sink=4)
  ap.add_argument("--tf-contexts", type=common.int_list, default=[512, 1024, 2048, 4096])
  ap.add_argument("--tf-windows", type=common.int_list, default=[64, 128, 256, 512])
  ap.add_argument("--drop", type=common.int_list, default=[1, 2, 4], help="ceiling: top layers removed")
  ap.add_argument("--head-dir", default=None, help="ceiling: a feature head (its feature_head.json's vocab)")
  common.flags(ap, windows=2, tokens=1024)
  a = common.parse(ap, argv, shape=(2, 96), new=8, sink=2, window=16, budget=16, snap_window=8, draft_layers=1,
                   tf_contexts=[64], tf_windows=[8, 16], tf_sink=2, tokens=64, drop=[1])
  parts = [x for x in a.parts.split(",") if x]
  if bad := [x for x in parts if x not in ("drafts", "window", "ceiling")]:
    ap.error(f"unknown parts {bad}")
  model, source = common.model(a.smoke)
  if "ceiling" in parts and any(k < 1 or k >= model.config.num_layers for k in a.drop):
    ap.error(f"--drop: each value must be in [1, {model.config.num_layers - 1}]")
  doc = common.record("draft_acceptance", source, model.config.dtype, samplings=SAMPLINGS,
                      budgets=dict(sink=a.sink, window=a.window, snapkv_budget=a.budget, snapkv_window=a.snap_window,
                                   model_draft_layers=a.draft_layers))
  if "drafts" in parts:
    doc["drafts"] = part_drafts(model, a)
  if "window" in parts:
    doc["teacher_forced"] = part_window(model, a.tf_contexts, a.tf_windows, a.tf_sink)
  if "ceiling" in parts:
    doc["ceiling"] = part_ceiling(model, a)
  common.finish(doc, a.output, f"draft_acceptance_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
