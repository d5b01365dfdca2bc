"""MagicDec GPU suite: bandwidth, AR step vs its floor, verify / draft cost ratios, end-to-end speedup.

One command (< 10 minutes on one H100), random weights at real shapes (target llama31_8b, small draft
llama32_1b, bfloat16). Random weights accept almost nothing, so end-to-end runs replace the accept/reject
outcome by Bernoulli(alpha) per draft token (`bernoulli_accept`, patched over `magicdec_jax.loop.accept`
ONLY inside this process; drafting, the verify pass, cache commits and rollbacks all run as in real
generation). Every end-to-end record states its alpha. KV contents are zeros (prefill is skipped: with
random weights and forced acceptance only the costs matter, and those do not depend on the values).

  python benchmarks/gpu_suite.py --output benchmarks/results/gpu_suite_h100.json
  python benchmarks/gpu_suite.py --smoke --output /tmp/smoke.json          # tiny shapes, CPU, < 1 minute
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import costmodel, drafts, loop, shapes, verify  # noqa: E402
from magicdec_jax.cache import KVCache  # noqa: E402
from magicdec_jax.config import ModelConfig  # noqa: E402
from magicdec_jax.layers.attention import DenseMask, PrefixTree  # noqa: E402
from magicdec_jax.model import Model, forward, init_params  # noqa: E402
from magicdec_jax.sampling import Sampling  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402

_REAL_ACCEPT = verify.accept
_ALPHA = {"value": None}


def bernoulli_accept(tree: Tree, greedy, logits_or_p, q, node_tokens, keys):
  """The real `accept` (same cost, same outputs' shapes), then n <- leading successes of Bernoulli(alpha)
  draws, one per chain position (a chain only). Benchmark-only: installed by `install_bernoulli`."""
  path, n, nxt, acc_at = _REAL_ACCEPT(tree, greedy, logits_or_p, q, node_tokens, keys)
  alpha = _ALPHA["value"]
  if alpha is None or tree.max_depth == 0:
    return path, n, nxt, acc_at
  if not tree.is_chain:
    raise ValueError("bernoulli_accept supports chains only")
  d = tree.max_depth
  u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 0xBE5), (d,)))(keys)   # [B, D]
  acc_at = jnp.cumprod((u < alpha).astype(jnp.int32), axis=1).astype(bool)
  n = acc_at.sum(1).astype(jnp.int32)
  i = jnp.arange(d + 1)[None, :]
  path = jnp.where(i <= n[:, None], i, 0).astype(path.dtype)     # chain node i sits at depth i
  return path, n, nxt, acc_at


def install_bernoulli(alpha: float | None) -> None:
  """Route the decode loop's accept through bernoulli_accept with this alpha (None: real acceptance)."""
  _ALPHA["value"] = alpha
  loop.accept = bernoulli_accept
  jax.clear_caches()           # alpha is a trace-time constant: never reuse a loop traced with another


def bernoulli_check(alpha: float, gamma: int = 4, batch: int = 4096) -> dict:
  """Large-sample check of the switch itself: per-position conditional acceptance should be alpha."""
  _ALPHA["value"] = alpha
  tree = Tree.chain(gamma)
  v = 8
  logits = jnp.zeros((batch, tree.num_nodes, v))
  keys = jax.random.split(jax.random.key(1), batch)
  _, n, _, acc_at = bernoulli_accept(tree, True, logits, None, jnp.zeros((batch, tree.num_nodes), jnp.int32),
                                     keys)
  acc_at = np.asarray(acc_at)
  trials = batch + acc_at[:, :-1].sum()             # position d is tried iff all before it were accepted
  return {"alpha": alpha, "gamma": gamma, "rows": batch, "conditional_acceptance": float(acc_at.sum() / trials),
          "mean_accepted": float(np.asarray(n).mean()),
          "expected_mean_accepted": float(costmodel.expected_tokens_chain(alpha, gamma) - 1)}


# ---- step timing ----------------------------------------------------------------------------------------

def copy_bandwidth(nbytes: int, repeats: int) -> dict:
  """Bytes moved (read + write) per second by a jitted elementwise copy of a large bf16 array."""
  n = nbytes // 2
  x = jnp.ones((n,), jnp.bfloat16)
  f = jax.jit(lambda a: a + jnp.bfloat16(1))
  t, _ = common.median_time(lambda: f(x), repeats, warmup=2)
  return {"array_bytes": 2 * n, "median_s": t, "bytes_per_s": 2 * 2 * n / t}


def _step_fn(cfg: ModelConfig, t: int, kind: str):
  """A jitted forward of t tokens per row; the cache is donated (written in place, as in the loop)."""
  anc = np.tril(np.ones((t, t), bool))

  def step(params, cache, tokens, base):
    pos = base[:, None] + jnp.arange(t)[None, :]
    if kind == "linear":
      spec = PrefixTree(base, jnp.asarray(anc))
      slots = pos
    else:                                # draft ring: every static / window slot visible, scratch at the end
      s = cache.k.shape[3]
      slots = jnp.broadcast_to(s - t + jnp.arange(t), pos.shape)
      spec = DenseMask(jnp.ones((tokens.shape[0], t, s), bool))
    logits, cache = forward(params, cfg, tokens, pos, cache, slots, spec)
    return logits, cache
  return jax.jit(step, donate_argnums=(1,))


def time_step(params, cfg: ModelConfig, batch: int, slots: int, t: int, kind: str, repeats: int) -> float:
  """Median seconds of one forward of t tokens per row against a cache of `slots` slots."""
  f = _step_fn(cfg, t, kind)
  cache = KVCache.zeros(cfg, batch, slots)
  tokens = jnp.zeros((batch, t), jnp.int32)
  base = jnp.full((batch,), max(slots - t - 1, 0), jnp.int32)
  times = []
  for i in range(repeats + 2):
    t0 = time.perf_counter()
    logits, cache = f(params, cache, tokens, base)
    jax.block_until_ready(logits)
    if i >= 2:
      times.append(time.perf_counter() - t0)
  return float(np.median(times))


# ---- end to end -----------------------------------------------------------------------------------------

def decode_tokens_per_s(model: Model, draft, gamma: int, batch: int, context: int, max_new: int,
                        alpha: float | None, repeats: int) -> dict:
  """Tokens/s of loop.decode from a context-long (zero) cache: AR if draft is None, else a gamma chain."""
  cfg = model.config
  if draft is None:
    spec, dparams, tree = None, None, Tree((-1,))
  else:
    spec, dparams, tree = drafts.static_spec(draft), getattr(getattr(draft, "model", None), "params", None), \
        Tree.chain(gamma)
  install_bernoulli(alpha)
  out_len = max_new + tree.num_nodes
  slots = context + out_len + 1
  def fresh():                                # the state is donated to decode: rebuild every input
    tokens = jnp.zeros((batch, context), jnp.int32)
    lengths = jnp.full((batch,), context, jnp.int32)
    keys = jax.random.split(jax.random.key(0), batch)
    ring = None if spec is None else drafts.empty_ring(
        spec, cfg if drafts.is_self(spec) else spec.config, batch, tree)
    st = loop.initial_state(tokens, lengths, jnp.full((batch,), max_new, jnp.int32), jnp.array([-1], jnp.int32),
                            keys, KVCache.zeros(cfg, batch, slots), ring, out_len, tree)
    return jax.block_until_ready(st)

  times, st = [], None
  for i in range(repeats + 1):
    s0 = fresh()
    t0 = time.perf_counter()
    st = jax.block_until_ready(loop.decode(model.params, dparams, s0, cfg=cfg, spec=spec, tree=tree,
                                           sampling=Sampling()))
    if i >= 1:
      times.append(time.perf_counter() - t0)
  t = float(np.median(times))
  rounds = np.asarray(st.rounds)
  acc_at = np.asarray(st.accepted_at)
  n_out = int(np.asarray(st.n_out).sum())
  rec = {"tokens_per_s": n_out / t, "decode_s": t, "new_tokens": n_out, "verify_steps": int(rounds.sum())}
  if tree.max_depth:
    trials = rounds.sum() + acc_at[:, :-1].sum()
    rec.update(conditional_acceptance=float(acc_at.sum() / trials),
               mean_accepted_length=float((acc_at.sum() + rounds.sum()) / rounds.sum()))
  return rec


# ---- main -----------------------------------------------------------------------------------------------

def tiny_cfgs() -> tuple[ModelConfig, ModelConfig]:
  t = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16, max_position_embeddings=4096, dtype="float32")
  return t, t.replace(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)


