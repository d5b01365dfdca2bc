"""Measure this device's step times and fit the linear step-time model: a hardware profile (JSON).

`measure` times jitted forward passes of the real model code (`model.forward` over a `KVCache.zeros` cache,
the cache donated and written in place as in the decode loop) over a small grid: the target's AR step
(1 token per row), its verify step (T tokens per row, a chain or a tree's nodes) and each draft's step
(the target's weights or a draft model against the draft's fixed-size cache, 1 or a tree level's tokens).
`fit_profile` fits `stepfit.FittedHardware` to every measured step by non-negative least squares and
reports its leave-one-out error (each step predicted by a fit that never saw it). `calibrate` does both and
returns the profile; `tuning.profiles` saves it and loads it back as a FittedHardware that every cost-model
function (and `generate(..., hardware=PATH)`, `run.py --hardware=PATH`, `--mode=plan`) accepts. `cases_for`
says which steps of a draft to time, from the draft's cost descriptor and the network it runs.

Timings are the minimum over `repeats` calls after one untimed call (compilation): on a shared CPU the
minimum is the least disturbed estimate; the median is recorded too. Profile format: docs/tuning.md "Hardware
profiles".
"""
from __future__ import annotations

import dataclasses
import functools
import datetime
import json
import math
import os
import platform
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import feature_head
from magicdec_jax.tuning import stepfit
from magicdec_jax.tuning.profiles import PROFILE_FORMAT, host_cpu_model
from magicdec_jax.cache import KVCache, aligned_slots, ring_margin
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.attention import DenseMask, PrefixTree
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.model import forward

DEFAULT_BATCHES = (1, 4, 8)
DEFAULT_CONTEXTS = (256, 1024, 2048)
DEFAULT_TOKENS = (1, 4, 16)          # target: AR (1) and verify sizes
DEFAULT_DRAFT_TOKENS = (1, 4)        # draft: a chain step (1) and a tree level
# a narrow-weight draft's grid varies batch x tokens at one fixed ring size: fit only what that separates
NARROW_FEATURES = ("const", "weight_bytes", "matmul_flops", "activations")


@dataclasses.dataclass(frozen=True)
class DraftUnderTest:
  """A draft as calibrate times it: which model (None = the target's own weights), how many cache slots."""
  name: str                   # the draft's cost label: "self", "snapkv", "model"
  kv_tokens: int              # the ring it reads: sink + window (StreamingLLM) or budget + window (SnapKV)
  cfg: ModelConfig | None = None
  params: object = None
  weights: str | None = None  # the draft on a narrower or quantized copy of its weights (StreamingDraft.weights)

  @property
  def role(self) -> str:
    return f"draft_{self.name}" + (f"_{self.weights}" if self.weights else "")


def cases_for(draft, target) -> list[DraftUnderTest]:
  """The steps of `draft` (a drafts.Draft) that `calibrate` times against `target` (a Model): its network
  (`forward_network`) against the ring its cost descriptor reads, on the weight copy it reads; a float32
  target's self draft also on a bfloat16 copy (what `auto` needs to price the demo's default draft).
  Nothing for a draft that runs no network through model.forward (prompt lookup, a feature head)."""
  cost, net = draft.spec.cost(), draft.forward_network(target)
  if net is None or not cost.runs_network:
    return []
  params, cfg = net
  own = cost.config is not None
  cases = [DraftUnderTest(cost.label, cost.kv_slots, cfg if own else None, params if own else None,
                          weights=cost.weights_dtype)]
  if not own and cost.weights_dtype is None and target.config.dtype == "float32":
    cases.append(DraftUnderTest(cost.label, cost.kv_slots, weights="bfloat16"))
  return cases


@functools.lru_cache(maxsize=256)
def _step_fn(cfg: ModelConfig, t: int, kind: str):
  """Jitted forward of t tokens per row; kind 'linear' (target: prefix + causal block) or 'ring' (a draft:
  every cache slot visible, new tokens in the last t slots). The cache is donated (written in place)."""
  anc = np.tril(np.ones((t, t), bool))

  def step(params, cache, tokens, base):
    pos = base[:, None] + jnp.arange(t)[None, :]
    if kind == "linear":
      spec, slots = PrefixTree(base, jnp.asarray(anc)), pos
    else:
      s = cache.num_slots
      slots = jnp.broadcast_to(s - t + jnp.arange(t), pos.shape)
      spec = DenseMask(jnp.ones((tokens.shape[0], t, s), bool))
    return forward(params, cfg, tokens, pos, cache, slots, spec)
  return jax.jit(step, donate_argnums=(1,))


