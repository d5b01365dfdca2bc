"""GPU figures of the engine users run: end to end through the engine's own compiled loop, kernel by kernel.

Every configuration runs `Engine.decode` (the executable the Engine compiles: its plan's XLA options, its
attention choice, its numerics) from a context-long cache of random bf16 weights at real shapes, with the
accept/reject outcome replaced by Bernoulli(alpha) per draft token (benchmarks/simulated_acceptance.py:
drafting, verification, commits and rollbacks run as in real generation). Per configuration:

  * tokens/s over the whole loop at N2 new tokens per row, and the marginal rate between N1 and N2 (fixed
    costs cancel);
  * rounds: the loop's (it runs until its slowest row ends) and the mean per row;
  * a kernel-time breakdown of one profiled N2 loop (jax.profiler trace read with `ProfileData`): kernels
    summed by name and by kind (attention, GEMM, weight concatenation, copies, other), per loop round;
  * the floor: bytes an AR step must read (weights once + the KV cache) over the read and copy rates
    measured in the same process.

Parts (`--parts`, in this order, each skipped once `--deadline-s` has passed; the JSON is rewritten after
every configuration, so a killed run keeps what it measured):
  headline   8 x 32K LLaMA-3.1-8B: AR, StreamingLLM self-draft chains 2 and 3, a LLaMA-3.2-1B-shape draft
             chain 3; the same AR and self chain 2 with the previous options (XLA's dot merger on);
  batch1     1 x 4K AR step against its floor, with XLA option variants;
  shard      one GPU's shard of LLaMA-3.1-8B under TP 8 (heads, KV heads and MLP / 8) at 32 and 64 x 32K, the
             all-reduce time added from the cost model (a prediction; the paper measured 8 x H100 with NVLink);
  identity   greedy tokens of speculative vs plain decoding through `engine.generate` (real acceptance,
             random 8-layer LLaMA-3.2-1B shape, head x 25), fast and invariant numerics;
  invariant  the headline's AR and self chain 3 with fixed-shape numerics (the engine's default).

  PYTHONPATH=. python3 -m benchmarks.gpu_engine --output $OUT/gpu_engine.json --deadline-s 505
  python -m benchmarks.gpu_engine --smoke --output /tmp/gpu_engine.json    # tiny shapes on CPU, ~2 minutes
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import glob
import json
import os
import shutil
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")   # before jax starts

from benchmarks import common  # noqa: E402
from benchmarks.simulated_acceptance import install_bernoulli  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import compile as compiling  # noqa: E402
from magicdec_jax import drafts, engine, loop, plan  # noqa: E402
from magicdec_jax.cache import KVCache  # noqa: E402
from magicdec_jax.drafts import weights as draft_weights  # noqa: E402
from magicdec_jax.model import Model, init_params  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402
from magicdec_jax.layers.dense import weight_copy  # noqa: E402
from magicdec_jax.layers import quant  # noqa: E402
from magicdec_jax.measure import calibrate  # noqa: E402
from magicdec_jax.tuning import costmodel, shapes  # noqa: E402

PARTS = ("headline", "quant", "shard", "batch1", "invariant", "identity", "previous")
PREVIOUS_OPTIONS = {"xla_gpu_enable_triton_gemm": False}          # before issue 44: dot merger on
# Ring all-reduce between 8 GPUs: a prediction from two assumed constants, not a measurement.
ALLREDUCE_BUS_BYTES_PER_S = 360e9     # NCCL all-reduce bus bandwidth, 8 x H100 NVLink 4 (assumed)
ALLREDUCE_LATENCY_S = 12e-6           # one small all-reduce's fixed cost (assumed)


def allreduce_seconds(nbytes: float, devices: int) -> float:
  """Predicted time of one ring all-reduce of `nbytes` over `devices` GPUs (see the two constants)."""
  return ALLREDUCE_LATENCY_S + 2 * (devices - 1) / devices * nbytes / ALLREDUCE_BUS_BYTES_PER_S


def kernel_kind(name: str) -> str:
  n = name.lower()
  if "concatenate" in n:
    return "concatenate"
  if "tree_attention" in n or "attention" in n:
    return "pallas_attention"
  if "nvjet" in n or "gemm" in n or "cublas" in n or "splitk" in n:
    return "gemm"
  if "memcpy" in n or "dynamic_slice" in n or "copy" in n:
    return "copy"
  return "other"


def kernel_profile(call, tag: str) -> dict:
  """Run call() under jax.profiler.trace; GPU kernel time summed by name and by kind (host planes are
  ignored; on a CPU backend this returns what the trace has, usually nothing)."""
  d = f"/tmp/gpu_engine_trace_{tag}"
  shutil.rmtree(d, ignore_errors=True)
  t0 = time.perf_counter()
  with jax.profiler.trace(d):
    call()
  wall = time.perf_counter() - t0
  files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
  from jax.profiler import ProfileData
  pd = ProfileData.from_serialized_xspace(open(files[0], "rb").read())
  agg = collections.defaultdict(lambda: [0, 0.0])
  for p in pd.planes:
    if not p.name.startswith("/device:GPU"):
      continue
    for line in p.lines:
      if "Stream" not in line.name:
        continue
      for e in line.events:
        dur = getattr(e, "duration_ns", None)
        dur = e.duration_ps / 1e3 if dur is None else dur
        agg[e.name][0] += 1
        agg[e.name][1] += dur
  kinds = collections.Counter()
  for k, (_, ns) in agg.items():
    kinds[kernel_kind(k)] += ns / 1e6
  top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]
  shutil.rmtree(d, ignore_errors=True)
  return {"wall_ms": wall * 1e3, "kernel_ms": sum(v[1] for v in agg.values()) / 1e6,
          "by_kind_ms": dict(kinds), "top": [(k[:120], v[0], round(v[1] / 1e6, 3)) for k, v in top]}


@contextlib.contextmanager
def int8_dot_as(mode):
  """layers/quant.INT8_DOT for the default backend set to `mode` (None: unchanged) inside the block."""
  backend = jax.default_backend()
  old = quant.INT8_DOT.get(backend)
  if mode is not None:
    quant.INT8_DOT[backend] = mode
  try:
    yield
  finally:
    if old is None:
      quant.INT8_DOT.pop(backend, None)
    else:
      quant.INT8_DOT[backend] = old


class Bench:
  def __init__(self, args):
    self.args = args
    self.t_start = time.time()
    self.res = {"env": common.env_info(), "command": common.command(),
                "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
                "jax": jax.__version__, "path": "Engine.decode (the Engine's executable)",
                "acceptance": "Bernoulli(alpha) per draft token (simulated)", "engine_options":
                compiling.engine_options(), "N1": args.n1, "N2": args.n2, "runs": [], "parts": {}}
    self.path = common.output_path(args.output, "gpu_engine")

  def late(self, need_s: float = 0.0) -> bool:
    return time.time() - self.t_start + need_s > self.args.deadline_s

  def save(self):
    common.write_json(self.res, self.path)

  def bandwidth(self):
    n = (self.args.bw_bytes // 2)
    x = jax.random.normal(jax.random.key(3), (n,), jnp.bfloat16)
    cp = jax.jit(lambda a: a * jnp.bfloat16(1.0001))
    rd = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    out = {}
    for name, f, moved in (("copy", cp, 4 * n), ("read", rd, 2 * n)):
      jax.block_until_ready(f(x))
      ts = []
      for _ in range(10):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        ts.append(time.perf_counter() - t0)
      out[f"{name}_bytes_per_s"] = moved / float(np.median(ts))
    del x
    self.res["bandwidth"] = out
    self.save()
    print("bandwidth", {k: f"{v / 1e12:.2f} TB/s" for k, v in out.items()}, flush=True)
    return out

  def floor(self, cfg, batch, context) -> dict:
    """Bytes one AR step must read: every weight once (the embedding only for the batch's rows) + the cache."""
    w = costmodel.param_bytes(cfg, cfg.dtype)
    if not cfg.tie_embeddings:
      w -= cfg.vocab_size * cfg.hidden_size * jnp.dtype(cfg.jnp_dtype).itemsize
    kv = costmodel.kv_bytes_per_token(cfg, cfg.dtype) * batch * context
    bw = self.res.get("bandwidth", {})
    out = {"weight_bytes": w, "kv_bytes": kv}
    for k in ("copy", "read"):
      if f"{k}_bytes_per_s" in bw:
        out[f"{k}_floor_ms"] = (w + kv) / bw[f"{k}_bytes_per_s"] * 1e3
    return out

  def run(self, part, label, model, draft, tree, alpha, batch, context, *, impl="auto", options=None,
          numerics="fast", profile=True, extra=None, int8_dot=None):
    """One configuration end to end through the engine's loop; appends its record. int8_dot: how a
    quantized draft's int8 matrices are multiplied (layers/quant.INT8_DOT; None: the default)."""
    with int8_dot_as(int8_dot):
      return self._run(part, label, model, draft, tree, alpha, batch, context, impl=impl, options=options,
                       numerics=numerics, profile=profile, extra=dict(extra or {}, int8_dot=quant.int8_dot()))

  def _run(self, part, label, model, draft, tree, alpha, batch, context, *, impl, options, numerics, profile,
           extra):
    if self.late(self.args.config_s):
      rec = {"part": part, "label": label, "skipped": "deadline"}
      self.res["runs"].append(rec); self.save(); print(label, "skipped (deadline)", flush=True)
      return rec
    cfg = dataclasses.replace(model.config, numerics=numerics)
    options = compiling.engine_options() if options is None else options
    spec = None if draft is None else draft.spec
    install_bernoulli(None, (alpha,) if draft is not None else None)
    compiling.clear()
    n1, n2 = self.args.n1, self.args.n2
    eng = common.loop_engine(model, draft, tree, batch=batch, context=context, max_new=n2, impl=impl,
                             numerics=numerics, options=options)
    slots = plan.cache_slots(context, n2, tree.num_nodes, whole_blocks=cfg.invariant)

    def fresh(n):
      gc.collect()
      ring = None if spec is None else spec.empty_ring(cfg, batch, tree, slots)
      return jax.block_until_ready(loop.initial_state(
          jnp.zeros((batch, context), jnp.int32), jnp.full((batch,), context, jnp.int32),
          jnp.full((batch,), n, jnp.int32), jnp.array([-1], jnp.int32), jax.random.split(jax.random.key(0), batch),
          KVCache.zeros(cfg, batch, slots), ring, n2 + tree.num_nodes, tree))

    def once(n):
      st = fresh(n)
      t0 = time.perf_counter()
      st = jax.block_until_ready(eng.decode(st))
      dt = time.perf_counter() - t0
      r = np.asarray(st.rounds)
      out = (dt, int(np.asarray(st.n_out).sum()), int(r.max()), float(r.mean()))
      del st
      return out

    rec = {"part": part, "label": label, "batch": batch, "context": context, "impl": impl, "numerics": numerics,
           "alpha": alpha, "gamma": tree.max_depth, "options": options, "slots": slots, **(extra or {})}
    try:
      t0 = time.perf_counter()
      once(n1)
      rec["first_call_s"] = time.perf_counter() - t0
      a = once(n1)
      b = once(n2)
      rec.update(loop_s_N1=a[0], tokens_N1=a[1], loop_s_N2=b[0], tokens_N2=b[1], loop_rounds_N2=b[2],
                 row_rounds_N2=b[3], tok_per_s=b[1] / b[0], tok_per_s_marginal=(b[1] - a[1]) / (b[0] - a[0]),
                 ms_per_loop_round=b[0] / b[2] * 1e3)
      if profile and jax.default_backend() == "gpu":
        st = fresh(n2)
        holder = {}

        def call():
          holder["st"] = jax.block_until_ready(eng.decode(st))
        prof = kernel_profile(call, label.replace(" ", "_"))
        rounds = int(np.asarray(holder.pop("st").rounds).max())
        prof["kernel_ms_per_round"] = prof["kernel_ms"] / rounds
        prof["by_kind_ms_per_round"] = {k: v / rounds for k, v in prof["by_kind_ms"].items()}
        rec["profile"] = prof
    except Exception as e:                                        # noqa: BLE001 (recorded, run goes on)
      rec["error"] = repr(e)[:600]
    self.res["runs"].append(rec)
    self.save()
    short = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items()
             if k in ("tok_per_s", "tok_per_s_marginal", "ms_per_loop_round", "loop_rounds_N2", "row_rounds_N2",
                      "first_call_s", "error")}
    if "profile" in rec:
      short["kinds/round"] = {k: round(v, 2) for k, v in rec["profile"]["by_kind_ms_per_round"].items()}
    print(part, label, short, flush=True)
    jax.clear_caches()
    compiling.clear()
    gc.collect()
    return rec

  def ratios(self, part, base_label, rows):
    base = next((r for r in self.res["runs"] if r.get("part") == part and r.get("label") == base_label
                 and "tok_per_s" in r), None)
    out = {}
    for r in rows:
      if base is not None and "tok_per_s" in r:
        out[r["label"]] = {"speedup": r["tok_per_s"] / base["tok_per_s"],
                           "speedup_marginal": r["tok_per_s_marginal"] / base["tok_per_s_marginal"]}
    self.res["parts"].setdefault(part, {})["speedups_vs_" + base_label.replace(" ", "_")] = out
    self.save()
    print(part, "speedups vs", base_label, {k: round(v["speedup"], 3) for k, v in out.items()}, flush=True)
    return out