def fits(cfg, dcfg, batch, context, hw_bytes) -> bool:
  need = 2 * costmodel.param_bytes(cfg, cfg.dtype) + costmodel.param_bytes(dcfg, dcfg.dtype)
  need += batch * (context + 80) * costmodel.kv_bytes_per_token(cfg, cfg.dtype) * 1.1
  return need < 0.85 * hw_bytes


def draft_objects(args, model: Model, small: Model):
  return {
      "self": (drafts.StreamingDraft(args.sink, args.window), args.alpha_self,
               costmodel.Draft("self", sink=args.sink, window=args.window)),
      "model": (drafts.ModelDraft(small, args.sink, args.window), args.alpha_model,
                costmodel.Draft("model", draft_cfg=small.config, sink=args.sink, window=args.window)),
      "snapkv": (drafts.SnapKVDraft(args.budget, args.snap_window), args.alpha_self,
                 costmodel.Draft("snapkv", budget=args.budget, window=args.snap_window, sink=0)),
  }


def run(args) -> dict:
  if args.smoke:
    cfg, dcfg = tiny_cfgs()
  else:
    cfg, dcfg = shapes.model_shape(args.model), shapes.model_shape(args.draft_model)
  doc = {"benchmark": "gpu_suite", "env": common.env_info(), "smoke": args.smoke,
         "model_shape": args.model if not args.smoke else "tiny", "draft_shape": args.draft_model
         if not args.smoke else "tiny-1layer", "dtype": cfg.dtype, "weights": "random",
         "acceptance": "Bernoulli(alpha) per draft token via benchmarks/gpu_suite.py:bernoulli_accept",
         "kv_contents": "zeros (prefill skipped)", "args": {k: v for k, v in vars(args).items() if k != "output"}}
  dev = jax.devices()[0]
  hw_bytes = (dev.memory_stats() or {}).get("bytes_limit", 16 * 2**30) if dev.platform != "cpu" else 8 * 2**30
  doc["bernoulli_check"] = [bernoulli_check(a) for a in sorted({args.alpha_self, args.alpha_model})]
  doc["bandwidth"] = copy_bandwidth(args.copy_bytes, args.repeats)
  bw = doc["bandwidth"]["bytes_per_s"]
  print(f"[suite] copy bandwidth {bw / 1e9:.1f} GB/s", file=sys.stderr, flush=True)

  model = Model(cfg, init_params(cfg, jax.random.key(0)), name=doc["model_shape"])
  small = Model(dcfg, init_params(dcfg, jax.random.key(1)), name=doc["draft_shape"])
  dobj = draft_objects(args, model, small)
  steps, meas = [], []
  for ctx in args.contexts:
    for b in args.batches:
      if not fits(cfg, dcfg, b, ctx, hw_bytes):
        steps.append({"batch": b, "context": ctx, "skipped": "does not fit in device memory"})
        continue
      t_ar = time_step(model.params, cfg, b, ctx + 1, 1, "linear", args.repeats)
      floor = costmodel.step_bytes(cfg, b, ctx, 1, cfg.dtype) / bw
      rec = {"batch": b, "context": ctx, "ar_step_s": t_ar, "ar_floor_s": floor, "ar_over_floor": t_ar / floor}
      meas.append((costmodel.StepShape(cfg, b, ctx, 1, cfg.dtype), t_ar))
      for g in args.gammas:
        tv = time_step(model.params, cfg, b, ctx + g + 1, g + 1, "linear", args.repeats)
        rec[f"verify_g{g}_over_ar"] = tv / t_ar
        meas.append((costmodel.StepShape(cfg, b, ctx, g + 1, cfg.dtype), tv))
      for name, (d, _, cd) in dobj.items():
        dc = dcfg if name == "model" else cfg
        dp = small.params if name == "model" else model.params
        td = time_step(dp, dc, b, cd.kv_tokens(ctx) + 1, 1, "ring", args.repeats)
        rec[f"draft_{name}_over_ar"] = td / t_ar
      steps.append(rec)
      print(f"[suite] b{b} ctx{ctx}: AR {t_ar * 1e3:.2f} ms (floor {floor * 1e3:.2f})", file=sys.stderr, flush=True)
  doc["steps"] = steps
  hw = costmodel.calibrate(f"{dev.device_kind} (calibrated)", meas, combine="max") if len(meas) >= 3 else None
  if hw is not None:
    doc["calibrated_hardware"] = {"bytes_per_s": hw.hbm_bytes_per_s, "flops_per_s": hw.flops_per_s,
                                  "step_overhead_s": hw.step_overhead_s, "combine": hw.combine}
  e2e = []
  for b, ctx in args.e2e:
    if not fits(cfg, dcfg, b, ctx, hw_bytes):
      e2e.append({"batch": b, "context": ctx, "skipped": "does not fit in device memory"})
      continue
    ar = decode_tokens_per_s(model, None, 0, b, ctx, args.max_new, None, args.repeats)
    for name, (d, alpha, cd) in dobj.items():
      gammas = args.e2e_gammas or [costmodel.choose_gamma(cfg, hw, cd, b, ctx, alpha, max(args.gammas),
                                                           cfg.dtype)[0]]
      best = None
      for g in gammas:
        sp = decode_tokens_per_s(model, d, g, b, ctx, args.max_new, alpha, args.repeats)
        pred = costmodel.predicted_speedup(cfg, hw, cd, b, ctx, gamma=g, alpha=alpha, dtype=cfg.dtype) \
            if hw is not None else None
        rec = {"device": doc["env"]["device"], "jax_version": jax.__version__, "date": doc["env"]["date"],
               "model_shape": doc["model_shape"], "batch": b, "context": ctx, "draft": name, "gamma": g,
               "alpha": alpha, "ar_tokens_per_s": ar["tokens_per_s"], "spec_tokens_per_s": sp["tokens_per_s"],
               "speedup": sp["tokens_per_s"] / ar["tokens_per_s"], "predicted_speedup": pred,
               "measured_conditional_acceptance": sp.get("conditional_acceptance"),
               "mean_accepted_length": sp.get("mean_accepted_length"), "ar": ar, "spec": sp}
        e2e.append(rec)
        best = rec if best is None or rec["speedup"] > best["speedup"] else best
      best["best_gamma_for_draft"] = True
      print(f"[suite] e2e b{b} ctx{ctx} {name}: best g{best['gamma']} speedup {best['speedup']:.2f} "
            f"(pred {best['predicted_speedup']})", file=sys.stderr, flush=True)
  install_bernoulli(None)
  doc["end_to_end"] = e2e
  return doc