def time_step(params, cfg: ModelConfig, batch: int, kv_context: int, t: int, kind: str = "linear",
              repeats: int = 5, options: dict | None = None, rings: bool = True) -> dict:
  """{'seconds' (min), 'median_s', 'times', 'first_call_s'} of one forward of t tokens per row after
  kv_context cached ones (the first call, compiling on the first use of a shape, is not counted). The
  cache has the engine's slot count (cache.aligned_slots); `options`: XLA compiler
  options for this step's executable only (e.g. {"xla_gpu_enable_triton_gemm": False}). The target's
  windowed layers keep rings as the engine's do (rings=False: a full cache in every layer)."""
  slots = aligned_slots(kv_context + t)          # as the engine sizes both the target cache and the rings
  cache = KVCache.zeros(cfg, batch, slots, ring_margin(t) if rings and kind == "linear" else None)
  tokens = jnp.zeros((batch, t), jnp.int32)
  base = jnp.full((batch,), kv_context, jnp.int32)
  f = _step_fn(cfg, t, kind)
  if options:
    f = f.lower(params, cache, tokens, base).compile(compiler_options=dict(options))
  times = []
  for i in range(repeats + 1):
    t0 = time.perf_counter()
    logits, cache = f(params, cache, tokens, base)
    jax.block_until_ready(logits)
    times.append(time.perf_counter() - t0)
  del cache, logits
  steady = times[1:]
  return {"seconds": float(min(steady)), "median_s": float(np.median(steady)),
          "times": [round(x, 6) for x in steady], "first_call_s": times[0]}


@functools.lru_cache(maxsize=16)
def _feature_step_fn(cfg: ModelConfig, t: int, vocab: tuple[int, ...] | None = None):
  """Jitted feature-head step (feature_head.step) of t tokens per row against its one-layer ring, every
  slot visible, the new tokens in the last t slots (as _step_fn's 'ring' kind), logits scattered into
  the target's vocabulary as the loop does for a head with a draft vocabulary; the buffers donated."""
  def step(hparams, tparams, cache_k, cache_v, tokens, g):
    s = cache_k.shape[2]
    slots = jnp.broadcast_to(s - t + jnp.arange(t), tokens.shape)
    spec = DenseMask(jnp.ones((tokens.shape[0], t, s), bool))
    logits, _, cache_k, cache_v = feature_head.step(cfg, hparams, tparams, g, tokens, slots, cache_k,
                                                    cache_v, slots, spec)
    return feature_head.to_target_vocab(logits, vocab, cfg.vocab_size), cache_k, cache_v
  return jax.jit(step, donate_argnums=(2, 3))


def time_feature_step(head, target_params, batch: int, kv_tokens: int, t: int = 1, repeats: int = 5) -> dict:
  """time_step's figures for a feature head's draft step (feature_draft.FeatureDraft): t tokens per row
  through fc + its decoder layer + norm + its LM head (the target's, or its own over a draft vocabulary,
  scattered back into the target's), against a ring of kv_tokens (sink +
  window) + t slots, rounded as the engine rounds it."""
  cfg = head.config
  cache = KVCache.zeros(cfg, batch, aligned_slots(kv_tokens + t))
  k, v = cache.k[0], cache.v[0]
  tokens = jnp.zeros((batch, t), jnp.int32)
  g = jnp.zeros((batch, t, cfg.hidden_size), cfg.jnp_dtype)
  f = _feature_step_fn(cfg, t, head.vocab)
  times = []
  for _ in range(repeats + 1):
    t0 = time.perf_counter()
    logits, k, v = f(head.params, target_params, k, v, tokens, g)
    jax.block_until_ready(logits)
    times.append(time.perf_counter() - t0)
  steady = times[1:]
  return {"seconds": float(min(steady)), "median_s": float(np.median(steady)),
          "times": [round(x, 6) for x in steady], "first_call_s": times[0]}


