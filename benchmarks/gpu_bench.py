"""The harness of benchmarks/gpu_engine.py: one configuration end to end through the engine's own compiled
loop (`Bench.run`), the bandwidth and floor of a step, and a kernel-time breakdown from a jax.profiler trace.

Every run goes through `Engine.decode` (the executable the Engine compiles: its plan's XLA options, its
attention choice, its numerics) from a context-long cache of random weights, with the accept/reject outcome
replaced by Bernoulli(alpha) per draft token (benchmarks/simulated_acceptance.py: drafting, verification,
commits and rollbacks run as in real generation). Per configuration it records tokens/s over the whole
loop at N2 new tokens per row and the marginal rate between N1 and N2 (fixed costs cancel), the loop's
rounds (until its slowest row ends) and the mean per row, and, on a GPU, kernel time per loop round summed
by name and by kind (attention, GEMM, weight concatenation, copies, other).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import glob
import shutil
import time

from benchmarks import common
from benchmarks.simulated_acceptance import install_bernoulli
import jax
import jax.numpy as jnp
import numpy as np
from jax.profiler import ProfileData

from magicdec_jax import compile as compiling
from magicdec_jax import loop, plan
from magicdec_jax.cache import KVCache
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers import quant
from magicdec_jax.tuning import costmodel, shapes
from benchmarks.gpu_suite import tiny_cfgs


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
def quant_setting_as(name: str, value):
  """layers/quant.<name> set to `value` inside the block (None: unchanged); the drafts' cached weight
  copies are dropped on entry and exit so that each setting gets its own."""
  old = getattr(quant, name)
  draft_weights._NARROW.clear()
  if value is not None:
    setattr(quant, name, value)
  try:
    yield
  finally:
    setattr(quant, name, old)
    draft_weights._NARROW.clear()


def int4_group_as(group):
  """quant.INT4_GROUP (the override of the backend's group; 0: one scale per output channel) as `group`."""
  return quant_setting_as("INT4_GROUP", group)


def int4_keep_int8_as(names):
  """quant.INT4_KEEP_INT8 (the matrices an "int4" copy keeps in int8) as `names`."""
  return quant_setting_as("INT4_KEEP_INT8", None if names is None else tuple(names))


def int4_kernel_as(flag):
  """quant.INT4_KERNEL (grouped int4 stored packed and multiplied by the Pallas kernel) as `flag`."""
  return quant_setting_as("INT4_KERNEL", flag)


def int4_offsets_as(flag):
  """quant.INT4_OFFSETS (asymmetric int4: a scale and an offset per group; False: symmetric) as `flag`."""
  return quant_setting_as("INT4_OFFSETS", flag)


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
    spec = None if draft is None else draft.spec
    install_bernoulli(None, (alpha,) if draft is not None else None)
    compiling.clear()
    n1, n2 = self.args.n1, self.args.n2
    eng = common.loop_engine(model, draft, tree, batch=batch, context=context, max_new=n2, impl=impl,
                             numerics=numerics, options=options)
    slots = plan.cache_slots(context, n2, tree.num_nodes, cfg.fixed.key_block if cfg.invariant else 1)

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
           "alpha": alpha, "gamma": tree.max_depth, "options": options, "plan_xla_options": eng.plan.xla_options,
           "slots": slots, **(extra or {})}
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
    t, d = tiny_cfgs()
    t = t.replace(dtype="bfloat16")
    d = d.replace(dtype="bfloat16")
  else:
    t, d = shapes.model_shape("llama31_8b"), shapes.model_shape("llama32_1b")
  return t, d
