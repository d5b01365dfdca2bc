"""What sampling costs: AR step and MagicDec round under greedy, temperature, top-p and top-k (issue 39).

Two parts, one JSON + PNG:
  * filter: `sampling.probabilities` alone on [rows, V] logits (V = SmolLM2's 49,152: the model's own logits
    on held-out text; Qwen's 152,064: 4 x Gumbel noise, a heavy upper tail), ms per row, beside the sorted
    definition it replaced (`sorted_probabilities` below: top-k by
    `lax.top_k`, top-p by a full `jnp.sort` + cumsum), with a check that both keep the same tokens;
  * decode: SmolLM2-135M on held-out Shakespeare, each shape prefilled once (prefilled.py), then decoded
    autoregressively and with the demo's self-draft (bfloat16 copy, sink 4 + window 256, gamma 2) under each
    sampling setting, from copies of the same caches. ms per AR step = decode s / loop rounds; ms per MagicDec
    round likewise; speedup = MagicDec tokens/s / AR tokens/s.

Run the same file on an older checkout for a 'before' (it only uses prefilled / sampling APIs that predate
the change): `--label before`.

  python -m benchmarks.sampling_cost --shapes 8x1024:64,8x4096:128
  python -m benchmarks.sampling_cost --smoke        # random tiny model, seconds
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import engine, prefilled, sampling
from magicdec_jax.drafts import StreamingDraft

SETTINGS = {"greedy": dict(temperature=0.0), "t0.8": dict(temperature=0.8),
            "t0.8-topp0.95": dict(temperature=0.8, top_p=0.95), "t0.8-topk50": dict(temperature=0.8, top_k=50)}


def sorted_probabilities(logits: jax.Array, s: sampling.Sampling) -> jax.Array:
  """The filter as it was before issue 39 (kept here as the 'sort' baseline of the filter timing)."""
  x = logits.astype(jnp.float32) / s.temperature
  if s.top_k and s.top_k < x.shape[-1]:
    kth = jax.lax.top_k(x, s.top_k)[0][..., -1:]
    x = jnp.where(x < kth, -jnp.inf, x)
  if s.top_p < 1.0:
    sx = jnp.sort(x, axis=-1)[..., ::-1]
    sp = jax.nn.softmax(sx, axis=-1)
    keep = jnp.cumsum(sp, axis=-1) - sp < s.top_p
    x = jnp.where(x < jnp.min(jnp.where(keep, sx, jnp.inf), axis=-1, keepdims=True), -jnp.inf, x)
  return jax.nn.softmax(x, axis=-1)


def filter_timings(vocabs, rows: int, repeats: int, logits_source=None) -> list[dict]:
  """ms per row of the sort-free filter and of the sorted one, per vocabulary and setting."""
  out = []
  for v in vocabs:
    if logits_source is not None and v == logits_source.shape[-1]:
      x, kind = jnp.asarray(logits_source[:rows]), "the model's logits on held-out text"
    else:      # a heavy upper tail like an LM's: Gumbel-distributed logits
      x, kind = 4.0 * jax.random.gumbel(jax.random.key(v), (rows, v)), "random gumbel * 4"
    for name, kw in SETTINGS.items():
      if name == "greedy":
        continue
      s = sampling.Sampling(**kw)
      rec = {"vocab": v, "rows": int(x.shape[0]), "logits": kind, "setting": name}
      probs = {}
      for impl, fn in (("sortfree", sampling.probabilities), ("sort", sorted_probabilities)):
        jf = jax.jit(lambda y, fn=fn: fn(y, s))
        med, _ = common.median_time(lambda: jf(x), repeats)
        rec[f"{impl}_ms_per_row"] = med * 1e3 / x.shape[0]
        probs[impl] = np.asarray(jf(x))
      rec["same_kept_set"] = bool(((probs["sortfree"] > 0) == (probs["sort"] > 0)).all())
      rec["max_abs_prob_diff"] = float(np.abs(probs["sortfree"] - probs["sort"]).max())
      rec["sort_over_bisect"] = rec["sort_ms_per_row"] / rec["sortfree_ms_per_row"]
      out.append(rec)
      print(f"[filter] V {v} ({kind}), {name}: sort-free {rec['sortfree_ms_per_row']:.3f} ms/row, sort "
            f"{rec['sort_ms_per_row']:.3f} ms/row, same kept set {rec['same_kept_set']}", flush=True)
  return out


def decode_point(model, prompts, max_new: int, draft, gamma: int, repeats: int) -> dict:
  """One shape: prefill once; AR and MagicDec under every setting (alternated, `repeats` times each)."""
  pre = prefilled.prefill(model, prompts, max_new_tokens=max_new, progress=False)
  point = {"batch": len(prompts), "context": len(prompts[0]), "max_new": max_new, "prefill_s": pre.prefill_s,
           "settings": {}}
  for name, kw in SETTINGS.items():
    runs = {"ar": [], "md": []}
    for _ in range(repeats):
      runs["ar"].append(prefilled.decode(model, pre, seed=0, **kw).stats)
      runs["md"].append(prefilled.decode(model, pre, draft=draft, gamma=gamma, seed=0, **kw).stats)
    rec = {}
    for k, rs in runs.items():
      decode_s = sorted(r["decode_s"] for r in rs)[len(rs) // 2]
      r = rs[0]
      rec[k] = {"decode_s_median": decode_s, "decode_s_all": [r["decode_s"] for r in rs],
                "loop_rounds": r["loop_rounds"], "new_tokens": r["new_tokens"],
                "ms_per_round": decode_s / r["loop_rounds"] * 1e3,
                "tokens_per_s": r["new_tokens"] / decode_s, "acceptance_rate": r["acceptance_rate"]}
    rec["speedup"] = rec["md"]["tokens_per_s"] / rec["ar"]["tokens_per_s"]
    point["settings"][name] = rec
    print(f"[decode] {point['batch']}x{point['context']} {name}: AR {rec['ar']['ms_per_round']:.1f} ms/step, "
          f"MagicDec {rec['md']['ms_per_round']:.1f} ms/round, speedup {rec['speedup']:.3f}x, acceptance "
          f"{rec['md']['acceptance_rate']}", flush=True)
  g = point["settings"]["greedy"]
  for name, rec in point["settings"].items():
    rec["ar_step_over_greedy"] = rec["ar"]["ms_per_round"] / g["ar"]["ms_per_round"]
    rec["md_round_over_greedy"] = rec["md"]["ms_per_round"] / g["md"]["ms_per_round"]
  t = point["settings"]["t0.8"]["speedup"]
  for name in ("t0.8-topp0.95", "t0.8-topk50"):
    point["settings"][name]["speedup_over_plain_temperature_speedup"] = point["settings"][name]["speedup"] / t
  return point


def plot(doc: dict, path: str) -> str:
  pts = doc["decode"]
  fig, axes = common.pyplot().subplots(1, len(pts) + 1, figsize=(5 * (len(pts) + 1), 4))
  axes = np.atleast_1d(axes)
  names = list(SETTINGS)
  for ax, p in zip(axes, pts):
    xs = np.arange(len(names))
    ax.bar(xs - 0.2, [p["settings"][n]["ar"]["ms_per_round"] for n in names], 0.4, label="AR ms / step")
    ax.bar(xs + 0.2, [p["settings"][n]["md"]["ms_per_round"] for n in names], 0.4, label="MagicDec ms / round")
    for x, n in zip(xs, names):
      ax.text(x, p["settings"][n]["md"]["ms_per_round"], f"{p['settings'][n]['speedup']:.2f}x", ha="center",
              va="bottom", fontsize=8)
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_title(f"{p['batch']} x {p['context']}, {p['max_new']} new tokens ({doc['label']})", fontsize=9)
    ax.legend(fontsize=8)
  ax = axes[-1]
  for impl in ("sortfree", "sort"):
    for v in sorted({f["vocab"] for f in doc["filter"]}):
      fs = [f for f in doc["filter"] if f["vocab"] == v and f"{impl}_ms_per_row" in f]
      ax.plot([f["setting"] for f in fs], [f[f"{impl}_ms_per_row"] for f in fs], "o-", label=f"{impl}, V {v}")
  ax.set_yscale("log")
  ax.set_ylabel("filter ms per row")
  ax.set_title("the filter alone", fontsize=9)
  ax.legend(fontsize=8)
  fig.suptitle(f"sampling cost, {doc['model']}, {doc['env']['cpu_model']}", fontsize=10)
  return common.save_figure(fig, path)


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--shapes", default="8x1024:64,8x4096:128", help="BATCHxCONTEXT:NEW_TOKENS,...")
  ap.add_argument("--gamma", type=int, default=2)
  ap.add_argument("--sink", type=int, default=4)
  ap.add_argument("--window", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=1, help="decodes of each method per setting (median)")
  ap.add_argument("--filter-rows", type=int, default=24)
  ap.add_argument("--vocabs", default="49152,152064")
  ap.add_argument("--no-filter", action="store_true")
  ap.add_argument("--label", default="after")
  args = common.parse(ap, argv, shapes="2x64:8", vocabs="512", window=16, filter_rows=4)
  shapes = [(int(s.split(":")[0].split("x")[0]), int(s.split(":")[0].split("x")[1]), int(s.split(":")[1]))
            for s in args.shapes.split(",") if s]
  vocabs = common.int_list(args.vocabs)
  model, source = common.model(args.smoke)
  doc = {"benchmark": "sampling_cost", "label": args.label, "model": source, "env": common.env_info(),
         "draft": f"StreamingDraft(sink {args.sink}, window {args.window}, weights bfloat16)",
         "gamma": args.gamma, "settings": SETTINGS, "filter": [], "decode": []}
  if not args.no_filter:
    text = common.text_prompts(model, 1, 4 * args.filter_rows, model.config.vocab_size, held_out=not args.smoke)[0]
    model_logits = engine.logits(model, text)[0, ::4]           # rows: every 4th position of one passage
    doc["filter"] = filter_timings(vocabs, args.filter_rows, 5, model_logits)
  draft = StreamingDraft(args.sink, args.window, weights="bfloat16")
  t0 = time.time()
  for b, n, new in shapes:
    prompts = common.text_prompts(model, b, n, model.config.vocab_size, held_out=not args.smoke)[0]
    doc["decode"].append(decode_point(model, prompts, new, draft, args.gamma, args.repeats))
  doc["elapsed_s"] = time.time() - t0
  out = common.output_path(args.output, f"sampling_cost_{args.label}")
  doc["figure"] = plot(doc, common.png_path(out))
  common.finish(doc, out)


if __name__ == "__main__":
  main()