def grid_rows(batches: Sequence[int] = DEFAULT_BATCHES, contexts: Sequence[int] = DEFAULT_CONTEXTS,
              tokens: Sequence[int] = DEFAULT_TOKENS, draft_tokens: Sequence[int] = DEFAULT_DRAFT_TOKENS,
              drafts: Sequence[DraftUnderTest] = ()) -> list[dict]:
  """The shapes `measure` times: target (role 'ar' / 'verify') at every batch x context x tokens, each draft
  (role 'draft_<name>') at every batch x draft_tokens against its own fixed cache."""
  rows = [{"role": "ar" if t == 1 else "verify", "model": "target", "batch": b, "kv_context": n, "new_tokens": t}
          for n in contexts for b in batches for t in tokens]
  for d in drafts:
    rows += [{"role": d.role, "model": "draft" if d.cfg is not None else "target", "batch": b,
              "kv_context": d.kv_tokens, "new_tokens": t, "draft": d.role, **({"weights": d.weights} if d.weights
                                                                             else {})}
             for b in batches for t in draft_tokens]
  return rows


def check_grid(shapes: Sequence[dict]) -> None:
  """ValueError, before anything is timed, where a fit would get fewer steps than it needs: the target's
  (and full-weight drafts') fit, and each weight copy's own (fit_profile)."""
  groups: dict = {}
  for s in shapes:
    groups.setdefault(s.get("weights"), []).append(s)
  for weights, rows in groups.items():
    if len(rows) < stepfit.MIN_STEPS:
      what = ("the step-time fit" if weights is None else
              f"the fit of the draft's {weights} weight copy (batches x calibrate_draft_tokens)")
      raise ValueError(f"{what} would get {len(rows)} measured steps and needs at least {stepfit.MIN_STEPS}: "
                       "give more batches, contexts or calibrate tokens / draft tokens")


def measure(params, cfg: ModelConfig, shapes: Sequence[dict], drafts: Sequence[DraftUnderTest] = (), *,
            repeats: int = 5, passes: int = 2, log: Callable[[str], None] | None = None) -> list[dict]:
  """Time every grid_rows shape; returns the rows with the timing fields added.

  The grid is swept `passes` times (repeats calls per shape per pass, each step function compiled once):
  a burst of load from other processes then hits one pass of a shape, not all of its samples, and the
  minimum over passes drops it.
  """
  by_role = {d.role: d for d in drafts}
  narrow = {d.role: weight_copy(d.params if d.cfg is not None else params, d.weights) for d in drafts if d.weights}
  out = [dict(r, times=[]) for r in shapes]
  for pas in range(passes):
    for i, row in enumerate(shapes):
      d = by_role.get(row.get("draft"))
      c, p = (d.cfg, d.params) if d is not None and d.cfg is not None else (cfg, params)
      if d is not None and d.weights:
        p = narrow[d.role]
      kind = "ring" if row["role"].startswith("draft_") else "linear"
      m = time_step(p, c, row["batch"], row["kv_context"], row["new_tokens"], kind, repeats)
      r = out[i]
      r["times"] += m["times"]
      if pas == 0:
        r["first_call_s"] = m["first_call_s"]
        r["config"] = json.loads(c.to_json())
      r["seconds"], r["median_s"] = float(min(r["times"])), float(np.median(r["times"]))
      if log:
        log(f"calibrate pass {pas + 1}/{passes} [{i + 1}/{len(shapes)}] {row['role']:>12} b{row['batch']} "
            f"kv{row['kv_context']} t{row['new_tokens']}: {r['seconds'] * 1e3:.2f} ms "
            f"(median {r['median_s'] * 1e3:.2f})")
  return out


def step_rows(measurements: Sequence[dict]) -> list[stepfit.StepRow]:
  """Profile measurements -> stepfit.StepRow (the config is stored with every measurement)."""
  rows = []
  for m in measurements:
    cfg = ModelConfig.from_json(json.dumps(m["config"]))
    rows.append(stepfit.StepRow(cfg, int(m["batch"]), int(m["kv_context"]), int(m["new_tokens"]),
                                  float(m["seconds"]), cfg.dtype, m.get("role", ""), m.get("weights")))
  return rows


def holdout_errors(rows: Sequence[stepfit.StepRow], *, tile: int = 128) -> np.ndarray:
  """Leave-one-out relative errors: row i predicted by a fit on every other row."""
  errs = []
  for i in range(len(rows)):
    hw = stepfit.fit_step_model("loo", [r for j, r in enumerate(rows) if j != i], tile=tile)
    errs.append(stepfit.relative_errors(hw, [rows[i]])[0])
  return np.asarray(errs)


