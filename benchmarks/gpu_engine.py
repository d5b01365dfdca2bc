"""GPU figures of the engine users run: end to end through the engine's own compiled loop, kernel by kernel.

The harness (benchmarks/gpu_bench.py) runs each configuration through `Engine.decode` from a context-long
cache of random bf16 weights at real shapes, with acceptance simulated as Bernoulli(alpha) per draft token,
and records tokens/s (whole loop and marginal between N1 and N2 new tokens), loop and row rounds, and a
kernel-time breakdown per loop round; the floor is the bytes an AR step must read over the read and copy
rates measured in the same process.

Parts (`--parts`, in this order, each configuration skipped once `--deadline-s` would pass; the JSON is
rewritten after every configuration, so a killed run keeps what it measured):
  headline   8 x 32K LLaMA-3.1-8B: AR, StreamingLLM self-draft chain 2 (bf16) and chain 3 (int8 copy), a
             LLaMA-3.2-1B-shape draft chain 3 in bf16 and as an int8 copy;
  quant      one draft step against the AR step for bf16 / int8 / int4 copies (int4 in groups of 64, 128
             and per channel, stored as native 4-bit integers), all with XLA's Triton GEMMs; then end to
             end the int4 copy whose step was fastest, the int8 chain 2, and the bf16 chain 2 with Triton
             GEMMs; first a check that a native int4 array passes the engine's placement and executables;
  batch1     1 x 4K AR step against its floor (the engine's options, and with Triton GEMMs);
  shard      one GPU's shard of LLaMA-3.1-8B under TP 8 (heads, KV heads and MLP / 8) at 64 and 32 x 32K,
             the all-reduce time added from the cost model (a prediction; the paper measured 8 x H100);
  identity   greedy tokens of speculative vs plain decoding through `engine.generate` (real acceptance,
             random 8-layer LLaMA-3.2-1B shape, head x 25), fast and invariant numerics;
  invariant  the headline's AR and self chain 3 with fixed-shape numerics;
  previous   the headline's AR and self chain 2 under the options before issue 44 (dot merger on);
  int4       issue 46's int4 figures: one draft step (AR with cuBLAS and with Triton GEMMs, int8, int4 per
             channel, int4 with the embedding / LM head / down projections in int8) against the AR step;
             end to end AR with Triton GEMMs, int4 per channel at chains 2 / 3 / 4 (alpha 0.8) and chain 3
             at --alpha-int4 (the acceptance SmolLM2's int4 copy keeps, a CPU measurement), the mixed copy
             at chain 3, int8 chain 2 at --alpha-int8; the TP-8 shard at batch 64 with int4 chain 3;
  defaults   what a user gets with no options: AR, self chain 2 (bf16), chain 3 on the int4 and int8 copies
             (the library's INT4_KEEP_INT8 and group), and the 1 x 4K AR step against its floor;
  offsets    what int4's offsets (asymmetric scales, quant.INT4_OFFSETS) cost on a GPU: one draft step of the
             default int4 copy with and without them against the AR step, then end to end AR and chain 3
             on each at alpha 0.8 and at its own CPU-measured acceptance (--alpha-int4-offsets,
             --alpha-int4-sym), int8 chain 3 at --alpha-int8;
  kernel     the Pallas int4 kernel in the draft (quant.INT4_KERNEL: groups of 64 packed, pallas/int4_matmul.py
             at its default tiling) against the GPU's per-channel int4 copy: one draft step each and int8's
             against the AR step, then end to end AR and chain 3 on each at alpha 0.8 and at its own
             CPU-measured acceptance (--alpha-int4-g64, --alpha-int4-offsets). With --int4-tilings (a
             benchmarks/gpu_int4_matmul.py JSON from the same GPU) the kernel runs, per matrix shape, the
             tiling that measured fastest at the fewest rows where it beat the default one.

  PYTHONPATH=. python3 -m benchmarks.gpu_engine --output $OUT/gpu_engine.json --deadline-s 540
  python -m benchmarks.gpu_engine --smoke --output /tmp/gpu_engine.json    # tiny shapes on CPU, ~3 minutes
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")   # before jax starts

from benchmarks import common  # noqa: E402
from benchmarks.gpu_bench import (Bench, int4_group_as, int4_kernel_as, int4_keep_int8_as,  # noqa: E402
                                  int4_offsets_as, models)
from benchmarks.simulated_acceptance import install_bernoulli  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import compile as compiling  # noqa: E402
from magicdec_jax import drafts, engine, plan  # noqa: E402
from magicdec_jax.layers import quant  # noqa: E402
from magicdec_jax.layers.dense import weight_copy  # noqa: E402
from magicdec_jax.pallas.int4_matmul import MEASURED_TILINGS  # noqa: E402
from magicdec_jax.measure import calibrate  # noqa: E402
from magicdec_jax.model import Model, init_params  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402
from magicdec_jax.tuning import shapes  # noqa: E402

PARTS = ("headline", "quant", "batch1", "shard", "identity", "invariant", "previous", "quant_rerun", "int4",
         "defaults", "offsets", "kernel")
MIXED_INT8 = ("embed", "lm_head", "down")     # what the "int4 mixed" rows keep in int8 (quant.INT4_KEEP_INT8)
PREVIOUS_OPTIONS = {"xla_gpu_enable_triton_gemm": False}          # before issue 44: dot merger on
TRITON = {"xla_gpu_enable_triton_gemm": True}
INT4_GROUPS = (64, 128, 0)                                        # 0: one scale per output channel
# Ring all-reduce between 8 GPUs: a prediction from two assumed constants, not a measurement.
ALLREDUCE_BUS_BYTES_PER_S = 360e9     # NCCL all-reduce bus bandwidth, 8 x H100 NVLink 4 (assumed)
ALLREDUCE_LATENCY_S = 12e-6           # one small all-reduce's fixed cost (assumed)


def measured_tilings(doc: dict) -> dict:
  """(K, N) -> the fastest Pallas tiling of a benchmarks/gpu_int4_matmul.py run at its fewest rows, for the
  shapes where it beat the draft's own kernel call (int4_g64_kernel, the default tiling) and agreed with
  float64 numpy (relative error < 1e-3)."""
  rows = [r for r in doc.get("results", []) if r.get("best_pallas_tiling")]
  fewest = min((r["M"] for r in rows), default=None)
  out = {}
  for r in rows:
    if r["M"] != fewest:
      continue
    best, default = r["variants"][r["best_pallas"]], r["variants"].get("int4_g64_kernel", {})
    if best.get("max_rel_err_vs_float64", 1.0) < 1e-3 and best["us_per_matrix"] < default.get("us_per_matrix", 1e30):
      out[r["K"], r["N"]] = dict(r["best_pallas_tiling"])
  return out


def allreduce_seconds(nbytes: float, devices: int) -> float:
  """Predicted time of one ring all-reduce of `nbytes` over `devices` GPUs (see the two constants)."""
  return ALLREDUCE_LATENCY_S + 2 * (devices - 1) / devices * nbytes / ALLREDUCE_BUS_BYTES_PER_S


def part_headline(b: Bench, target: Model, small: Model, B: int, C: int):
  runs = [b.run("headline", "AR", target, None, Tree((-1,)), None, B, C)]
  if "loop_s_N2" in runs[0]:
    b.res["parts"]["headline"] = {"floor": b.floor(target.config, B, C), "batch": B, "context": C}
  runs.append(b.run("headline", "self chain2", target, drafts.StreamingDraft(16, 512), Tree.chain(2), 0.8, B, C))
  runs.append(b.run("headline", "self chain3 int8", target, drafts.StreamingDraft(16, 512, weights="int8"),
                    Tree.chain(3), 0.8, B, C))
  runs.append(b.run("headline", "1B chain3", target, drafts.ModelDraft(small, 16, 512), Tree.chain(3), 0.7, B, C))
  runs.append(b.run("headline", "1B chain3 int8", target, drafts.ModelDraft(small, 16, 512, weights="int8"),
                    Tree.chain(3), 0.7, B, C))
  b.ratios("headline", "AR", runs)
  ar = runs[0]
  if "tok_per_s_marginal" in ar:
    fl = b.res["parts"]["headline"]["floor"]
    step = 1e3 / ar["tok_per_s_marginal"] * B
    b.res["parts"]["headline"]["ar_step_ms_marginal"] = step
    for k in ("copy", "read"):
      if f"{k}_floor_ms" in fl:
        b.res["parts"]["headline"][f"ar_share_of_{k}_floor"] = fl[f"{k}_floor_ms"] / step
    b.save()


def part_quant_rerun(b: Bench, target: Model, small: Model, tcfg, C: int, shard_c: int):
  """The quantized drafts end to end with the plan's own options (the draft's Triton GEMMs kept)."""
  sd = lambda w: drafts.StreamingDraft(16, 512, weights=w)
  runs = [b.run("quant_rerun", "AR", target, None, Tree((-1,)), None, 8, C, profile=False),
          b.run("quant_rerun", "self chain3 int8", target, sd("int8"), Tree.chain(3), 0.8, 8, C),
          b.run("quant_rerun", "1B chain3 int8", target, drafts.ModelDraft(small, 16, 512, weights="int8"),
                Tree.chain(3), 0.7, 8, C),
          b.run("quant_rerun", "self chain2 int8", target, sd("int8"), Tree.chain(2), 0.8, 8, C)]
  with int4_group_as(0):
    runs.append(b.run("quant_rerun", "self chain3 int4 gchannel", target, sd("int4"), Tree.chain(3), 0.8, 8, C))
  b.ratios("quant_rerun", "AR", runs)
  scfg = tcfg.replace(num_heads=tcfg.num_heads // 8, num_kv_heads=max(1, tcfg.num_kv_heads // 8),
                      intermediate_size=tcfg.intermediate_size // 8)
  shard = Model(scfg, init_params(scfg, jax.random.key(5)), name="shard")
  B = 8 if b.args.smoke else 64
  rows = [b.run("quant_rerun_shard", f"AR b{B}", shard, None, Tree((-1,)), None, B, shard_c, profile=False),
          b.run("quant_rerun_shard", f"self chain3 int8 b{B}", shard, sd("int8"), Tree.chain(3), 0.8, B, shard_c)]
  b.ratios("quant_rerun_shard", f"AR b{B}", rows)


def time_steps(b: Bench, target: Model, cases, B: int) -> dict:
  """One decode step each, against the one labelled "AR": cases of (label, weights, int4 group (None: the
  backend's), int4 keep-int8 names (None: the library's), context, cache kind, XLA options (None: the
  engine's)); an int4 copy's step records the group it used (0: per channel) and how many of its matrices
  are packed for the int4 kernel."""
  steps = {}
  isq = lambda x: isinstance(x, quant.QuantizedWeight)
  for label, w, group, keep, ctx, kind, opts in cases:
    if b.late(10):
      steps[label] = {"skipped": "deadline"}
      continue
    try:
      with int4_group_as(group), int4_keep_int8_as(keep):
        params = target.params if w is None else weight_copy(target.params, w)
        r = calibrate.time_step(params, target.config, B, ctx, 1, kind, 10, options=opts or compiling.engine_options())
        used_group = quant.int4_group() if w == "int4" else None
      packed = sum(x.packed for x in jax.tree.leaves(params, is_leaf=isq) if isq(x))
      del params
      steps[label] = {"median_ms": r["median_s"] * 1e3, "min_ms": r["seconds"] * 1e3, "int4_group": used_group,
                      "packed_matrices": packed}
    except Exception as e:                                      # noqa: BLE001
      steps[label] = {"error": repr(e)[:400]}
    print("step", label, steps[label], flush=True)
    jax.clear_caches()
    gc.collect()
  return over_ar(steps)


def over_ar(steps: dict) -> dict:
  """`steps` with each timed step's median over the one labelled "AR" added as "over_ar" (where both
  were timed)."""
  base = steps.get("AR", {}).get("median_ms")
  for v in steps.values():
    if base and "median_ms" in v:
      v["over_ar"] = v["median_ms"] / base
  return steps


def part_int4(b: Bench, target: Model, tcfg, C: int, shard_c: int, sink: int = 16, window: int = 512):
  """Issue 46's int4 figures (see the module docstring)."""
  eng_opts, triton = compiling.engine_options(), dict(compiling.engine_options(), **TRITON)
  ring = sink + window
  cases = [("AR", None, 0, None, C, "linear", eng_opts), ("AR triton", None, 0, None, C, "linear", triton),
           ("draft bf16 triton", None, 0, None, ring, "ring", triton),
           ("draft int8 triton", "int8", 0, None, ring, "ring", triton),
           ("draft int4 channel triton", "int4", 0, (), ring, "ring", triton),
           ("draft int4 mixed triton", "int4", 0, MIXED_INT8, ring, "ring", triton)]
  b.res["parts"]["int4_steps"] = time_steps(b, target, cases, 8)
  b.save()
  sd = lambda w: drafts.StreamingDraft(sink, window, weights=w)
  a4, a8 = b.args.alpha_int4, b.args.alpha_int8
  runs = [b.run("int4", "AR", target, None, Tree((-1,)), None, 8, C, profile=False),
          b.run("int4", "AR triton", target, None, Tree((-1,)), None, 8, C, options=TRITON)]
  with int4_group_as(0), int4_keep_int8_as(()):
    for g in (3, 2, 4):
      runs.append(b.run("int4", f"self chain{g} int4", target, sd("int4"), Tree.chain(g), 0.8, 8, C, profile=g == 3))
    runs.append(b.run("int4", f"self chain3 int4 a{a4}", target, sd("int4"), Tree.chain(3), a4, 8, C, profile=False))
  with int4_group_as(0), int4_keep_int8_as(MIXED_INT8):
    runs.append(b.run("int4", "self chain3 int4 mixed", target, sd("int4"), Tree.chain(3), 0.8, 8, C,
                      extra={"int4_keep_int8": MIXED_INT8}))
  runs.append(b.run("int4", f"self chain2 int8 a{a8}", target, sd("int8"), Tree.chain(2), a8, 8, C, profile=False))
  b.ratios("int4", "AR", runs)
  tp = 2 if b.args.smoke else 8
  scfg = tcfg.replace(num_heads=tcfg.num_heads // tp, num_kv_heads=max(1, tcfg.num_kv_heads // tp),
                      intermediate_size=tcfg.intermediate_size // tp)
  shard = Model(scfg, init_params(scfg, jax.random.key(5)), name="shard")
  B = 8 if b.args.smoke else 64
  rows = [b.run("int4_shard", f"AR b{B}", shard, None, Tree((-1,)), None, B, shard_c, profile=False)]
  with int4_group_as(0), int4_keep_int8_as(()):
    rows.append(b.run("int4_shard", f"self chain3 int4 b{B}", shard, sd("int4"), Tree.chain(3), 0.8, B, shard_c))
  b.ratios("int4_shard", f"AR b{B}", rows)


def part_offsets(b: Bench, target: Model, C: int, sink: int = 16, window: int = 512):
  """Asymmetric int4 (a scale and an offset per group, the library's default) against symmetric, the
  default copy otherwise (the backend's group, INT4_KEEP_INT8): steps, then end to end."""
  ring = sink + window
  steps = time_steps(b, target, [("AR", None, None, None, C, "linear", None),
                                 ("draft int4 offsets", "int4", None, None, ring, "ring", None)], 8)
  with int4_offsets_as(False):
    steps.update(time_steps(b, target, [("draft int4 symmetric", "int4", None, None, ring, "ring", None)], 8))
  b.res["parts"]["offsets_steps"] = over_ar(steps)
  b.save()
  sd = lambda w: drafts.StreamingDraft(sink, window, weights=w)
  a4, a4s, a8 = b.args.alpha_int4_offsets, b.args.alpha_int4_sym, b.args.alpha_int8
  runs = [b.run("offsets", "AR", target, None, Tree((-1,)), None, 8, C, profile=False)]
  for flag, name, alpha in ((True, "offsets", a4), (False, "symmetric", a4s)):
    with int4_offsets_as(flag):
      runs.append(b.run("offsets", f"self chain3 int4 {name}", target, sd("int4"), Tree.chain(3), 0.8, 8, C,
                        profile=flag))
      runs.append(b.run("offsets", f"self chain3 int4 {name} a{alpha}", target, sd("int4"), Tree.chain(3), alpha,
                        8, C, profile=False))
  runs.append(b.run("offsets", f"self chain3 int8 a{a8}", target, sd("int8"), Tree.chain(3), a8, 8, C, profile=False))
  b.ratios("offsets", "AR", runs)


def part_kernel(b: Bench, target: Model, C: int, sink: int = 16, window: int = 512, group: int | None = None):
  """The default int4 copy with the Pallas kernel (groups of 64 packed; `group` overrides, for the smoke's
  narrow matrices) against it without (the backend's group: per channel on a GPU): steps, then end to end
  (see the module docstring)."""
  ring = sink + window
  steps = time_steps(b, target, [("AR", None, None, None, C, "linear", None),
                                 ("draft int8", "int8", None, None, ring, "ring", None),
                                 ("draft int4", "int4", None, None, ring, "ring", None)], 8)
  with int4_kernel_as(True), int4_group_as(group):
    kernel = f"kernel g{quant.int4_group()}"                     # groups of 64 (the smoke: its override)
    steps.update(time_steps(b, target, [(f"draft int4 {kernel}", "int4", None, None, ring, "ring", None)], 8))
    b.res["parts"]["kernel_packed"] = {"packed": steps[f"draft int4 {kernel}"].get("packed_matrices"),
                                       "group": quant.int4_group()}
  b.res["parts"]["kernel_steps"] = over_ar(steps)
  b.save()
  sd = lambda w: drafts.StreamingDraft(sink, window, weights=w)
  runs = [b.run("kernel", "AR", target, None, Tree((-1,)), None, 8, C, profile=False)]
  for flag, name, alpha in ((True, kernel, b.args.alpha_int4_g64), (False, "", b.args.alpha_int4_offsets)):
    with int4_kernel_as(flag), int4_group_as(group if flag else None):
      label = f"self chain3 int4 {name}".strip()
      runs.append(b.run("kernel", label, target, sd("int4"), Tree.chain(3), 0.8, 8, C, profile=flag))
      runs.append(b.run("kernel", f"{label} a{alpha}", target, sd("int4"), Tree.chain(3), alpha, 8, C, profile=False))
  b.ratios("kernel", "AR", runs)


def part_previous(b: Bench, target: Model, B: int, C: int):
  """The headline's AR and self chain 2 under the options before issue 44 (XLA's dot merger on)."""
  prev = [b.run("previous_options", "AR", target, None, Tree((-1,)), None, B, C, options=PREVIOUS_OPTIONS),
          b.run("previous_options", "self chain2", target, drafts.StreamingDraft(16, 512), Tree.chain(2), 0.8, B, C,
                options=PREVIOUS_OPTIONS)]
  b.ratios("previous_options", "AR", prev)


def int4_placement_check() -> dict:
  """Whether a native int4 matrix passes what the engine does with a param: placed on the 1 x 1 mesh by
  the sharding rules, then fed to an ahead-of-time executable compiled with those shardings (XLA:CPU
  refuses it: quant.INT4_STORAGE). On failure int4 values are stored in int8 for the rest of the run."""
  backend = jax.default_backend()
  saved = quant.INT4_STORAGE.pop(backend, None)
  try:
    w = jax.random.normal(jax.random.key(2), (256, 128), jnp.float32)
    qw = quant.quantize_weight("gate", w, "int4")
    mesh = plan.one_device_mesh()
    sh = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), qw)
    placed = jax.device_put(qw, sh)
    x = jax.random.normal(jax.random.key(3), (4, 256), jnp.bfloat16)
    fn = lambda q, a: quant.quantized_dense("TD,DF->TF", a, q, jnp.float32, jnp.bfloat16)
    exe = compiling.jit_executable("int4_check", fn, (placed, x), {}, in_shardings=(sh, None))
    got = np.asarray(exe(placed, x), np.float64)
    want = np.asarray(x, np.float64) @ np.asarray(qw.dequantize(jnp.float32), np.float64)
    # bf16 operands land near 1e-3 (an elementwise allclose refused a correct result on the H100, 2026-11-27)
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    out = {"ok": rel < 1e-2, "relative_error": rel, "dtype": str(placed.q.dtype),
           "layout": str(getattr(placed.q, "format", None))[:200]}
  except Exception as e:                                           # noqa: BLE001 (recorded)
    out = {"ok": False, "error": repr(e)[:500]}
  if not out["ok"]:
    quant.INT4_STORAGE[backend] = jnp.int8 if saved is None else saved
  elif saved is not None:
    quant.INT4_STORAGE[backend] = saved
  out["storage"] = str(jnp.dtype(quant.INT4_STORAGE.get(backend, jnp.int4)))
  return out