def models(smoke: bool):
  if smoke:
    from benchmarks.gpu_suite import tiny_cfgs
    t, d = tiny_cfgs()
    t = t.replace(dtype="bfloat16")
    d = d.replace(dtype="bfloat16")
  else:
    t, d = shapes.model_shape("llama31_8b"), shapes.model_shape("llama32_1b")
  return t, d


def part_headline(b: Bench, target: Model, small: Model, B: int, C: int):
  runs = [b.run("headline", "AR", target, None, Tree((-1,)), None, B, C)]
  if "AR" in b.res["runs"][-1].get("label", "") and "loop_s_N2" in b.res["runs"][-1]:
    b.res["parts"]["headline"] = {"floor": b.floor(target.config, B, C), "batch": B, "context": C}
  runs.append(b.run("headline", "self chain2", target, drafts.StreamingDraft(16, 512), Tree.chain(2), 0.8, B, C))
  runs.append(b.run("headline", "self chain3", target, drafts.StreamingDraft(16, 512), Tree.chain(3), 0.8, B, C))
  runs.append(b.run("headline", "1B chain3", target, drafts.ModelDraft(small, 16, 512), Tree.chain(3), 0.7, B, C))
  b.ratios("headline", "AR", runs)
  ar = runs[0]
  if "ms_per_loop_round" in ar:
    fl = b.res["parts"]["headline"]["floor"]
    step = 1e3 / ar["tok_per_s_marginal"] * B
    b.res["parts"]["headline"]["ar_step_ms_marginal"] = step
    for k in ("copy", "read"):
      if f"{k}_floor_ms" in fl:
        b.res["parts"]["headline"][f"ar_share_of_{k}_floor"] = fl[f"{k}_floor_ms"] / step
    b.save()


