"""The GPU harness's runner: one configuration end to end through the engine's own compiled loop.

`Bench.run` decodes a zero cache of the context through `Engine.decode` with simulated acceptance (simulate.py)
and records tokens/s at N2 new tokens a row, the marginal rate between N1 and N2 (fixed costs cancel), the
loop's and the mean row's rounds, and on a GPU a kernel-time breakdown per round (a jax.profiler trace).
Every record goes to the JSON and the log as soon as it exists; a configuration past the part's budget or
`--deadline-s` is recorded as skipped. A step's floor: the bytes it must read over the rates measured here.
"""
from __future__ import annotations

import collections
import dataclasses
import gc
import glob
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.profiler import ProfileData

from benchmarks import common
from magicdec_jax import compile as compiling
from magicdec_jax import loop, plan
from magicdec_jax.cache import KVCache
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.sharding import planner
from magicdec_jax.tuning import costmodel

# A ring all-reduce between 8 GPUs: a prediction from two assumed constants, not a measurement.
ALLREDUCE_BUS_BYTES_PER_S = 360e9     # NCCL all-reduce bus bandwidth, 8 x H100 NVLink 4 (assumed)
ALLREDUCE_LATENCY_S = 12e-6           # one small all-reduce's fixed cost (assumed)


def allreduce_seconds(nbytes: float, devices: int) -> float:
  """Predicted time of one ring all-reduce of `nbytes` over `devices` GPUs (the two constants above)."""
  return ALLREDUCE_LATENCY_S + 2 * (devices - 1) / devices * nbytes / ALLREDUCE_BUS_BYTES_PER_S


def forward_allreduce_s(cfg, batch: int, tokens: int, devices: int) -> float:
  """Predicted all-reduce seconds of one tensor-parallel forward of `tokens` per row: two per layer (after
  attention and after the MLP) of the [batch, tokens, hidden] bf16 activations."""
  return 2 * cfg.num_layers * allreduce_seconds(batch * tokens * cfg.hidden_size * 2, devices)


KERNEL_KINDS = (("concatenate", ("concatenate",)), ("pallas_attention", ("attention",)),
                ("gemm", ("nvjet", "gemm", "cublas", "splitk")), ("copy", ("memcpy", "dynamic_slice", "copy")))


def kernel_kind(name: str) -> str:
  """The first kind whose words the kernel's name holds, else "other"."""
  return next((kind for kind, words in KERNEL_KINDS if any(w in name.lower() for w in words)), "other")


def kernel_profile(call, tag: str) -> dict:
  """call() under jax.profiler.trace: GPU kernel time summed by name and by kind (host planes ignored)."""
  d = f"/tmp/gpu_harness_trace_{tag}"
  shutil.rmtree(d, ignore_errors=True)
  with jax.profiler.trace(d):
    call()
  files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
  agg = collections.defaultdict(lambda: [0, 0.0])
  for p in ProfileData.from_serialized_xspace(open(files[0], "rb").read()).planes:
    if p.name.startswith("/device:GPU"):
      for line in p.lines:
        for e in (line.events if "Stream" in line.name else ()):
          dur = getattr(e, "duration_ns", None)
          agg[e.name][0] += 1
          agg[e.name][1] += e.duration_ps / 1e3 if dur is None else dur
  shutil.rmtree(d, ignore_errors=True)
  kinds = collections.Counter()
  for k, (_, ns) in agg.items():
    kinds[kernel_kind(k)] += ns / 1e6
  top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]
  return {"kernel_ms": sum(v[1] for v in agg.values()) / 1e6, "by_kind_ms": dict(kinds),
          "top": [(k[:120], v[0], round(v[1] / 1e6, 3)) for k, v in top]}