def part_quant(b: Bench, target: Model, B: int, C: int, window: int = 512, sink: int = 16):
  """Quantized self-draft weights (layers/quant.py): one draft step (ring of sink + window) against the AR
  step for bf16 / int8 / int4 copies with Triton GEMMs (which fuse a conversion into the matmul), then end
  to end the fastest int4 grouping, the int8 chain 2 and the bf16 chain 2 with Triton GEMMs."""
  check = int4_placement_check()
  b.res["parts"]["int4_placement"] = check
  print("int4 placement", check, flush=True)
  triton = dict(compiling.engine_options(), **TRITON)
  ring = sink + window
  cases = [("AR", None, None, None, C, "linear", None), ("draft bf16", None, None, None, ring, "ring", None),
           ("draft bf16 triton", None, None, None, ring, "ring", triton),
           ("draft int8 triton", "int8", None, None, ring, "ring", triton)]
  cases += [(f"draft int4 g{g or 'channel'} triton", "int4", g, None, ring, "ring", triton) for g in INT4_GROUPS]
  steps = time_steps(b, target, cases, B)
  b.res["parts"]["quant_steps"] = steps
  b.save()
  int4 = [(v["median_ms"], v["int4_group"]) for k, v in steps.items() if k.startswith("draft int4") and "median_ms" in v]
  best = min(int4)[1] if int4 else quant.int4_group()
  runs = [b.run("quant", "AR", target, None, Tree((-1,)), None, B, C, profile=False)]
  with int4_group_as(best):
    runs.append(b.run("quant", f"self chain3 int4 g{best or 'channel'}", target,
                      drafts.StreamingDraft(sink, window, weights="int4"), Tree.chain(3), 0.8, B, C,
                      extra={"int4_group": best, "int4_storage": check["storage"]}))
  with int4_group_as(None):
    runs.append(b.run("quant", "self chain2 int8", target, drafts.StreamingDraft(sink, window, weights="int8"),
                      Tree.chain(2), 0.8, B, C))
  runs.append(b.run("quant", "self chain2 triton", target, drafts.StreamingDraft(sink, window), Tree.chain(2), 0.8,
                    B, C, options=TRITON))
  b.ratios("quant", "AR", runs)