def part_previous(b: Bench, target: Model, B: int, C: int):
  """The headline's AR and self chain 2 under the options before issue 44 (XLA's dot merger on)."""
  prev = [b.run("previous_options", "AR", target, None, Tree((-1,)), None, B, C, options=PREVIOUS_OPTIONS),
          b.run("previous_options", "self chain2", target, drafts.StreamingDraft(16, 512), Tree.chain(2), 0.8, B, C,
                options=PREVIOUS_OPTIONS)]
  b.ratios("previous_options", "AR", prev)


def part_quant(b: Bench, target: Model, B: int, C: int, window: int = 512, sink: int = 16):
  """Quantized self-draft weights (layers/quant.py): one draft step (ring of sink + window) against the AR
  step for bf16 / int8 ("int": W8A8 integer dot; "dequant": converted in the dot's operand) / int4
  weights, under the engine's options and with XLA's Triton GEMMs (which can fuse a conversion into the
  matmul); then end to end."""
  cfg = target.config
  triton = dict(compiling.engine_options(), xla_gpu_enable_triton_gemm=True)
  ring = sink + window
  cases = [("AR", None, C, "linear", None, None), ("draft bf16", None, ring, "ring", None, None),
           ("draft bf16 triton", None, ring, "ring", triton, None),
           ("draft int8 int", "int8", ring, "ring", None, "int"),
           ("draft int8 dequant", "int8", ring, "ring", None, "dequant"),
           ("draft int8 dequant triton", "int8", ring, "ring", triton, "dequant"),
           ("draft int8 int triton", "int8", ring, "ring", triton, "int"),
           ("draft int4", "int4", ring, "ring", None, None),
           ("draft int4 triton", "int4", ring, "ring", triton, None)]
  steps = {}
  copies = {}
  for label, w, ctx, kind, opts, mode in cases:
    if b.late(10):
      steps[label] = {"skipped": "deadline"}
      continue
    try:
      if w is not None and w not in copies:
        copies[w] = weight_copy(target.params, w)
      params = target.params if w is None else copies[w]
      with int8_dot_as(mode):
        r = calibrate.time_step(params, cfg, B, ctx, 1, kind, 10, options=opts or compiling.engine_options())
      steps[label] = {"median_ms": r["median_s"] * 1e3, "min_ms": r["seconds"] * 1e3}
    except Exception as e:                                      # noqa: BLE001
      steps[label] = {"error": repr(e)[:400]}
    print("quant step", label, steps[label], flush=True)
    jax.clear_caches()
    gc.collect()
  copies.clear()
  if "median_ms" in steps.get("AR", {}):
    for v in steps.values():
      if "median_ms" in v:
        v["over_ar"] = v["median_ms"] / steps["AR"]["median_ms"]
  b.res["parts"]["quant_steps"] = steps
  b.save()
  runs = [b.run("quant", "AR", target, None, Tree((-1,)), None, B, C, profile=False)]
  for w, g, opts, mode in (("int8", 3, None, "int"), ("int8", 3, triton, "dequant"), ("int4", 3, triton, None),
                           ("int8", 2, None, "int")):
    label = f"self chain{g} {w}" + (f" {mode}" if mode else "") + (" triton" if opts else "")
    runs.append(b.run("quant", label, target, drafts.StreamingDraft(sink, window, weights=w), Tree.chain(g), 0.8, B,
                      C, options=opts, int8_dot=mode))
    draft_weights._NARROW.clear()                       # the cached int8 / int4 copy: free its memory
  b.ratios("quant", "AR", runs)


