"""A draft step's matmuls alone: every way of reading a quantized matrix, timed at LLaMA-3.1-8B's shapes.

Why: an int4 draft copy with one scale per output channel keeps 0.83 of the bfloat16 copy's sampled
acceptance on SmolLM2, groups of 64 keep 0.92 (CPU, layers/quant.py), but on an H100 XLA did not fuse a
group's scale into its GEMM (a draft step 19.8 ms against 8.2 for int8, 2026-11-27). This measures, per
matrix shape and row count, a chain of L distinct matrices (as a draft step reads L layers; x of one is
tanh of the previous output, so nothing is hoisted or cached) compiled with the quantized draft's XLA
options, for
  * bf16: the bfloat16 matrix (what a plain draft reads);
  * int8: `quant.quantized_dense` on an int8 copy (the engine's GPU form: converted inside the GEMM);
  * int4_channel: the engine's GPU int4 form (native int4, scale and offset per output channel);
  * int4_g64_xla: groups of 64 through `quantized_dense` (the dequantized operand);
  * int4_g64_batched: groups of 64 as one batched dot per group against the integers, scaled after it
    and summed over groups (an XLA formulation without a custom kernel);
  * int4_g64_kernel: groups of 64 packed (quant.INT4_KERNEL on) through `quantized_dense`, the draft's
    own call of the kernel at its default tiling;
  * pallas_...: groups of 64 through `pallas.int4_matmul` (packed bytes, split-K), several tilings.
Per variant: microseconds per matrix (median of --repeats calls of the chain / L), the bytes it must read
and the bandwidth that makes, and for every int4 g64 variant the largest error of the first matrix's
output against float64 numpy on the same integers (so a wrong kernel cannot look fast).

  python -m benchmarks.gpu_int4_matmul                # GPU: q/o [4096, 4096] and gate/up [4096, 14336], M 8, 32
  python -m benchmarks.gpu_int4_matmul --smoke        # tiny, CPU, the kernel in interpret mode
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.gpu_bench import int4_kernel_as
from magicdec_jax import pallas as P
from magicdec_jax.layers import quant
from magicdec_jax.pallas.int4_matmul import pack_int4, pallas_int4_matmul

GROUP = 64
# (block_n, num_splits, groups_per_step, num_warps, num_stages)
TILINGS = ((32, 1, 2, 2, 3), (32, 2, 2, 2, 3), (128, 1, 2, 4, 3), (128, 2, 2, 4, 3), (128, 4, 2, 4, 3),
           (128, 8, 1, 4, 3), (64, 4, 2, 4, 3), (64, 8, 2, 4, 3), (256, 2, 2, 8, 3), (128, 4, 4, 4, 2),
           (32, 8, 2, 2, 3), (128, 2, 8, 4, 3), (256, 4, 4, 8, 3))
TILING_FIELDS = ("block_n", "num_splits", "groups_per_step", "num_warps", "num_stages")
EQ = "MK,KN->MN"


def tiling_name(tiling) -> str:
  """A TILINGS entry's variant name."""
  return "pallas_bn{}_s{}_g{}_w{}_st{}".format(*tiling)


def layer_weights(k: int, n: int, layers: int) -> list[jax.Array]:
  make = jax.jit(lambda key: (0.02 * jax.random.normal(key, (k, n), jnp.float32)) + 0.002)
  return [make(jax.random.key(i)) for i in range(layers)]


def quantized(ws, kind: str, group: int):
  with_group = jax.jit(lambda w: quant.quantize_weight("q", w, kind, group))
  return [with_group(w) for w in ws]


