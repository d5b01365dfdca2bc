"""Speed per byte of each family's AR step: the same dimensions with each family's features switched on.

One autoregressive step (`calibrate.time_step`) of random weights at SmolLM2-135M's dimensions per family
(default: Qwen3 against LLaMA), the families alternated round by round: seconds per step and bytes per second
(every parameter leaf and the KV cache up to the context, a windowed layer's up to its window, over the
fastest time). A windowed family keeps its windowed layers as rings, as the engine does; `--full_cache` also
times it over a full cache in every layer (run "FAMILY+full"): what the rings save.

  python -m benchmarks.steps.families                                  # batch 8 x 2048 context, llama vs qwen3
  python -m benchmarks.steps.families --families llama,qwen3,qwen2,gemma3
  python -m benchmarks.steps.families --families gemma3 --full_cache --batch 4 --context 4096
  python -m benchmarks.steps.families --smoke                          # tiny shapes, seconds
"""
from __future__ import annotations

import jax

from benchmarks import common
from magicdec_jax.model import init_params
from magicdec_jax.measure import calibrate
from magicdec_jax.tuning import shapes

FEATURES = {   # each family's config features at the shape being measured (docs/families.md)
    "llama": lambda n: {},
    "qwen3": lambda n: dict(qk_norm=True),
    "qwen2": lambda n: dict(qkv_bias=True),
    "gemma3": lambda n: dict(qk_norm=True, norm_plus_one=True, post_norms=True, activation="gelu_tanh",
                             embed_scale=True, query_pre_attn_scalar=64.0, local_rope_theta=10000.0,
                             layer_windows=tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(n))),
}


def step_bytes(params, cfg, batch: int, context: int, rings: bool = True) -> int:
  """Bytes a step reads: every parameter leaf and the K and V of `context` positions per row and layer
  (rings: min(context, window) in a windowed layer)."""
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  per_layer = [min(context, cfg.layer_window(i) or context) if rings else context for i in range(cfg.num_layers)]
  kv = 2 * batch * cfg.num_kv_heads * sum(per_layer) * cfg.head_dim * cfg.jnp_dtype.itemsize
  return int(weights + kv)


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--families", default="llama,qwen3", help="comma-separated: " + ",".join(FEATURES))
  common.flags(ap, batch=8, context=2048)
  ap.add_argument("--rounds", type=int, default=3, help="families alternated this many times")
  ap.add_argument("--repeats", type=int, default=5, help="timed steps per round (the fastest counts)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--full_cache", action="store_true",
                  help="also time each windowed family over a full cache (run 'FAMILY+full')")
  args = common.parse(ap, argv, batch=2, context=64, rounds=2, repeats=2)
  families = args.families.split(",")
  if unknown := [f for f in families if f not in FEATURES]:
    ap.error(f"unknown families {unknown}; known: {sorted(FEATURES)}")
  base = shapes.smollm2_135m(args.dtype)
  if args.smoke:
    base = base.replace(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=6, num_heads=4,
                        num_kv_heads=2, head_dim=8)
  cfgs = {f: base.replace(**FEATURES[f](base.num_layers)) for f in families}
  params = {f: init_params(cfgs[f], jax.random.key(0)) for f in families}
  names = [(f, True) for f in families] + [(f, False) for f in families
                                           if args.full_cache and cfgs[f].layer_windows]
  label = lambda f, rings: f if rings else f + "+full"
  times = {label(*n): [] for n in names}
  for r in range(args.rounds):
    for f, rings in names:
      t = calibrate.time_step(params[f], cfgs[f], args.batch, args.context, 1, repeats=args.repeats, rings=rings)
      times[label(f, rings)] += t["times"]
      common.log(f"[families_step] round {r} {label(f, rings)}: {t['seconds'] * 1e3:.2f} ms")
  runs = {}
  for f, rings in names:
    nbytes = step_bytes(params[f], cfgs[f], args.batch, args.context, rings)
    ts = times[label(f, rings)]
    runs[label(f, rings)] = {"seconds": min(ts), "median_s": sorted(ts)[len(ts) // 2], "times": ts,
                             "bytes": nbytes, "bytes_per_s": nbytes / min(ts), "cache": "rings" if rings else "full"}
  ref = runs[families[0]]["bytes_per_s"]
  doc = common.record("families_step", shape={k: getattr(base, k) for k in (
      "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
      "dtype")}, batch=args.batch, context=args.context, rounds=args.rounds, repeats=args.repeats, runs=runs,
      **{"speed_per_byte_vs_" + families[0]: {f: runs[f]["bytes_per_s"] / ref for f in families}})
  if any(not rings for _, rings in names):
    doc["ring_speedup_vs_full_cache"] = {f: runs[f + "+full"]["seconds"] / runs[f]["seconds"]
                                         for f, rings in names if not rings}
  common.finish(doc, args.output, f"families_step_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