def fit_profile(name: str, measurements: Sequence[dict], *, tile: int = 128,
                memory_bytes: float = math.inf) -> dict:
  """The 'fit' block of a profile: coefficients, training and leave-one-out relative errors. Steps on a
  narrower weight copy (a DraftUnderTest with `weights`) get a fit of their own (`narrow`: the few
  NARROW_FEATURES their grid varies), errors under `narrow_rel_err`."""
  all_rows = step_rows(measurements)
  rows = [r for r in all_rows if not r.weights_dtype]
  hw = stepfit.fit_step_model(name, rows, tile=tile, memory_bytes=memory_bytes)
  narrow_rows = {}
  for r in all_rows:
    if r.weights_dtype:
      narrow_rows.setdefault(r.weights_dtype, []).append(r)
  narrow = tuple((w, stepfit.fit_step_model(name, rs, tile=tile, features=NARROW_FEATURES).coef)
                 for w, rs in narrow_rows.items())
  hw = dataclasses.replace(hw, narrow=narrow)
  train = stepfit.relative_errors(hw, rows)
  loo = holdout_errors(rows, tile=tile) if len(rows) > 4 else np.zeros(0)
  stats = lambda e: {"mean": float(e.mean()), "p90": float(np.percentile(e, 90)), "max": float(e.max())} \
      if e.size else None
  out = dict(hw.to_dict(), feature_doc=dict(stepfit.FEATURE_DOC), train_rel_err=stats(train),
             holdout_rel_err=dict(stats(loo) or {}, method="leave-one-out") if loo.size else None,
             per_row_holdout_rel_err=[round(float(e), 4) for e in loo])
  if narrow_rows:
    out["narrow_rel_err"] = {w: stats(stepfit.relative_errors(hw, rs)) for w, rs in narrow_rows.items()}
  return out


def device_memory_bytes() -> float:
  dev = jax.devices()[0]
  try:
    limit = (dev.memory_stats() or {}).get("bytes_limit")
  except Exception:  # noqa: BLE001 - CPU devices may not implement memory_stats
    limit = None
  return float(limit) if limit else math.inf


def calibrate(params, cfg: ModelConfig, *, drafts: Sequence[DraftUnderTest] = (), model_name: str = "model",
              batches: Sequence[int] = DEFAULT_BATCHES, contexts: Sequence[int] = DEFAULT_CONTEXTS,
              tokens: Sequence[int] = DEFAULT_TOKENS, draft_tokens: Sequence[int] = DEFAULT_DRAFT_TOKENS,
              repeats: int = 5, passes: int = 2, tile: int = 128, acceptance_vector: Sequence[float] | None = None,
              log: Callable[[str], None] | None = None) -> dict:
  """Measure the grid and fit: the whole hardware profile as a JSON-ready dict."""
  t0 = time.perf_counter()
  dev = jax.devices()[0]
  load0 = list(os.getloadavg())
  shapes = grid_rows(batches, contexts, tokens, draft_tokens, drafts)
  check_grid(shapes)
  meas = measure(params, cfg, shapes, drafts, repeats=repeats, passes=passes, log=log)
  name = f"{dev.platform}:{dev.device_kind} (fitted)"
  mem = device_memory_bytes()
  prof = {
      "format": PROFILE_FORMAT, "device": f"{dev.platform}:{dev.device_kind}", "platform": platform.platform(),
      "jax_version": jax.__version__,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "host_cpus": os.cpu_count(), "cpu_model": host_cpu_model(), "loadavg_start": load0,
      "model": model_name, "dtype": cfg.dtype,
      "grid": {"batches": list(batches), "contexts": list(contexts), "tokens": list(tokens),
               "draft_tokens": list(draft_tokens),
               "drafts": [{"name": d.name, "kv_tokens": d.kv_tokens, "weights": d.weights,
                           "model": "target" if d.cfg is None else "draft"} for d in drafts]},
      "repeats": repeats, "passes": passes,
      "timing": "min over passes x repeats calls, each pass after one untimed call (the first compiles)",
      "measurements": meas,
      "fit": fit_profile(name, meas, tile=tile, memory_bytes=mem),
  }
  if acceptance_vector is not None:
    prof["acceptance_vector"] = [float(x) for x in acceptance_vector]
  prof["loadavg_end"] = list(os.getloadavg())
  prof["total_s"] = time.perf_counter() - t0
  return prof