def variants(ws, tilings, interpret: bool):
  """name -> (params list, matmul(x, p) -> [M, N] float32, bytes read per matrix, g64 QuantizedWeight list)"""
  k, n = ws[0].shape
  g64 = quantized(ws, "int4", GROUP)
  g64_bytes = k * n // 2 + 8 * n * k // GROUP                  # half a byte a value, f32 scale + offset a group
  dense = lambda x, p: quant.quantized_dense(EQ, x, p, jnp.float32, jnp.bfloat16)
  out = {
      "bf16": ([w.astype(jnp.bfloat16) for w in ws],
               lambda x, p: jnp.einsum(EQ, x, p, preferred_element_type=jnp.float32), 2 * k * n),
      "int8": (quantized(ws, "int8", None), dense, k * n + 4 * n),
      "int4_channel": (quantized(ws, "int4", 0), dense, k * n // 2 + 8 * n),
      "int4_g64_xla": (g64, dense, g64_bytes),
      "int4_g64_batched": (g64, batched_group_dot, g64_bytes),
      "int4_g64_kernel": (kernel_copy(ws), dense, g64_bytes),
  }
  packed = [(pack_int4(w.q, GROUP), w.scale, w.offset) for w in g64]
  for tiling in tilings:
    bn, splits, per_step, warps, stages = tiling
    if n % bn or (k // GROUP) % splits or (k // GROUP // splits) % per_step:
      continue
    kw = dict(group=GROUP, block_n=bn, num_splits=splits, groups_per_step=per_step)
    if interpret:
      kw["interpret"] = True
    else:
      kw["compiler_params"] = P._triton_params(warps, stages)
    fn = lambda x, p, kw=kw: pallas_int4_matmul(x, *p, **kw)
    out[tiling_name(tiling)] = (packed, fn, g64_bytes)
  return out, g64


def kernel_copy(ws):
  """Groups of 64 stored packed (quant.INT4_KERNEL on), multiplied as the draft does: quantized_dense calls
  the kernel at its default tiling."""
  with int4_kernel_as(True):
    return quantized(ws, "int4", GROUP)


def batched_group_dot(x: jax.Array, w: quant.QuantizedWeight) -> jax.Array:
  """Groups of g as a batched dot against the integers: sum_G scale * (x_G . q_G) + offset * sum(x_G)."""
  m, k = x.shape
  groups = w.scale.shape[0]
  dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32   # XLA:CPU: no batched bf16 -> f32 dot
  xg = x.astype(dtype).reshape(m, groups, k // groups)
  y = jnp.einsum("MGk,GkN->MGN", xg, w.q.reshape(groups, k // groups, -1).astype(dtype),
                 preferred_element_type=jnp.float32)
  y = jnp.einsum("MGN,GN->MN", y, w.scale)
  return y + jnp.einsum("MG,GN->MN", jnp.sum(xg.astype(jnp.float32), axis=-1), w.offset)


def chain(fn, k: int):
  """x -> the L matrices applied in turn (x of the next: tanh of the first k outputs, bfloat16)."""
  def run(x, params):
    for p in params:
      x = jnp.tanh(fn(x, p)[:, :k]).astype(jnp.bfloat16)
    return x
  return run


def reference_output(x: jax.Array, w: quant.QuantizedWeight) -> np.ndarray:
  """float64 x @ (q * scale + offset) for a group-wise int4 QuantizedWeight, in numpy."""
  q = np.asarray(w.q, np.int64)
  k, n = q.shape
  deq = (q.reshape(w.scale.shape[0], -1, n) * np.asarray(w.scale, np.float64)[:, None]
         + np.asarray(w.offset, np.float64)[:, None]).reshape(k, n)
  return np.asarray(x, np.float64) @ deq


def relative_error(got: jax.Array, want: np.ndarray) -> float:
  return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--shapes", type=common.shape_list, default=[(4096, 4096), (4096, 14336)],
                  help="K x N matrix shapes, e.g. 4096x4096,4096x14336")
  ap.add_argument("--rows", type=common.int_list, default=[8, 32], help="rows M of x (a draft step's tokens)")
  ap.add_argument("--layers", type=int, default=16, help="distinct matrices in one timed chain")
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument("--deadline-s", type=float, default=1e9, help="skip what would start after this")
  args = common.parse(ap, argv, shapes=[(256, 256)], rows=[8], layers=2, repeats=2)
  bad = [s for s in args.shapes if len(s) != 2 or s[1] < s[0] or s[0] % GROUP]
  if bad:
    raise SystemExit(f"--shapes: {bad}: each K x N needs N >= K (the chain feeds an output to the next "
                     f"matrix) and K a multiple of {GROUP}")
  interpret = jax.default_backend() != "gpu"
  tilings = TILINGS[:2] if args.smoke else TILINGS
  options = quant.xla_options("int4")
  doc = {"env": common.env_info(), "command": common.command(), "backend": jax.default_backend(),
         "xla_options": options, "group": GROUP, "layers": args.layers, "repeats": args.repeats,
         "pallas": "interpret" if interpret else "triton", "results": []}
  path = common.output_path(args.output, "gpu_int4_matmul")
  t0 = time.time()
  tables = {}
  for k, n in args.shapes:
    ws = layer_weights(k, n, args.layers)
    tables[k, n] = variants(ws, tilings, interpret)
    del ws
  for m in args.rows:                        # the first row count at every shape before the next
    for (k, n), (table, g64) in tables.items():
      x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32).astype(jnp.bfloat16)
      want = reference_output(x, g64[0])     # the first matrix's output in float64, on its integers
      row = {"K": k, "N": n, "M": m, "variants": {}}
      doc["results"].append(row)
      for name, (params, fn, nbytes) in table.items():
        if time.time() - t0 > args.deadline_s:
          row["variants"][name] = {"skipped": "deadline"}
          continue
        rec = row["variants"][name] = {"bytes": nbytes}
        try:
          exe = jax.jit(chain(fn, k)).lower(x, params).compile(compiler_options=options)
          sec, _ = common.median_time(lambda: exe(x, params), args.repeats)
        except Exception as e:  # noqa: BLE001 - a tiling that does not lower is recorded, not fatal
          rec["error"] = f"{type(e).__name__}: {e}"[:400]
          print(f"K{k} N{n} M{m} {name}: {rec['error'][:160]}", flush=True)
          continue
        rec["us_per_matrix"] = sec / args.layers * 1e6
        rec["bytes_per_s"] = nbytes / (sec / args.layers)
        if name.startswith(("int4_g64", "pallas")):
          rec["max_rel_err_vs_float64"] = relative_error(jax.jit(fn)(x, params[0]), want)
        print(f"K{k} N{n} M{m} {name:34s} {rec['us_per_matrix']:9.1f} us  "
              f"{rec['bytes_per_s'] / 1e9:7.0f} GB/s", flush=True)
      ok = {v: r["us_per_matrix"] for v, r in row["variants"].items() if "us_per_matrix" in r}
      for base in ("bf16", "int8"):
        if base in ok:
          row[f"time_over_{base}"] = {v: t / ok[base] for v, t in ok.items()}
      pallas = {v: t for v, t in ok.items() if v.startswith("pallas")}
      if pallas:
        row["best_pallas"] = min(pallas, key=pallas.get)
        row["best_pallas_tiling"] = next(dict(zip(TILING_FIELDS, t)) for t in tilings
                                         if tiling_name(t) == row["best_pallas"])
      common.write_json(doc, path)
  common.finish(doc, path)


if __name__ == "__main__":
  main()
