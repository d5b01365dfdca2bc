"""Prefill at the compute floor? SmolLM2-135M chunked prefill: tokens/s and FLOP rate vs a large matmul.

In one run: a large float32 matmul's FLOP rate (the yardstick), the engine's prefill (`loop.prefill`, causal
triangle only) and, unless --skip-old, the previous rule (every chunk over every cache slot under a mask).
Useful FLOPs: the matmuls (no LM head) and causal attention, not masked-out work. Medians of --repeats runs
after one compiling run.

  python -m benchmarks.steps.prefill --shape 8x4096
  python -m benchmarks.steps.prefill --smoke
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import common
from magicdec_jax import loop
from magicdec_jax.tuning import costmodel
from magicdec_jax.cache import KVCache, aligned_slots, ring_margin
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.model import forward
from magicdec_jax.plan import numerics_options


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots", "chunk"))
def old_prefill(params, tokens, *, cfg, num_slots: int, chunk: int):
  """The previous rule: chunk c attends over all `num_slots` slots, masked to slots < its own position."""
  b, p = tokens.shape
  anc = jnp.tril(jnp.ones((chunk, chunk), bool))

  def body(cache, c):
    start = c * chunk
    toks = jax.lax.dynamic_slice_in_dim(tokens, start, chunk, axis=1)
    pos = jnp.broadcast_to(start + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
    _, cache = forward(params, cfg, toks, pos, cache, pos, PrefixTree(jnp.full((b,), start, jnp.int32), anc),
                       compute_logits=False)
    return cache, None

  return jax.lax.scan(body, KVCache.zeros(cfg, b, num_slots), jnp.arange(p // chunk))[0]


def useful_flops(cfg, batch: int, p: int) -> float:
  matmul = 2.0 * (costmodel.matmul_params(cfg) - cfg.vocab_size * cfg.hidden_size) * batch * p
  attention = 4.0 * cfg.num_heads * cfg.head_dim * p * (p + 1) / 2 * cfg.num_layers * batch
  return matmul + attention


def matmul_rate(n: int, repeats: int) -> float:
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
  med, _ = common.median_time(lambda: f(a, a), repeats)
  return 2.0 * n ** 3 / med


def prefill_options(text: str) -> tuple[str, tuple[tuple[str, object], ...]]:
  """'LABEL=OPTION:VALUE,...' -> (LABEL, those XLA options as common.xla_option reads them; 'LABEL=': none)."""
  label, sep, items = text.partition("=")
  if not label or not sep:
    raise ValueError(f"--prefill-options takes LABEL=OPTION:VALUE,... (LABEL= for none), got {text!r}")
  return label, tuple(common.xla_option(i) for i in filter(None, items.split(",")))


def variants(config, names: list[str], tiles: list[tuple[int, int]], without_prefill_options: bool = False,
             options: tuple = ()) -> dict:
  """{label: the model's config under each numerics in `names`, then fixed-shape numerics with each
  FixedShapes.prefill_tile in `tiles` ("invariant_tile64x256"), (`without_prefill_options`) without
  FixedShapes.prefill_xla_options ("invariant_without_prefill_options"), and with each (label, options) of
  `options` as those prefill_xla_options ("invariant_LABEL")}."""
  out = {n: dataclasses.replace(config, numerics=n) for n in names}
  inv = dataclasses.replace(config, numerics="invariant")
  if without_prefill_options:
    options = (("without_prefill_options", ()),) + tuple(options)
  for label, opts in options:
    out[f"invariant_{label}"] = dataclasses.replace(inv, fixed=dataclasses.replace(inv.fixed, prefill_xla_options=opts))
  for tq, blk in tiles:
    fixed = dataclasses.replace(inv.fixed, prefill_tile=(tq, blk))
    out[f"invariant_tile{tq}x{blk}"] = dataclasses.replace(inv, fixed=fixed)
  return out


def by_numerics(model, tokens, lengths, num_slots: int, chunk: int, configs: dict, repeats: int,
                flops: float) -> dict:
  """The engine's prefill under each config of `configs` (variants()), compiled with the XLA options its
  plan would add, the configs timed in turn `repeats` times (after one untimed call each)."""
  runs = {}
  for n, cfg in configs.items():
    opts = numerics_options(cfg, prefill=True)
    exe = loop.prefill.lower(model.params, tokens, lengths, cfg=cfg, num_slots=num_slots,
                             margin=ring_margin(1, chunk), chunk=chunk).compile(opts or None)
    runs[n] = lambda exe=exe: exe(model.params, tokens, lengths).k[-1]
    jax.block_until_ready(runs[n]())
  times = {n: [] for n in configs}
  for _ in range(repeats):
    for n, fn in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      times[n].append(time.perf_counter() - t0)
  return {n: figures(statistics.median(ts), ts, tokens.size, flops) for n, ts in times.items()}


def figures(med: float, times: list, tokens: int, flops: float) -> dict:
  return {"median_s": med, "times": times, "tokens_per_s": tokens / med, "flop_rate": flops / med}


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--shape", type=common.shape_list, default=[(8, 4096)])
  common.flags(ap, chunk=256, repeats=1, matmul_n=2048)
  ap.add_argument("--skip-old", action="store_true", help="do not time the previous rule")
  ap.add_argument("--numerics", default="", help="also time the engine's prefill with these numerics "
                  "(comma-separated, e.g. fast,invariant; each compiled with its plan's XLA options), interleaved")
  ap.add_argument("--prefill-tiles", type=common.shape_list, default=[],
                  help="also time fixed-shape numerics with each prefill_tile (QxK tokens, comma-separated, "
                  "e.g. 64x256,128x256), interleaved with --numerics")
  ap.add_argument("--without-prefill-options", action="store_true", help="also time fixed-shape numerics "
                  "without FixedShapes.prefill_xla_options (the decode executables' options only), interleaved")
  ap.add_argument("--prefill-options", type=prefill_options, action="append", default=[],
                  help="also time fixed-shape numerics with these FixedShapes.prefill_xla_options, as "
                  "LABEL=OPTION:VALUE,... (repeatable; e.g. swl=xla_disable_hlo_passes:simplify-while-loops), "
                  "interleaved")
  args = common.parse(ap, argv, shape=[(2, 64)], chunk=16, matmul_n=256)
  model, source = common.model(args.smoke)
  (b, p), = args.shape
  cfg, params = model.config, model.params
  out = common.output_path(args.output, "prefill_bench")
  tokens = jax.random.randint(jax.random.key(0), (b, p), 0, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((b,), p, jnp.int32)
  num_slots = aligned_slots(p + 256)
  flops = useful_flops(cfg, b, p)
  doc = common.record("prefill_bench", source, cfg.dtype, batch=b, prompt_tokens=p, chunk=args.chunk,
                      useful_flops=flops)
  rate_before = matmul_rate(args.matmul_n, 5)
  new = lambda: loop.prefill(params, tokens, lengths, cfg=cfg, num_slots=num_slots,
                             margin=ring_margin(1, args.chunk), chunk=args.chunk).k[-1]
  med, times = common.median_time(new, args.repeats)
  doc["engine"] = {"numerics": cfg.numerics, **figures(med, times, b * p, flops)}
  configs = variants(cfg, [n for n in args.numerics.split(",") if n], args.prefill_tiles,
                     args.without_prefill_options, tuple(args.prefill_options))
  if configs:
    doc["by_numerics"] = by_numerics(model, tokens, lengths, num_slots, args.chunk, configs, args.repeats, flops)
  print(f"engine prefill {b}x{p}: {med:.1f}s, {b * p / med:.0f} tokens/s, {flops / med / 1e9:.1f} GFLOP/s useful",
        flush=True)
  if not args.skip_old:
    old = lambda: old_prefill(params, tokens, cfg=cfg, num_slots=num_slots, chunk=args.chunk).k[-1]
    med_old, times_old = common.median_time(old, args.repeats)
    doc["previous_rule"] = figures(med_old, times_old, b * p, flops)
    doc["speedup_over_previous"] = med_old / med
    print(f"previous rule: {med_old:.1f}s, {b * p / med_old:.0f} tokens/s -> engine {med_old / med:.2f}x", flush=True)
  rate_after = matmul_rate(args.matmul_n, 5)
  rate = max(rate_before, rate_after)      # the yardstick: the faster of the two (the conservative share)
  doc["matmul"] = {"n": args.matmul_n, "flop_rate": rate, "before": rate_before, "after": rate_after}
  for row in [doc["engine"], *doc.get("by_numerics", {}).values()]:
    row["share_of_matmul_rate"] = row["flop_rate"] / rate
  print(f"large matmul {rate / 1e9:.1f} GFLOP/s: engine prefill at {doc['engine']['share_of_matmul_rate']:.2f} of it")
  common.finish(doc, out)


if __name__ == "__main__":
  main()