def part_batch1(b: Bench, target: Model, C: int):
  base = compiling.engine_options()
  variants = {"engine": base, "triton_gemm": dict(base, **TRITON)}
  fl = b.floor(target.config, 1, C)
  out = {"floor": fl}
  for name, opts in variants.items():
    r = b.run("batch1", f"AR {name}", target, None, Tree((-1,)), None, 1, C, options=opts)
    if "tok_per_s_marginal" in r:
      step = 1e3 / r["tok_per_s_marginal"]
      out[name] = {"step_ms_marginal": step, **{f"share_of_{k}_floor": fl[f"{k}_floor_ms"] / step
                                               for k in ("copy", "read") if f"{k}_floor_ms" in fl}}
  b.res["parts"]["batch1"] = out
  b.save()
  print("batch1", out, flush=True)


def part_shard(b: Bench, cfg, C: int, batches, tp: int = 8):
  """LLaMA-3.1-8B's TP-8 shard on one GPU: at the largest batch AR, self chain 2 (bf16) and chain 3 (int8
  copy); at the others AR and self chain 3 (bf16)."""
  scfg = cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=max(1, cfg.num_kv_heads // tp),
                     intermediate_size=cfg.intermediate_size // tp)
  shard = Model(scfg, init_params(scfg, jax.random.key(5)), name="shard")
  table = {}
  for B in batches:
    kinds = ((2, None), (3, "int8")) if B == max(batches) else ((3, None),)
    rows = [b.run("shard", f"AR b{B}", shard, None, Tree((-1,)), None, B, C, extra={"tp_shard_of": tp})]
    rows += [b.run("shard", f"self chain{g}{' ' + w if w else ''} b{B}", shard,
                   drafts.StreamingDraft(16, 512, weights=w), Tree.chain(g), 0.8, B, C, extra={"tp_shard_of": tp})
             for g, w in kinds]
    ar = rows[0]
    if "ms_per_loop_round" not in ar:
      continue
    ar_step = ar["ms_per_loop_round"] / 1e3
    ar_bytes = B * cfg.hidden_size * 2                       # one token per row, bf16, per all-reduce
    per_fwd = lambda t: 2 * cfg.num_layers * allreduce_seconds(ar_bytes * t, tp)
    ent = {"ar_step_ms": ar_step * 1e3, "ar_allreduce_ms_predicted": per_fwd(1) * 1e3}
    for r in rows[1:]:
      if "ms_per_loop_round" not in r:
        continue
      g = r["gamma"]
      # a round: g draft steps (1 token each) + a verify pass of g + 1 tokens, each forward 2L all-reduces
      comm = g * per_fwd(1) + per_fwd(g + 1)
      # the loop's wall: its rounds (until the slowest row ends), each one round's time + its all-reduces
      with_comm = (r["tokens_N2"] / B) * (ar_step + per_fwd(1)) / (
          r["loop_rounds_N2"] * (r["ms_per_loop_round"] / 1e3 + comm))
      tok_round = r["tokens_N2"] / B / r["row_rounds_N2"]
      ent[r["label"]] = {"speedup_one_gpu": r["tok_per_s"] / ar["tok_per_s"],
                         "speedup_with_allreduce_predicted": with_comm, "tokens_per_row_round": tok_round,
                         "allreduce_ms_per_round_predicted": comm * 1e3}
    table[f"b{B}"] = ent
  b.res["parts"]["shard"] = {"tp": tp, "shard_config": dataclasses.asdict(scfg), "table": table,
                             "paper_8xH100_tp8_32k": {"b32": 1.23, "b64": 1.43},
                             "allreduce_model": {"bus_bytes_per_s": ALLREDUCE_BUS_BYTES_PER_S,
                                                 "latency_s": ALLREDUCE_LATENCY_S, "kind": "prediction"}}
  b.save()
  print("shard", json.dumps(table, default=str), flush=True)


def part_identity(b: Bench, smoke: bool):
  """Greedy speculative tokens vs plain decoding's, real acceptance, bf16; fast and invariant numerics."""
  if b.late(b.args.config_s * 2):
    b.res["parts"]["identity"] = {"skipped": "deadline"}; b.save(); return
  cfg = models(True)[0] if smoke else shapes.model_shape("llama32_1b").replace(num_layers=8)
  params = init_params(cfg, jax.random.key(7))
  params["embed"] = params["embed"] * jnp.asarray(25, params["embed"].dtype)    # sharper logits (tied head)
  if "lm_head" in params:
    params["lm_head"] = params["lm_head"] * jnp.asarray(25, params["lm_head"].dtype)
  m = Model(cfg, params, name="identity")
  rng = np.random.default_rng(0)
  n, p, new = (2, 40, 12) if smoke else (4, 1024, 64)
  prompts = rng.integers(0, cfg.vocab_size, (n, p)).tolist()
  install_bernoulli(None, None)
  out = {}
  for numerics in ("fast", "invariant"):
    try:
      t0 = time.perf_counter()
      common = dict(max_new_tokens=new, temperature=0.0, numerics=numerics, progress=False)
      ar = engine.generate(m, prompts, **common).tokens
      sp = engine.generate(m, prompts, draft=drafts.StreamingDraft(16, 256), gamma=3, **common)
      first = [next((i for i, (x, y) in enumerate(zip(a, s)) if x != y), None) for a, s in zip(ar, sp.tokens)]
      out[numerics] = {"rows_identical": sum(f is None for f in first), "rows": n, "first_difference": first,
                       "acceptance": [r.get("acceptance_rate") for r in sp.row_stats], "seconds": time.perf_counter() - t0}
    except Exception as e:                                        # noqa: BLE001
      out[numerics] = {"error": repr(e)[:600]}
    print("identity", numerics, out[numerics], flush=True)
    b.res["parts"]["identity"] = out
    b.save()
    compiling.clear(); jax.clear_caches(); gc.collect()


def main(argv=None):
  ap = common.parser(__doc__, smoke="tiny bfloat16 shapes on CPU (checks the script, measures nothing)")
  ap.add_argument("--parts", default=",".join(PARTS))
  ap.add_argument("--deadline-s", type=float, default=1e9, help="skip what would start after this many seconds")
  ap.add_argument("--config-s", type=float, default=25.0, help="assumed seconds per configuration (deadline)")
  ap.add_argument("--n1", type=int, default=16)
  ap.add_argument("--n2", type=int, default=64)
  ap.add_argument("--bw-bytes", type=int, default=4 << 30)
  ap.add_argument("--shard-batches", default="64,32", help="batches of the shard part (largest first)")
  ap.add_argument("--alpha-int4", type=float, default=0.56, help="int4 part: simulated acceptance of an int4 copy")
  ap.add_argument("--alpha-int8", type=float, default=0.784, help="int4 part: simulated acceptance of an int8 copy")
  # SmolLM2's greedy retention of the bf16 copy's acceptance x 0.8, per channel (quantized_draft, CPU)
  ap.add_argument("--alpha-int4-offsets", type=float, default=0.765,
                  help="offsets part: simulated acceptance of the (asymmetric) int4 copy")
  ap.add_argument("--alpha-int4-sym", type=float, default=0.736,
                  help="offsets part: simulated acceptance of a symmetric int4 copy")
  # SmolLM2's greedy retention with groups of 64 (asymmetric) x 0.8 (quantized_draft, CPU, 4 seeds)
  ap.add_argument("--alpha-int4-g64", type=float, default=0.789,
                  help="kernel part: simulated acceptance of the int4 copy in groups of 64")
  ap.add_argument("--int4-tilings", default=None,
                  help="a benchmarks/gpu_int4_matmul.py JSON: the kernel part uses its fastest tilings (measured_tilings)")
  args = ap.parse_args(argv)
  parts = [p for p in args.parts.split(",") if p]
  bad = [p for p in parts if p not in PARTS]
  if bad:
    raise SystemExit(f"--parts: unknown {bad}; choose from {PARTS}")
  if args.smoke:
    args.bw_bytes = min(args.bw_bytes, 1 << 24)
  b = Bench(args)
  if args.int4_tilings and not os.path.exists(args.int4_tilings):
    b.res["int4_tilings"] = {"missing": args.int4_tilings}           # (the matmul check did not write it)
  elif args.int4_tilings:
    with open(args.int4_tilings) as f:
      tilings = measured_tilings(json.load(f))
    MEASURED_TILINGS.update(tilings)
    b.res["int4_tilings"] = {f"{k}x{n}": t for (k, n), t in tilings.items()}
    print("int4 kernel tilings", b.res["int4_tilings"], flush=True)
  b.bandwidth()
  tcfg, dcfg = models(args.smoke)
  shard_b = tuple(sorted((int(x) for x in args.shard_batches.split(",") if x), reverse=True))
  C, C1, shard_c = (96, 64, 96) if args.smoke else (32768, 4096, 32768)
  if args.smoke:
    shard_b = tuple(max(1, x // 8) for x in shard_b)
  target = Model(tcfg, init_params(tcfg, jax.random.key(0)), name="target")
  small = Model(dcfg, init_params(dcfg, jax.random.key(1)), name="small")
  for part in parts:
    try:
      run_part(b, part, args.smoke, target, small, tcfg, C, C1, shard_c, shard_b)
    except Exception as e:                                        # noqa: BLE001 (recorded, next part runs)
      b.res["parts"].setdefault(part, {})["error"] = traceback.format_exc()[-1500:]
      b.save()
      print(part, "error", repr(e)[:300], flush=True)
  b.res["elapsed_s"] = time.time() - b.t_start
  b.save()
  print("done in", round(b.res["elapsed_s"], 1), "s ->", b.path, flush=True)
  return b.res


def run_part(b, part, smoke, target, small, tcfg, C, C1, shard_c, shard_b):
  if part == "headline":
    part_headline(b, target, small, 8, C)
  elif part == "quant":
    part_quant(b, target, 8, C, window=32 if smoke else 512, sink=4 if smoke else 16)
  elif part == "previous":
    part_previous(b, target, 8, C)
  elif part == "batch1":
    part_batch1(b, target, C1)
  elif part == "shard":
    part_shard(b, tcfg, shard_c, shard_b, tp=2 if smoke else 8)
  elif part == "identity":
    part_identity(b, smoke)
  elif part == "quant_rerun":
    part_quant_rerun(b, target, small, tcfg, C, shard_c)
  elif part == "int4":
    part_int4(b, target, tcfg, C, shard_c, sink=4 if smoke else 16, window=32 if smoke else 512)
  elif part == "defaults":
    sd = lambda w: drafts.StreamingDraft(16, 512, weights=w)
    rows = [b.run("defaults", "AR", target, None, Tree((-1,)), None, 8, C)]
    rows += [b.run("defaults", f"self chain{g} {w or 'bf16'}", target, sd(w), Tree.chain(g), 0.8, 8, C)
             for g, w in ((2, None), (3, "int4"), (3, "int8"))]
    b.ratios("defaults", "AR", rows)
    r = b.run("defaults", "AR 1x4K", target, None, Tree((-1,)), None, 1, C1, profile=False)
    if "tok_per_s_marginal" in r:
      fl = b.floor(target.config, 1, C1)
      b.res["parts"]["defaults_batch1"] = {"floor": fl, "step_ms_marginal": 1e3 / r["tok_per_s_marginal"]}
      b.save()
  elif part == "offsets":
    part_offsets(b, target, C, sink=4 if smoke else 16, window=32 if smoke else 512)
  elif part == "kernel":
    part_kernel(b, target, C, sink=4 if smoke else 16, window=32 if smoke else 512, group=32 if smoke else None)
  elif part == "invariant":
    rows = [b.run("invariant", "AR", target, None, Tree((-1,)), None, 8, C, numerics="invariant"),
            b.run("invariant", "self chain3", target, drafts.StreamingDraft(16, 512), Tree.chain(3), 0.8, 8, C,
                  numerics="invariant")]
    b.ratios("invariant", "AR", rows)


if __name__ == "__main__":
  main()
