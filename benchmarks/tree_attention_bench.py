"""Benchmark prefix + tree attention: XLA path vs the Pallas kernel, at verify-step shapes.

Prints one JSON document: device, jax version, date, and per shape the median milliseconds of every
backend that lowers here (XLA always; Pallas Triton on GPU; the Pallas interpreter only with --smoke),
the XLA/Pallas time ratio, and the largest output difference against XLA as a sanity check.

  python -m benchmarks.tree_attention_bench                # B {8,16,32} x ctx {8K,16K,32K} x T {1,4,16,64}
  python -m benchmarks.tree_attention_bench --smoke        # tiny CPU shapes, interpreter included
"""
from __future__ import annotations

import datetime
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import pallas as P


def random_tree(rng, t: int) -> np.ndarray:
  """[T, T] ancestor-or-self mask of a random BFS-ordered tree."""
  anc = np.eye(t, dtype=bool)
  parent = 0
  for i in range(1, t):
    parent = int(rng.integers(parent, i)) if i > 1 else 0
    anc[i] |= anc[parent]
  return anc


def make_inputs(rng, b, ctx, h, kh, d, t, dtype):
  q = jnp.asarray(rng.standard_normal((b, t, h, d)), dtype)
  # the kernel's cache layout: [B, K, S, D] (one contiguous [S, D] block per row and KV head)
  k = jnp.asarray(rng.standard_normal((b, kh, ctx, d)), dtype)
  v = jnp.asarray(rng.standard_normal((b, kh, ctx, d)), dtype)
  jitter = rng.integers(0, max(1, ctx // 8), size=b)                     # ragged rows
  base = jnp.asarray(ctx - t - jitter, jnp.int32)
  anc = jnp.asarray(random_tree(rng, t))
  return q, k, v, base, anc


def time_ms(fn, args, warmup: int, repeats: int) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t0) * 1e3)
  return statistics.median(times)


def bench_shape(rng, impls, b, ctx, h, kh, d, t, dtype, args_ns):
  inputs = make_inputs(rng, b, ctx, h, kh, d, t, dtype)
  row = dict(batch=b, context=ctx, tokens=t, heads=h, kv_heads=kh, head_dim=d,
             dtype=jnp.dtype(dtype).name, base=[int(x) for x in inputs[3]])
  knobs = dict(block_k=args_ns.block_k, block_q=args_ns.block_q, num_splits=args_ns.num_splits)
  ref = None
  for impl in impls:
    kw = dict(knobs, num_warps=args_ns.num_warps, num_stages=args_ns.num_stages) \
        if impl == "pallas_triton" else (knobs if impl != "xla" else {})
    fn = jax.jit(lambda *a, impl=impl, kw=kw: P.tree_attention(*a, impl=impl, **kw))
    try:
      out = jax.block_until_ready(fn(*inputs))
      row[f"{impl}_ms"] = time_ms(fn, inputs, args_ns.warmup, args_ns.repeats)
    except Exception as e:  # noqa: BLE001 - report backends that do not lower or run
      row[f"{impl}_error"] = f"{type(e).__name__}: {e}"[:300]
      continue
    out = np.asarray(out.astype(jnp.float32))
    if ref is None:
      ref = out
    else:
      row[f"{impl}_max_abs_diff_vs_{impls[0]}"] = float(np.max(np.abs(out - ref)))
  for impl in impls[1:]:
    if f"{impl}_ms" in row and f"{impls[0]}_ms" in row:
      row[f"{impls[0]}_over_{impl}"] = row[f"{impls[0]}_ms"] / row[f"{impl}_ms"]
  return row


def main(argv=None):
  ap = common.parser(__doc__, smoke="tiny shapes for a CPU run")
  ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32])
  ap.add_argument("--context", type=int, nargs="+", default=[8192, 16384, 32768])
  ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64])
  ap.add_argument("--heads", type=int, default=32)
  ap.add_argument("--kv-heads", type=int, default=8)
  ap.add_argument("--head-dim", type=int, default=128)
  ap.add_argument("--dtype", default="bfloat16")
  ap.add_argument("--impls", nargs="+", default=None, help="default: xla + every Pallas backend here")
  ap.add_argument("--block-k", type=int, default=None)
  ap.add_argument("--block-q", type=int, default=None)
  ap.add_argument("--num-splits", type=int, default=None)
  ap.add_argument("--num-warps", type=int, default=None)
  ap.add_argument("--num-stages", type=int, default=None)
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=10)
  ap.add_argument("--out", dest="output", help="the same as --output (default: the JSON is only printed)")
  ap.add_argument("--strict", action="store_true", help="exit 1 if any backend errors (the smoke test sets it)")
  a = common.parse(ap, argv, batch=[2], context=[256], tokens=[1, 4], heads=8, kv_heads=2, head_dim=64, repeats=3,
                   warmup=1)
  on_gpu = jax.default_backend() == "gpu"
  impls = a.impls or (["xla"] + (["pallas_triton"] if on_gpu else [])
                      + (["pallas_interpret"] if a.smoke else []))
  rng = np.random.default_rng(0)
  dtype = jnp.dtype(a.dtype)
  rows = []
  for b in a.batch:
    for ctx in a.context:
      for t in a.tokens:
        row = bench_shape(rng, impls, b, ctx, a.heads, a.kv_heads, a.head_dim, t, dtype, a)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
  doc = dict(device=str(jax.devices()[0]), device_kind=jax.devices()[0].device_kind,
             backend=jax.default_backend(), jax_version=jax.__version__,
             date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             impls=impls, warmup=a.warmup, repeats=a.repeats, results=rows)
  print(json.dumps(doc, indent=1))
  if a.output:
    common.write_json(doc, a.output, stamp=False)
  errors = [k for r in rows for k in r if k.endswith("_error")]
  if a.strict and errors:
    raise SystemExit(f"tree_attention_bench: {len(errors)} backend errors: {errors}")
  return doc


if __name__ == "__main__":
  main()
