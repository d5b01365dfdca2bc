"""MagicDec GPU suite: bandwidth, AR step vs its floor, verify / draft cost ratios, end-to-end speedup.

End to end runs through the engine's own compiled loop (Engine.decode with the plan's XLA options);
benchmarks/gpu_engine.py adds kernel-time breakdowns, quantized drafts and the TP-8 shard table.

One command (was < 10 minutes on one H100 before trees, tree verify sizes and the greedy-agreement run were
added; not re-timed: no GPU was available), random weights at real shapes (target llama31_8b, small draft
llama32_1b, bfloat16). Random weights accept almost nothing, so end-to-end runs replace the accept/reject
outcome by Bernoulli(alpha) per draft token (benchmarks/simulated_acceptance.py, patched over `magicdec_jax.loop.accept`
ONLY inside this process; drafting, the verify pass, cache commits and rollbacks all run as in real
generation). Every end-to-end record states its alpha. Trees get the same switch: at every reached node the
child of rank k is accepted with probability v[k] of a simulated acceptance vector (default
v[k] = alpha (1 - alpha)^k, so a chain sees alpha per position), drafted and verified as in real generation.
KV contents are zeros (prefill is skipped: with random weights and forced acceptance only the costs
matter, and those do not depend on the values).

Every measured step (AR, verify, each draft) feeds the fitted step-time model (stepfit.FittedHardware;
its leave-one-out error is reported and the profile is written beside the output, usable as
`run.py --hardware=...profile.json`), which picks gamma where --e2e-gammas is not given. A greedy-agreement
figure compares speculative greedy tokens with AR's (same random weights, real acceptance, dtype of the run).
The suite holds one decode state at a time (the previous one is deleted and collected first) and sets
XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 before jax starts unless it is already set.

  python -m benchmarks.gpu_suite --output benchmarks/results/gpu_suite_h100.json
  python -m benchmarks.gpu_suite --contexts 32768 --batches 8 --e2e 8x32768        # the headline shape
  python -m benchmarks.gpu_suite --smoke --output /tmp/smoke.json          # tiny shapes, CPU, ~1 minute
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")   # before jax is imported (by common)

from benchmarks import common  # noqa: E402
from benchmarks.simulated_acceptance import bernoulli_check, default_vector, install_bernoulli  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import drafts, engine, feature_head, loop, plan, trees  # noqa: E402
from magicdec_jax.measure import calibrate  # noqa: E402
from magicdec_jax.tuning import autotune, costmodel, profiles, shapes, stepfit  # noqa: E402
from magicdec_jax import compile as compiling  # noqa: E402
from magicdec_jax.cache import KVCache, ring_margin, ring_sizes  # noqa: E402
from magicdec_jax.sharding import planner  # noqa: E402
from magicdec_jax.config import ModelConfig  # noqa: E402
from magicdec_jax.model import Model, init_params  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402

_COMPILE = {"s": 0.0}


def _on_compile(event, duration, **_):
  if event in ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
               "/jax/core/compile/backend_compile_duration"):
    _COMPILE["s"] += duration


jax.monitoring.register_event_duration_secs_listener(_on_compile)


# ---- step timing ----------------------------------------------------------------------------------------

def copy_bandwidth(nbytes: int, repeats: int) -> dict:
  """Bytes moved (read + write) per second by a jitted elementwise copy of a large bf16 array."""
  n = nbytes // 2
  x = jnp.ones((n,), jnp.bfloat16)
  f = jax.jit(lambda a: a + jnp.bfloat16(1))
  t, _ = common.median_time(lambda: f(x), repeats, warmup=2)
  return {"array_bytes": 2 * n, "median_s": t, "bytes_per_s": 2 * 2 * n / t}


GEMM_CHOICES = {"cublas": {"xla_gpu_enable_triton_gemm": False}, "triton": {"xla_gpu_enable_triton_gemm": True}}


def time_step(params, cfg: ModelConfig, batch: int, kv_context: int, t: int, kind: str, repeats: int,
              options: dict | None = None) -> dict:
  """One forward of t tokens per row after kv_context cached ones (calibrate.time_step: the real forward,
  cache donated); returns its timing dict plus compile_s (jax's compile events during the first call).
  `options` default: the engine's own (compile.engine_options(): cuBLAS GEMMs on a GPU)."""
  c0 = _COMPILE["s"]
  options = compiling.engine_options() if options is None else options
  r = calibrate.time_step(params, cfg, batch, kv_context, t, kind, repeats, options=options)
  gc.collect()
  return dict(r, compile_s=_COMPILE["s"] - c0)


# ---- end to end -----------------------------------------------------------------------------------------

def decode_tokens_per_s(model: Model, draft, tree: Tree | None, batch: int, context: int, max_new: int,
                        vector, repeats: int) -> dict:
  """Tokens/s of the engine's own compiled loop (Engine.decode: its plan's XLA options, the draft's, and
  attention "auto") from a context-long (zero) cache: AR if draft is None, else `tree` (a chain is a
  tree). Before 2026-11-26 this called loop.decode bare (no engine options, XLA attention): the
  gpu_suite_h200_2026-11-26_*.json end-to-end figures are that path. vector: simulated acceptance vector
  (None: real acceptance). One state alive at a time."""
  cfg = model.config
  if draft is None:
    spec, tree = None, Tree((-1,))
  else:
    spec = draft.spec
  install_bernoulli(None, vector)
  compiling.clear()                           # the vector is a trace-time constant (the engine keeps an LRU)
  out_len = max_new + tree.num_nodes
  slots = plan.cache_slots(context, max_new, tree.num_nodes)
  eng = common.loop_engine(model, draft, tree, batch=batch, context=context, max_new=max_new)

  def fresh():                                # the state is donated to decode: rebuild every input
    tokens = jnp.zeros((batch, context), jnp.int32)
    lengths = jnp.full((batch,), context, jnp.int32)
    keys = jax.random.split(jax.random.key(0), batch)
    ring = None if spec is None else spec.empty_ring(cfg, batch, tree, slots)
    st = loop.initial_state(tokens, lengths, jnp.full((batch,), max_new, jnp.int32), jnp.array([-1], jnp.int32),
                            keys, KVCache.zeros(cfg, batch, slots), ring, out_len, tree)
    return jax.block_until_ready(st)

  times, rec, compile_s = [], None, 0.0
  for i in range(repeats + 1):
    rec = None                                # free the previous state before building the next one
    gc.collect()
    s0 = fresh()
    c0 = _COMPILE["s"]
    t0 = time.perf_counter()
    st = jax.block_until_ready(eng.decode(s0))
    dt = time.perf_counter() - t0
    if i == 0:
      compile_s = _COMPILE["s"] - c0
    else:
      times.append(dt)
    del s0
    rounds, acc_at = np.asarray(st.rounds), np.asarray(st.accepted_at)
    rec = {"n_out": int(np.asarray(st.n_out).sum()), "rounds": rounds, "acc_at": acc_at}
    del st
  gc.collect()
  t = float(np.median(times))
  rounds, acc_at, n_out = rec["rounds"], rec["acc_at"], rec["n_out"]
  out = {"tokens_per_s": n_out / t, "decode_s": t, "new_tokens": n_out, "verify_steps": int(rounds.sum()),
         "compile_s": compile_s, "tree_nodes": tree.num_nodes, "tree_depth": tree.max_depth}
  if tree.max_depth:
    trials = rounds.sum() + acc_at[:, :-1].sum()
    out.update(conditional_acceptance=float(acc_at.sum() / trials),
               mean_accepted_length=float((acc_at.sum() + rounds.sum()) / rounds.sum()))
  return out


def greedy_agreement(model: Model, draft, gamma: int, batch: int, prompt_len: int, max_new: int,
                     head_scale: float) -> dict:
  """Speculative greedy vs AR greedy on the same random prompts and weights with real acceptance: share of
  generated positions with equal tokens, and per row the first position where they differ.

  Random weights give near-uniform logits whose argmax flips on rounding noise alone, so the LM head (or the
  tied embedding) is multiplied by head_scale to give the top token a margin, as trained models have."""
  install_bernoulli(None)
  params = dict(model.params)
  key = "embed" if model.config.tie_embeddings else "lm_head"
  params[key] = params[key] * jnp.asarray(head_scale, params[key].dtype)
  m = Model(model.config, params, name=model.name)
  rng = np.random.default_rng(7)
  prompts = rng.integers(0, model.config.vocab_size, (batch, prompt_len)).tolist()
  kw = dict(max_new_tokens=max_new, eos_token_id=[])
  ar = engine.generate(m, prompts, **kw)
  sp = engine.generate(m, prompts, draft=draft, gamma=gamma, **kw)
  del m, params
  gc.collect()
  a, s_ = np.asarray(ar.tokens), np.asarray(sp.tokens)
  eq = a == s_
  first = [int(np.argmin(r)) if not r.all() else None for r in eq]
  return {"batch": batch, "prompt_tokens": prompt_len, "new_tokens": max_new, "gamma": gamma,
          "dtype": model.config.dtype, "head_scale": head_scale, "share_equal": float(eq.mean()),
          "rows_identical": int(eq.all(1).sum()), "first_difference": first,
          "spec_acceptance_rate": sp.stats["acceptance_rate"]}


# ---- main -----------------------------------------------------------------------------------------------

class Budget:
  """The run's wall-clock deadline and its partial saves: every record is written to `path` as soon as it
  exists, so a run stopped by its time limit still leaves what it measured; an item that would start with
  less than its expected seconds left is skipped and says so."""

  def __init__(self, deadline_s: float | None, path: str | None):
    self.t0, self.deadline_s, self.path = time.perf_counter(), deadline_s, path

  def left(self) -> float:
    return float("inf") if self.deadline_s is None else self.deadline_s - (time.perf_counter() - self.t0)

  def allows(self, need_s: float) -> bool:
    return self.left() >= need_s

  def save(self, doc: dict) -> None:
    doc["elapsed_s"] = time.perf_counter() - self.t0
    if self.path:
      common.write_json(doc, self.path, stamp=False)


def guarded(errors: list, what: str, fn, *a, **kw):
  """fn(*a, **kw), or None with the exception recorded in `errors` (one failed item never ends the run)."""
  try:
    return fn(*a, **kw)
  except Exception as e:  # noqa: BLE001 - recorded in the output, and the run goes on to its next item
    errors.append({"item": what, "error": f"{type(e).__name__}: {str(e)[:600]}"})
    print(f"[suite] FAILED {what}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
    gc.collect()
    return None


def tiny_cfgs() -> tuple[ModelConfig, ModelConfig]:
  t = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, max_position_embeddings=4096, dtype="float32")
  return t, t.replace(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)


def fits(cfg, dcfg, batch, context, hw_bytes, extra_slots: int = 160) -> bool:
  """Target + draft params once each, one target KV cache of context + extra_slots slots whose windowed
  layers are rings as the engine builds them (+10%), within 95% of what XLA may allocate (hw_bytes: the
  device's limit under XLA_PYTHON_CLIENT_MEM_FRACTION)."""
  need = costmodel.param_bytes(cfg, cfg.dtype) + costmodel.param_bytes(dcfg, dcfg.dtype)
  slots = ring_sizes(cfg, context + extra_slots, ring_margin(extra_slots))
  need += planner.cache_bytes(cfg, None, batch, slots) * 1.1
  return need < 0.95 * hw_bytes


def draft_objects(args, model: Model, small: Model):
  objs = {"self": (drafts.StreamingDraft(args.sink, args.window), args.alpha_self),
          "model": (drafts.ModelDraft(small, args.sink, args.window), args.alpha_model),
          "snapkv": (drafts.SnapKVDraft(args.budget, args.snap_window), args.alpha_self)}
  return {name: (d, alpha, d.spec.cost()) for name, (d, alpha) in objs.items()}


def _step_row(cfg, b, kv, t, sec, role):
  return stepfit.StepRow(cfg, b, kv, t, sec, cfg.dtype, role)


def fit_from_steps(name: str, rows, hw_bytes: float) -> tuple[stepfit.FittedHardware | None, dict]:
  """The fitted step-time model from every measured step, and its report (coefficients, errors)."""
  if len(rows) < 3:
    return None, {"skipped": f"{len(rows)} measured steps (need >= 3)"}
  hw = stepfit.fit_step_model(name, rows, memory_bytes=hw_bytes)
  train = stepfit.relative_errors(hw, rows)
  loo = calibrate.holdout_errors(rows) if len(rows) > 4 else np.zeros(0)
  rep = dict(hw.to_dict(), steps=len(rows), train_rel_err_mean=float(train.mean()),
             train_rel_err_max=float(train.max()))
  if loo.size:
    rep.update(holdout_rel_err_mean=float(loo.mean()), holdout_rel_err_max=float(loo.max()),
               holdout_method="leave-one-out")
  return hw, rep


def _step_record(args, model, small, dobj, head, cfg, dcfg, b, ctx, bw, rows, budget, errors, doc, full):
  """AR step vs its floor at (b, ctx); with `full` also verify(gamma + 1), tree verify sizes, each draft's
  step and the GEMM choice, each item only while the deadline allows. Appended to doc["steps"] at once."""
  steps = doc["steps"]
  if not budget.allows(args.step_need_s):
    steps.append({"batch": b, "context": ctx, "skipped": "deadline"})
    return
  ar = guarded(errors, f"AR b{b} ctx{ctx}", time_step, model.params, cfg, b, ctx, 1, "linear", args.repeats)
  if ar is None:
    return
  t_ar = ar["median_s"]
  floor = costmodel.step_bytes(cfg, b, ctx, 1, cfg.dtype) / bw
  rec = {"batch": b, "context": ctx, "ar_step_s": t_ar, "ar_floor_s": floor, "ar_over_floor": t_ar / floor,
         "floor_share": floor / t_ar, "ar_compile_s": ar["compile_s"]}
  steps.append(rec)
  rows.append(_step_row(cfg, b, ctx, 1, t_ar, "ar"))
  budget.save(doc)
  print(f"[suite] b{b} ctx{ctx}: AR {t_ar * 1e3:.2f} ms (floor {floor * 1e3:.2f}, share {floor / t_ar:.2f}, "
        f"compile {ar['compile_s']:.1f}s) at {budget.left():.0f}s left", file=sys.stderr, flush=True)
  if not full:
    return

  def measure(key, fn, *a, **kw):
    """fn's timing for `key` while the deadline allows (else the key is listed as skipped), or None."""
    if not budget.allows(args.step_need_s):
      rec.setdefault("skipped_for_deadline", []).append(key)
      return None
    return guarded(errors, f"{key} b{b} ctx{ctx}", fn, *a, **kw)

  items = [(f"verify_g{g}_over_ar", g + 1) for g in args.gammas]
  items += [(f"verify_n{n}_over_ar", n) for n in args.verify_nodes]
  for key, tok in items:
    r = measure(key, time_step, model.params, cfg, b, ctx, tok, "linear", args.repeats)
    if r is not None:
      rec[key] = r["median_s"] / t_ar
      rec[key.replace("_over_ar", "_compile_s")] = r["compile_s"]
      rows.append(_step_row(cfg, b, ctx, tok, r["median_s"], "verify"))
      budget.save(doc)
  for name, (d, _, cd) in dobj.items():
    dc = dcfg if name == "model" else cfg
    dp = small.params if name == "model" else model.params
    for w in args.draft_tokens:
      key = f"draft_{name}{'' if w == 1 else f'_w{w}'}_over_ar"
      r = measure(key, time_step, dp, dc, b, cd.kv_tokens(ctx), w, "ring", args.repeats)
      if r is not None:
        rec[key] = r["median_s"] / t_ar
        rows.append(_step_row(dc, b, cd.kv_tokens(ctx), w, r["median_s"], f"draft_{name}"))
        budget.save(doc)
  if head is not None:
    for w in args.draft_tokens:     # the feature head (FeatureDraft): fc + one layer + the target's head
      key = f"draft_feature{'' if w == 1 else f'_w{w}'}_over_ar"
      r = measure(key, calibrate.time_feature_step, head, model.params, b, args.sink + args.window, w,
                  args.repeats)
      if r is not None:
        rec[key] = r["median_s"] / t_ar
      gc.collect()
  if args.gemm == "both" and jax.default_backend() == "gpu":   # GPU option names: GPU only
    for choice, opts in GEMM_CHOICES.items():
      for tok in (1, max(args.gammas) + 1):
        key = f"gemm_{choice}_t{tok}_s"
        r = measure(key, time_step, model.params, cfg, b, ctx, tok, "linear", args.repeats, options=opts)
        if r is not None:
          rec[key] = r["median_s"]
  budget.save(doc)


def _e2e_records(args, model, dobj, vectors, hw, cfg, dcfg, b, ctx, hw_bytes, budget, errors, doc):
  """End to end at (b, ctx): AR, then each draft's chains (args.e2e_gammas, else the fitted model's gamma)
  and Sequoia trees, speedups over AR measured in this run. Appended to doc["end_to_end"] record by record."""
  e2e = doc["end_to_end"]
  if not fits(cfg, dcfg, b, ctx, hw_bytes, extra_slots=2 * args.max_new + max(args.e2e_trees or [0]) + 2):
    e2e.append({"batch": b, "context": ctx, "skipped": "does not fit in device memory"})
    return
  if not budget.allows(args.e2e_need_s):
    e2e.append({"batch": b, "context": ctx, "skipped": "deadline"})
    return
  ar = guarded(errors, f"e2e AR b{b} ctx{ctx}", decode_tokens_per_s, model, None, None, b, ctx, args.max_new,
               None, args.repeats)
  jax.clear_caches()
  if ar is None:
    return
  print(f"[suite] e2e b{b} ctx{ctx} AR {ar['tokens_per_s']:.1f} tok/s (compile {ar['compile_s']:.1f}s) at "
        f"{budget.left():.0f}s left", file=sys.stderr, flush=True)
  for name, (d, alpha, cd) in dobj.items():
    vec = vectors[name]
    picks = {}                             # who chose each gamma: the fitted model, the built-in roofline
    if hw is not None:
      picks["fitted_model"] = int(costmodel.choose_gamma(cfg, hw, cd, b, ctx, alpha, max(args.gammas), cfg.dtype)[0])
    picks["roofline"] = int(costmodel.choose_gamma(cfg, autotune.detect_hardware(), cd, b, ctx, alpha,
                                                   max(args.gammas), cfg.dtype)[0])
    gammas = []
    for g in (args.e2e_gammas or ["auto"]):
      g = picks.get("fitted_model", 3) if g == "auto" else picks["roofline"] if g == "roofline" else int(g)
      if g not in gammas:
        gammas.append(g)
    doc.setdefault("gamma_choices", []).append({"batch": b, "context": ctx, "draft": name, "alpha": alpha, **picks})
    configs = [(f"chain{g}", Tree.chain(g), (alpha,)) for g in gammas]
    if name in args.tree_drafts:
      configs += [(f"sequoia{n}", trees.sequoia_tree(vec, n, args.tree_max_depth), vec) for n in args.e2e_trees]
    best = {}
    for label, tree, v in configs:
      if not budget.allows(args.e2e_need_s):
        e2e.append({"batch": b, "context": ctx, "draft": name, "config": label, "skipped": "deadline"})
        continue
      sp = guarded(errors, f"e2e {name} {label} b{b} ctx{ctx}", decode_tokens_per_s, model, d, tree, b, ctx,
                   args.max_new, v, args.repeats)
      jax.clear_caches()                    # one compiled decode loop alive at a time
      gc.collect()
      if sp is None:
        continue
      pred = None
      if hw is not None:
        pred = costmodel.predicted_speedup(cfg, hw, cd, b, ctx, gamma=tree.max_depth, alpha=alpha,
                                           dtype=cfg.dtype) if tree.is_chain and label.startswith("chain") \
            else costmodel.predicted_speedup(cfg, hw, cd, b, ctx, tree=tree, acceptance_vector=v, dtype=cfg.dtype)
      rec = {"device": doc["env"]["device"], "jax_version": jax.__version__, "date": doc["env"]["date"],
             "model_shape": doc["model_shape"], "batch": b, "context": ctx, "draft": name, "config": label,
             "gamma": tree.max_depth if label.startswith("chain") else None, "tree_nodes": tree.num_nodes,
             "tree_depth": tree.max_depth, "alpha": alpha,
             "acceptance_vector": list(v) if not label.startswith("chain") else None,
             "ar_tokens_per_s": ar["tokens_per_s"], "spec_tokens_per_s": sp["tokens_per_s"],
             "speedup": sp["tokens_per_s"] / ar["tokens_per_s"], "predicted_speedup": pred,
             "predicted_by": "the model fitted to this run's steps" if pred is not None else None,
             "compile_s": sp["compile_s"], "ar_compile_s": ar["compile_s"],
             "measured_conditional_acceptance": sp.get("conditional_acceptance"),
             "mean_accepted_length": sp.get("mean_accepted_length"), "ar": ar, "spec": sp}
      e2e.append(rec)
      budget.save(doc)
      print(f"[suite] e2e b{b} ctx{ctx} {name} {label}: {rec['speedup']:.2f}x (compile {sp['compile_s']:.1f}s) "
            f"at {budget.left():.0f}s left", file=sys.stderr, flush=True)
      kind = "chain" if label.startswith("chain") else "tree"
      if kind not in best or rec["speedup"] > best[kind]["speedup"]:
        best[kind] = rec
    if "chain" in best:
      best["chain"]["best_gamma_for_draft"] = True
    if "tree" in best:
      best["tree"]["best_tree_for_draft"] = True


def run(args) -> dict:
  if args.smoke:
    cfg, dcfg = tiny_cfgs()
  else:
    cfg, dcfg = shapes.model_shape(args.model), shapes.model_shape(args.draft_model)
  doc = {"benchmark": "gpu_suite", "env": common.env_info(), "smoke": args.smoke,
         "model_shape": args.model if not args.smoke else "tiny", "draft_shape": args.draft_model
         if not args.smoke else "tiny-1layer", "dtype": cfg.dtype, "weights": "random",
         "acceptance": "Bernoulli(alpha) per draft token (chains) / simulated acceptance vector (trees) via "
                       "benchmarks/simulated_acceptance.py:bernoulli_accept",
         "kv_contents": "zeros (prefill skipped)",
         "xla_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
         "args": {k: v for k, v in vars(args).items() if k != "output"},
         "errors": [], "steps": [], "end_to_end": []}
  budget = Budget(args.deadline_s, args.output)
  errors = doc["errors"]
  dev = jax.devices()[0]
  hw_bytes = (dev.memory_stats() or {}).get("bytes_limit", 16 * 2**30) if dev.platform != "cpu" else 8 * 2**30
  doc["device_bytes_limit"] = hw_bytes
  vectors = {"self": tuple(args.tree_vector) if args.tree_vector else default_vector(args.alpha_self),
             "model": tuple(args.tree_vector) if args.tree_vector else default_vector(args.alpha_model)}
  vectors["snapkv"] = vectors["self"]
  doc["simulated_acceptance_vectors"] = vectors
  if args.checks:
    checks = [bernoulli_check(a) for a in sorted({args.alpha_self, args.alpha_model})]
    t16 = trees.sequoia_tree(vectors["self"], 16, args.tree_max_depth)
    checks.append(bernoulli_check(args.alpha_self, tree=t16, vector=vectors["self"]))
    doc["bernoulli_check"] = checks
  doc["bandwidth"] = copy_bandwidth(args.copy_bytes, args.repeats)
  bw = doc["bandwidth"]["bytes_per_s"]
  budget.save(doc)
  print(f"[suite] copy bandwidth {bw / 1e9:.1f} GB/s", file=sys.stderr, flush=True)

  model = Model(cfg, init_params(cfg, jax.random.key(0)), name=doc["model_shape"])
  small = Model(dcfg, init_params(dcfg, jax.random.key(1)), name=doc["draft_shape"])
  dobj = {k: v for k, v in draft_objects(args, model, small).items() if k in args.drafts}
  head = feature_head.init_head(model) if "feature" in args.drafts else None   # random: step time only
  rows = []
  step_shapes = args.steps or [(b, c) for c in args.contexts for b in args.batches]
  for b, ctx in step_shapes:
    if not fits(cfg, dcfg, b, ctx, hw_bytes):
      doc["steps"].append({"batch": b, "context": ctx, "skipped": "does not fit in device memory"})
      continue
    _step_record(args, model, small, dobj, head, cfg, dcfg, b, ctx, bw, rows, budget, errors, doc, full=True)
  hw, doc["fitted_model"] = fit_from_steps(f"{dev.platform}:{dev.device_kind} (fitted)", rows, hw_bytes)
  if hw is not None:
    prof = {"format": profiles.PROFILE_FORMAT, "device": doc["env"]["device"], "jax_version": jax.__version__,
            "date": doc["env"]["date"], "model": doc["model_shape"], "dtype": cfg.dtype, "source": "gpu_suite",
            "measurements": [{"role": r.role, "batch": r.batch, "kv_context": r.kv_context,
                              "new_tokens": r.new_tokens, "seconds": r.seconds,
                              "config": json.loads(r.cfg.to_json())} for r in rows],
            "fit": dict(hw.to_dict(), feature_doc=dict(stepfit.FEATURE_DOC))}
    doc["hardware_profile"] = prof
  budget.save(doc)
  for b, ctx in args.e2e:
    _e2e_records(args, model, dobj, vectors, hw, cfg, dcfg, b, ctx, hw_bytes, budget, errors, doc)
  install_bernoulli(None)
  for b, ctx in args.late_steps:           # AR step vs floor only, after the end-to-end runs
    if fits(cfg, dcfg, b, ctx, hw_bytes):
      _step_record(args, model, small, dobj, head, cfg, dcfg, b, ctx, bw, rows, budget, errors, doc, full=False)
  if args.agreement_batch and budget.allows(args.e2e_need_s):
    g = args.agreement_gamma
    doc["greedy_agreement"] = guarded(errors, "greedy agreement", greedy_agreement, model, dobj["self"][0], g,
                                      args.agreement_batch, args.agreement_prompt, args.agreement_new,
                                      args.agreement_head_scale)
    if doc["greedy_agreement"]:
      print(f"[suite] greedy agreement: {doc['greedy_agreement']['share_equal']:.3f} of tokens equal, "
            f"{doc['greedy_agreement']['rows_identical']}/{args.agreement_batch} rows identical",
            file=sys.stderr, flush=True)
  doc["compile_s_total"] = _COMPILE["s"]
  budget.save(doc)
  return doc


def summary(doc: dict) -> str:
  lines = [f"copy bandwidth {doc['bandwidth']['bytes_per_s'] / 1e9:.0f} GB/s (read + write)"]
  for r in doc["steps"]:
    if "skipped" in r:
      lines.append(f"step b{r['batch']} ctx{r['context']}: skipped ({r['skipped']})")
      continue
    ratios = " ".join(f"{k[:-8]} {v:.2f}" for k, v in r.items() if k.endswith("_over_ar"))
    lines.append(f"step b{r['batch']} ctx{r['context']}: AR {r['ar_step_s'] * 1e3:.2f} ms, floor "
                 f"{r['ar_floor_s'] * 1e3:.2f} ms, share {r['floor_share']:.2f}, compile {r['ar_compile_s']:.0f}s; "
                 + ratios)
  for e in doc.get("errors", []):
    lines.append(f"error: {e['item']}: {e['error'][:200]}")
  lines.append(f"{'batch':>5} {'ctx':>6} {'draft':>7} {'config':>10} {'alpha':>5} {'AR tok/s':>10} {'spec tok/s':>10} "
               f"{'speedup':>8} {'predicted':>9} {'compile s':>9}")
  for r in doc["end_to_end"]:
    if "skipped" in r:
      lines.append(f"{r['batch']:>5} {r['context']:>6} {r.get('draft', ''):>7} {r.get('config', ''):>10} "
                   f"skipped: {r['skipped']}")
      continue
    pred = f"{r['predicted_speedup']:.2f}" if r["predicted_speedup"] is not None else "-"
    lines.append(f"{r['batch']:>5} {r['context']:>6} {r['draft']:>7} {r['config']:>10} {r['alpha']:>5.2f} "
                 f"{r['ar_tokens_per_s']:>10.1f} {r['spec_tokens_per_s']:>10.1f} {r['speedup']:>8.2f} {pred:>9} "
                 f"{r['compile_s']:>9.1f}")
  return "\n".join(lines)


def main(argv=None):
  ap = common.parser(__doc__, smoke="tiny float32 shapes on any device, well under a minute")
  ap.add_argument("--model", default="llama31_8b")
  ap.add_argument("--draft-model", default="llama32_1b")
  ap.add_argument("--contexts", type=common.int_list, default=[4096, 8192, 16384, 32768])
  ap.add_argument("--batches", type=common.int_list, default=[1, 8, 32])
  ap.add_argument("--gammas", type=common.int_list, default=[1, 2, 3, 4])
  ap.add_argument("--e2e", type=common.shape_list, default=[(8, 32768), (32, 8192), (8, 16384)], help="BxCONTEXT end-to-end shapes")
  ap.add_argument("--e2e-gammas", type=lambda t: [x for x in t.split(",") if x], default=[],
                  help="gammas run end to end: integers, 'auto' (the fitted model's pick) and 'roofline' (the "
                       "built-in hardware model's pick, what gamma=auto uses without a profile); default: auto")
  ap.add_argument("--e2e-trees", type=common.int_list, default=[16, 32, 64], help="Sequoia tree sizes run end to end")
  ap.add_argument("--tree-drafts", type=lambda t: [x for x in t.split(",") if x], default=["self", "model"],
                  help="drafts that also run the Sequoia trees")
  ap.add_argument("--tree-max-depth", type=int, default=8)
  ap.add_argument("--tree-vector", type=lambda t: [float(x) for x in t.split(",") if x], default=None,
                  help="simulated acceptance vector for trees (default alpha (1 - alpha)^k, k < 8)")
  ap.add_argument("--verify-nodes", type=common.int_list, default=[16, 32, 64], help="tree verify sizes timed")
  ap.add_argument("--draft-tokens", type=common.int_list, default=[1, 4], help="tokens per draft step timed")
  ap.add_argument("--agreement-batch", type=int, default=4, help="greedy agreement rows (0: skip)")
  ap.add_argument("--agreement-prompt", type=int, default=1024)
  ap.add_argument("--agreement-new", type=int, default=64)
  ap.add_argument("--agreement-gamma", type=int, default=3)
  ap.add_argument("--agreement-head-scale", type=float, default=25.0)
  ap.add_argument("--alpha-self", type=float, default=0.8)
  ap.add_argument("--alpha-model", type=float, default=0.7)
  ap.add_argument("--sink", type=int, default=16)
  ap.add_argument("--window", type=int, default=512)
  ap.add_argument("--budget", type=int, default=512)
  ap.add_argument("--snap-window", type=int, default=64)
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--copy-bytes", type=int, default=2 * 2**30)
  ap.add_argument("--steps", type=common.shape_list, default=[],
                  help="BxCONTEXT step shapes (default: every --contexts x --batches)")
  ap.add_argument("--late-steps", type=common.shape_list, default=[],
                  help="BxCONTEXT shapes whose AR step alone is timed after the end-to-end runs")
  ap.add_argument("--drafts", type=lambda t: [x for x in t.split(",") if x],
                  default=["self", "model", "snapkv", "feature"], help="drafts timed and run end to end")
  ap.add_argument("--deadline-s", type=float, default=None,
                  help="stop starting items after this many seconds (what was measured is saved as it comes)")
  ap.add_argument("--step-need-s", type=float, default=45.0, help="seconds a step item needs to start")
  ap.add_argument("--e2e-need-s", type=float, default=120.0, help="seconds an end-to-end item needs to start")
  ap.add_argument("--no-checks", dest="checks", action="store_false", help="skip the Bernoulli switch checks")
  ap.add_argument("--gemm", choices=("engine", "both"), default="engine",
                  help="both: also time AR and verify(max gamma + 1) steps with cuBLAS and with Triton GEMMs "
                       "(GPU only; the engine's own choice is compile.GPU_DECODE_OPTIONS)")
  args = common.parse(ap, argv, contexts=[64], batches=[1, 2], gammas=[2], verify_nodes=[8], draft_tokens=[1, 2],
                      e2e=[(2, 64)], e2e_gammas=["2"], max_new=48, repeats=2, e2e_trees=[8], tree_drafts=["self"],
                      tree_max_depth=4, agreement_batch=2, agreement_prompt=64, agreement_new=16, sink=4,
                      window=16, budget=16, snap_window=8, copy_bytes=2**24)
  doc = run(args)
  path = common.finish(doc, args.output, f"gpu_suite_{common.device_tag()}.json")
  if "hardware_profile" in doc:           # usable as run.py --hardware=... / generate(hardware=...)
    profiles.save_profile(doc["hardware_profile"], os.path.splitext(path)[0] + ".profile.json")
  print(summary(doc), flush=True)


if __name__ == "__main__":
  main()