def summary(doc: dict) -> str:
  lines = [f"{'batch':>5} {'ctx':>6} {'draft':>7} {'gamma':>5} {'alpha':>5} {'AR tok/s':>10} {'spec tok/s':>10} "
           f"{'speedup':>8} {'predicted':>9}"]
  for r in doc["end_to_end"]:
    if "skipped" in r:
      lines.append(f"{r['batch']:>5} {r['context']:>6} skipped: {r['skipped']}")
      continue
    pred = f"{r['predicted_speedup']:.2f}" if r["predicted_speedup"] is not None else "-"
    lines.append(f"{r['batch']:>5} {r['context']:>6} {r['draft']:>7} {r['gamma']:>5} {r['alpha']:>5.2f} "
                 f"{r['ar_tokens_per_s']:>10.1f} {r['spec_tokens_per_s']:>10.1f} {r['speedup']:>8.2f} {pred:>9}")
  return "\n".join(lines)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--smoke", action="store_true", help="tiny float32 shapes on any device, well under a minute")
  ap.add_argument("--model", default="llama31_8b")
  ap.add_argument("--draft-model", default="llama32_1b")
  ap.add_argument("--contexts", type=common.int_list, default=[4096, 8192, 16384, 32768])
  ap.add_argument("--batches", type=common.int_list, default=[1, 8, 32])
  ap.add_argument("--gammas", type=common.int_list, default=[1, 2, 3, 4])
  ap.add_argument("--e2e", type=common.shape_list, default=[(8, 32768), (8, 16384), (32, 8192)], help="BxCONTEXT end-to-end shapes")
  ap.add_argument("--e2e-gammas", type=common.int_list, default=[], help="default: the calibrated cost model's best gamma")
  ap.add_argument("--alpha-self", type=float, default=0.8)
  ap.add_argument("--alpha-model", type=float, default=0.7)
  ap.add_argument("--sink", type=int, default=16)
  ap.add_argument("--window", type=int, default=512)
  ap.add_argument("--budget", type=int, default=512)
  ap.add_argument("--snap-window", type=int, default=64)
  ap.add_argument("--max-new", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--copy-bytes", type=int, default=2 * 2**30)
  ap.add_argument("--output", default=None)
  args = ap.parse_args(argv)
  if args.smoke:
    args.contexts, args.batches, args.gammas = [64], [1, 2], [2]
    args.e2e, args.e2e_gammas, args.max_new, args.repeats = [(2, 64)], [2], 48, 2
    args.sink, args.window, args.budget, args.snap_window, args.copy_bytes = 4, 16, 16, 8, 2**24
  doc = run(args)
  common.finish(doc, args.output, f"gpu_suite_{common.device_tag()}.json")
  print(summary(doc), flush=True)


if __name__ == "__main__":
  main()