class Bench:
  """The run's record (`res`, written to `path` and a log beside it), its clock and its deadlines."""

  def __init__(self, args):
    self.args, self.t_start = args, time.time()
    self.path = common.output_path(args.output, "gpu_harness")
    self.log_path = self.path[:-5] + ".log" if self.path.endswith(".json") else self.path + ".log"
    open(self.log_path, "w").close()
    self.part, self.part_end = None, float("inf")
    self.res = common.record("gpu_harness", device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
                             path="Engine.decode (the Engine's executable) from a zero cache of the context",
                             weights="random", engine_options=compiling.engine_options(), N1=args.n1, N2=args.n2,
                             runs=[], parts={})

  def say(self, *msg) -> None:
    line = " ".join(str(m) for m in msg)
    print(line, flush=True)
    with open(self.log_path, "a") as f:
      f.write(line + "\n")

  def elapsed(self) -> float:
    return time.time() - self.t_start

  def begin(self, part: str, budget_s: float) -> None:
    """Start a part: configurations stop starting `budget_s` seconds from now (or at the run's deadline)."""
    self.part, self.part_end = part, self.elapsed() + budget_s
    self.res["parts"].setdefault(part, {})["budget_s"] = budget_s
    self.say(f"== part {part} (budget {budget_s:.0f} s) at {self.elapsed():.0f} s")

  def late(self, need_s: float = 0.0) -> bool:
    """Whether something needing `need_s` seconds would end past the part's budget or the run's deadline."""
    return self.elapsed() + need_s > min(self.args.deadline_s, self.part_end)

  def save(self) -> None:
    self.res["elapsed_s"] = self.elapsed()
    common.write_json(self.res, self.path)

  def put(self, key: str, value) -> None:
    """Record a part's figure (res["parts"][part][key]) and save."""
    self.res["parts"].setdefault(self.part, {})[key] = value
    self.save()

  def bandwidth(self) -> dict:
    n = self.args.bw_bytes // 2
    x = jax.random.normal(jax.random.key(3), (n,), jnp.bfloat16)
    out = {}
    for name, f, moved in (("copy", jax.jit(lambda a: a * jnp.bfloat16(1.0001)), 4 * n),
                           ("read", jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32)), 2 * n)):
      t, _ = common.median_time(lambda: f(x), 10)
      out[f"{name}_bytes_per_s"] = moved / t
    self.res["bandwidth"] = out
    self.save()
    self.say("bandwidth", {k: f"{v / 1e12:.2f} TB/s" for k, v in out.items()})
    return out

  def floor(self, cfg, batch: int, context: int, run: dict, prefix: str = "ar_", shares: bool = True) -> dict | None:
    """Bytes one AR step must read (every weight once, the embedding only for the batch's rows, the cache),
    the time that takes at the measured rates, and the measured `run`'s marginal step (PREFIXstep_ms_marginal)
    with (shares) its share of each floor; None where the run has no marginal rate."""
    if "tok_per_s_marginal" not in run:
      return None
    w = costmodel.param_bytes(cfg, cfg.dtype)
    if not cfg.tie_embeddings:
      w -= cfg.vocab_size * cfg.hidden_size * jnp.dtype(cfg.jnp_dtype).itemsize
    kv = costmodel.kv_bytes_per_token(cfg, cfg.dtype) * batch * context
    out = {"weight_bytes": w, "kv_bytes": kv}
    for k, bw in self.res.get("bandwidth", {}).items():
      out[k.replace("_bytes_per_s", "_floor_ms")] = (w + kv) / bw * 1e3
    step = out[prefix + "step_ms_marginal"] = 1e3 / run["tok_per_s_marginal"] * batch
    if shares:
      out.update({f"{prefix}share_of_{k[:-9]}": v / step for k, v in list(out.items()) if k.endswith("_floor_ms")})
    return out

  def fits(self, model, draft, tree, batch: int, context: int) -> dict:
    """The memory planner's figure for this decode (no prefill: prompt length 1) against the device's
    limit less `--memory-margin`; {"fits": None} where the backend reports no limit (CPU)."""
    slots = plan.cache_slots(context, self.args.n2, tree.num_nodes)
    mem = planner.plan_memory(model.config, None, batch=batch, max_context=slots, draft=draft,
                              tree_nodes=tree.num_nodes, prompt_len=1)
    limit = planner.device_memory()
    ok = None if limit is None else mem.total < limit * (1 - self.args.memory_margin)
    return {"fits": ok, "planned_bytes": mem.total, "limit_bytes": limit, "plan": mem.describe()}

  def run(self, label, model, draft, tree, alpha, batch, context, *, numerics="fast", profile=False, vector=None,
          fixed=None, **extra) -> dict:
    """One configuration end to end (draft None: plain decoding); acceptance simulated at `alpha` per
    chain position (or `vector`, a tree's); its record is appended to res["runs"] and returned (a label
    measured before is not run again: its record is returned). fixed: invariant numerics' FixedShapes
    (None: the backend's)."""
    if prev := next((r for r in self.res["runs"] if r["label"] == label and "tok_per_s" in r), None):
      return prev                              # the same configuration measured by an earlier part
    rec = {"part": self.part, "label": label, "batch": batch, "context": context, "numerics": numerics,
           "alpha": alpha, "gamma": tree.max_depth, "tree_nodes": tree.num_nodes, **extra}
    if self.late(self.args.config_s):
      return self._done(dict(rec, skipped="deadline"))
    mem = rec["memory"] = self.fits(model, draft, tree, batch, context)
    if mem["fits"] is False:
      return self._done(dict(rec, skipped="does not fit (memory planner)"))
    cfg = dataclasses.replace(model.config, numerics=numerics, fixed=fixed if numerics == "invariant" else None)
    if cfg.invariant:
      rec["fixed_attention"] = cfg.fixed.attention
    spec = None if draft is None else draft.spec
    compiling.clear()
    n1, n2 = self.args.n1, self.args.n2
    slots = plan.cache_slots(context, n2, tree.num_nodes, cfg.fixed.cache_multiple if cfg.invariant else 1)

    def fresh(n):
      gc.collect()
      ring = None if spec is None else spec.empty_ring(cfg, batch, tree, slots)
      st = loop.initial_state(
          jnp.zeros((batch, context), jnp.int32), jnp.full((batch,), context, jnp.int32),
          jnp.full((batch,), n, jnp.int32), jnp.array([-1], jnp.int32), jax.random.split(jax.random.key(0), batch),
          KVCache.zeros(cfg, batch, slots), ring, n2 + tree.num_nodes, tree)
      return jax.block_until_ready(st)

    def once(n):
      st = fresh(n)
      t0 = time.perf_counter()
      st = jax.block_until_ready(eng.decode(st))
      r = np.asarray(st.rounds)
      return time.perf_counter() - t0, int(np.asarray(st.n_out).sum()), int(r.max()), float(r.mean())

    eng = None
    try:
      eng = common.loop_engine(model, draft, tree, batch=batch, context=context, max_new=n2,
                               simulated_acceptance=None if draft is None else (vector or (alpha,)),
                               numerics=numerics, fixed_shapes=cfg.fixed)
      rec["plan_xla_options"] = eng.plan.xla_options
      t0 = time.perf_counter()
      once(n1)
      rec["first_call_s"] = time.perf_counter() - t0
      a, b = once(n1), once(n2)
      rec.update(loop_s_N1=a[0], tokens_N1=a[1], loop_s_N2=b[0], tokens_N2=b[1], loop_rounds_N2=b[2],
                 row_rounds_N2=b[3], tok_per_s=b[1] / b[0], tok_per_s_marginal=(b[1] - a[1]) / (b[0] - a[0]),
                 ms_per_loop_round=b[0] / b[2] * 1e3)
      if profile and jax.default_backend() == "gpu":
        st, holder = fresh(n2), {}
        prof = kernel_profile(lambda: holder.setdefault("st", jax.block_until_ready(eng.decode(st))),
                              label.replace(" ", "_"))
        rounds = int(np.asarray(holder.pop("st").rounds).max())
        rec["profile"] = dict(prof, by_kind_ms_per_round={k: v / rounds for k, v in prof["by_kind_ms"].items()})
    except Exception as e:                                        # noqa: BLE001 (recorded, the run goes on)
      rec["error"] = repr(e)[:600]
    eng = None
    jax.clear_caches()
    compiling.clear()
    draft_weights.drop_copies()
    gc.collect()
    return self._done(rec)

  def _done(self, rec: dict) -> dict:
    self.res["runs"].append(rec)
    self.save()
    keys = ("tok_per_s", "tok_per_s_marginal", "ms_per_loop_round", "loop_rounds_N2", "row_rounds_N2",
            "first_call_s", "skipped", "error")
    short = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items() if k in keys}
    if "profile" in rec:
      short["kinds/round"] = {k: round(v, 2) for k, v in rec["profile"]["by_kind_ms_per_round"].items()}
    self.say(self.part, rec["label"], short)
    return rec

  def ratios(self, base: dict, rows: list[dict]) -> dict:
    """label -> speedup (whole loop, marginal) of each measured row over the measured `base` row."""
    out = {r["label"]: {"speedup": r["tok_per_s"] / base["tok_per_s"],
                        "speedup_marginal": r["tok_per_s_marginal"] / base["tok_per_s_marginal"]}
           for r in rows if "tok_per_s" in r and "tok_per_s" in base}
    self.say(self.part, "speedups vs", base["label"], {k: round(v["speedup"], 3) for k, v in out.items()})
    return out