def part_batch1(b: Bench, target: Model, C: int):
  base = compiling.engine_options()
  variants = {
      "engine": base,
      "command_buffer_while": dict(base, xla_gpu_enable_command_buffer="FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,"
                                   "CUDNN,CONDITIONAL,WHILE"),
      "triton_gemm": dict(base, xla_gpu_enable_triton_gemm=True),
  }
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
  scfg = cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=max(1, cfg.num_kv_heads // tp),
                     intermediate_size=cfg.intermediate_size // tp)
  shard = Model(scfg, init_params(scfg, jax.random.key(5)), name="shard")
  table = {}
  for B in batches:
    gammas = (2, 3) if B == max(batches) else (3,)
    rows = [b.run("shard", f"AR b{B}", shard, None, Tree((-1,)), None, B, C, extra={"tp_shard_of": tp})]
    rows += [b.run("shard", f"self chain{g} b{B}", shard, drafts.StreamingDraft(16, 512), Tree.chain(g), 0.8, B, C,
                   extra={"tp_shard_of": tp}) for g in gammas]
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
  args = ap.parse_args(argv)
  parts = [p for p in args.parts.split(",") if p]
  bad = [p for p in parts if p not in PARTS]
  if bad:
    raise SystemExit(f"--parts: unknown {bad}; choose from {PARTS}")
  if args.smoke:
    args.bw_bytes = min(args.bw_bytes, 1 << 24)
  b = Bench(args)
  b.bandwidth()
  tcfg, dcfg = models(args.smoke)
  C, C1, shard_c, shard_b = (96, 64, 96, (8, 4)) if args.smoke else (32768, 4096, 32768, (64, 32))
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
  elif part == "invariant":
    rows = [b.run("invariant", "AR", target, None, Tree((-1,)), None, 8, C, numerics="invariant"),
            b.run("invariant", "self chain3", target, drafts.StreamingDraft(16, 512), Tree.chain(3), 0.8, 8, C,
                  numerics="invariant")]
    b.ratios("invariant", "AR", rows)


if __name__ == "__main__":
  main()
