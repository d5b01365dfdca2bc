"""The GPU harness: named parts through the engine's own loop, random bf16 weights at real shapes, one JSON + log.

Every configuration runs `Engine.decode` from a zero cache (bench.py), acceptance simulated as Bernoulli(alpha)
per draft token (simulate.py): the paper part's alpha per draft kind measured on CPU (`--acceptance`, from
benchmarks/drafts/acceptance.py; `--alpha KIND=VALUE` overrides one), the others' 0.8 (self) and 0.7 (1B).
Parts run in the order given, each within its `--budget PART=SECONDS` and the run's `--deadline-s` (what would
start later is recorded as skipped). Each part in full: docs/gpu.md#harness.

  paper      one GPU's shard of MagicDec's TP-8 LLaMA-3.1-8B setting at 32K and 100K: three drafts at the
             paper's gammas and at gamma="auto"'s, speedups with predicted all-reduces beside the paper's
  stream     steady-state tokens/s of `generate_stream` at 8 x 32K against the single-call loop
  tree       a Sequoia tree against the best of chains 2 / 3 at 8 x 32K
  headline   the README's 8 x 32K table: AR, self-draft on bf16 / int8 / int4 copies, the 1B draft, the shard
  batch1     the 1 x 4K AR step against its floor
  identity   fixed-shape numerics on the Pallas kernel against fast: greedy tokens, then cost at 8 x 32K
  invariant  the headline's AR and self chain 3 with fixed-shape numerics

  PYTHONPATH=. python3 -m benchmarks.gpu.harness --parts paper,stream,tree --deadline-s 480 --output $OUT/gpu.json
  python -m benchmarks.gpu.harness --smoke --parts all --output /tmp/gpu.json    # tiny shapes on CPU, minutes
"""
from __future__ import annotations

import dataclasses
import gc
import os
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")   # before jax starts

from benchmarks import common  # noqa: E402
from benchmarks.gpu import simulate  # noqa: E402
from benchmarks.gpu.bench import Bench, forward_allreduce_s  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from magicdec_jax import compile as compiling  # noqa: E402
from magicdec_jax import backend, drafts, generation, schedule, trees  # noqa: E402
from magicdec_jax.config import ModelConfig  # noqa: E402
from magicdec_jax.model import Model, init_params  # noqa: E402
from magicdec_jax.stream import generate_stream  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402
from magicdec_jax.tuning import autotune, shapes  # noqa: E402

ACCEPTANCE = common.RESULTS_DIR / "draft_acceptance_cpu_2026-11-28.json"
KIND_OF = {"self": "streaming", "snapkv": "snapkv", "1B": "model", "self int8": "int8", "self int4": "int4"}
ASSUMED = {"self": 0.8, "1B": 0.7}           # the earlier runs' simulated acceptance (headline, tree, stream)
# MagicDec (arXiv 2408.11049), 8 x H100, TP 8, LLaMA-3.1-8B, PG-19, 32K: speedup per draft and batch; at
# 100K batch 41 SnapKV gamma 11. Its gammas: 8 x A100 batch 32 gamma 3, batch 128 gamma 4, 100K gamma 5
# (self); batch 16 and 64 are not stated (3 assumed).
PAPER = {"self": {16: 1.08, 32: 1.26, 64: 1.55, 128: 1.85}, "snapkv": {16: 1.17, 32: 1.37, 64: 1.64, 128: 2.01},
         "1B": {16: 1.27, 32: 1.46, 64: 1.67, 128: 1.81}, "snapkv 100K b41": 2.29}
PAPER_GAMMA = {16: 3, 32: 3, 64: 3, 128: 4}
PAPER_GAMMA_100K = {"snapkv": 11, "self": 5, "1B": 5}
BUDGETS = {"paper": 250, "stream": 110, "tree": 80, "headline": 270, "batch1": 40, "identity": 240, "invariant": 250}


def tp_shard(cfg: ModelConfig, tp: int) -> ModelConfig:
  """One device's shard of `cfg` under tensor parallelism over `tp` devices (heads, KV heads and MLP / tp)."""
  return cfg.replace(num_heads=cfg.num_heads // tp, num_kv_heads=max(1, cfg.num_kv_heads // tp),
                     intermediate_size=cfg.intermediate_size // tp)


def configs(smoke: bool) -> tuple[ModelConfig, ModelConfig]:
  """(target, small draft) shapes: LLaMA-3.1-8B and LLaMA-3.2-1B, or tiny bf16 ones for --smoke."""
  if not smoke:
    return shapes.model_shape("llama31_8b"), shapes.model_shape("llama32_1b")
  t = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_position_embeddings=4096, dtype="bfloat16")
  return t, t.replace(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)


def random_model(cfg: ModelConfig, seed: int, name: str) -> Model:
  return Model(cfg, init_params(cfg, jax.random.key(seed)), name=name)


def load_alphas(path, overrides: dict) -> dict:
  """Draft name -> {"alpha", "source"}: the greedy chain alpha measured per draft kind in `path`, else an
  override."""
  doc = common.read_json(path)
  kinds = doc["drafts"]["kinds"]
  where = f"{os.path.basename(str(path))} ({doc['model']}, {doc['drafts']['batch']} x {doc['drafts']['prompt_tokens']})"
  out = {name: {"alpha": kinds[k]["greedy"]["alpha"], "source": f"{where}: {k}, greedy"}
         for name, k in KIND_OF.items() if k in kinds}
  out.update({name: {"alpha": a, "source": "--alpha"} for name, a in overrides.items()})
  return out


# ---- parts ---------------------------------------------------------------------------------------------

def part_paper(b: Bench, m: dict):
  a, ctx = b.args, m["C"]
  tp, scale = (2, 8) if a.smoke else (8, 1)
  scfg = tp_shard(m["target_cfg"], tp)
  shard = random_model(scfg, 5, "llama31_8b tp8 shard")
  small = random_model(tp_shard(m["small_cfg"], tp), 6, "llama32_1b tp8 shard")
  sink, window = m["ring"]
  dr = {"self": drafts.StreamingDraft(sink, window), "snapkv": drafts.SnapKVDraft(*m["snapkv"]),
        "1B": drafts.ModelDraft(small, sink, window),
        "self int8": drafts.StreamingDraft(sink, window, weights="int8"),
        "self int4": drafts.StreamingDraft(sink, window, weights="int4")}
  al = m["alphas"]
  b.put("shard", {"tp": tp, "target": dataclasses.asdict(scfg), "draft_1b": dataclasses.asdict(small.config),
                  "alphas": al, "paper": PAPER, "paper_gammas": {"32K": PAPER_GAMMA, "100K b41": PAPER_GAMMA_100K},
                  "allreduce": "predicted: bench.ALLREDUCE_BUS_BYTES_PER_S / ALLREDUCE_LATENCY_S (assumed)"})
  ar_of, table, floors = {}, {}, {}

  def point(batch, context, name, gamma, source):
    key = f"b{batch}x{context}"
    if key not in ar_of:
      ar = ar_of[key] = b.run(f"{key} AR", shard, None, trees.AR_TREE, None, batch, context)
      if fl := b.floor(scfg, batch, context, ar, shares=False):   # the AR step against the bytes it must read
        floors[key] = fl
        b.put("floors", floors)
    base, d = ar_of[key], dr[name]
    r = b.run(f"{key} {name} γ{gamma}", shard, d, Tree.chain(gamma), al[name]["alpha"], batch, context,
              kind=name, gamma_source=source, alpha_source=al[name]["source"])
    if "tok_per_s" in r and "tok_per_s" in base:
      dcfg = small.config if name == "1B" else scfg
      ar_s, comm1 = base["ms_per_loop_round"] / 1e3, forward_allreduce_s(scfg, batch, 1, tp)
      comm = gamma * forward_allreduce_s(dcfg, batch, 1, tp) + forward_allreduce_s(scfg, batch, gamma + 1, tp)
      with_comm = (r["tokens_N2"] / batch) * (ar_s + comm1) / (r["loop_rounds_N2"] * (r["ms_per_loop_round"] / 1e3 + comm))
      table.setdefault(key, {})[f"{name} γ{gamma}"] = {
          "speedup": r["tok_per_s"] / base["tok_per_s"], "speedup_marginal": r["tok_per_s_marginal"] / base["tok_per_s_marginal"],
          "speedup_with_allreduce_predicted": with_comm, "allreduce_ms_per_round_predicted": comm * 1e3,
          "gamma_source": source, "alpha": al[name]["alpha"],
          "paper": PAPER.get(name, {}).get(batch * scale) if context == ctx else PAPER["snapkv 100K b41"] if name == "snapkv" else None}
      b.put("table", table)

  def auto_gamma(batch, context, name) -> int:
    tree, info = autotune.choose(scfg, dr[name], batch, context, want_tree=False, alpha=al[name]["alpha"],
                                 max_gamma=max(schedule.AUTO_GAMMAS), allow_autoregressive=True, new_tokens=a.n2)
    b.res["parts"]["paper"].setdefault("auto", {})[f"b{batch}x{context} {name}"] = {
        **{k: v for k, v in info.items() if isinstance(v, (int, float, str, bool))}, "gamma": tree.max_depth}
    return tree.max_depth

  bs = {n: max(1, n // scale) for n in (16, 32, 64, 128)}
  for n in (64, 128):
    for name in ("self", "snapkv", "1B"):
      point(bs[n], ctx, name, PAPER_GAMMA[n], "paper")
  for name in ("snapkv", "self", "1B"):
    point(max(1, 41 // scale), m["C100K"], name, PAPER_GAMMA_100K[name], "paper")
  for name in ("self", "snapkv", "1B"):
    point(bs[32], ctx, name, PAPER_GAMMA[32], "paper")
  for name in ("self int8", "self int4"):
    point(bs[64], ctx, name, PAPER_GAMMA[64], "paper")
  for n in (64, 128, 32):
    for name in ("self", "snapkv", "1B"):
      g = auto_gamma(bs[n], ctx, name)
      if g and g != PAPER_GAMMA[n]:
        point(bs[n], ctx, name, g, "auto")
  for name in ("self", "snapkv", "1B"):
    point(bs[16], ctx, name, PAPER_GAMMA[16], "paper")


def part_stream(b: Bench, m: dict):
  """generate_stream against the single-call loop at 8 x C, self-draft chain `--stream-gamma`."""
  a, target, batch, ctx = b.args, m["target"], 8, m["C"]
  alpha, g = m["alphas"]["self"], a.stream_gamma
  draft = drafts.StreamingDraft(*m["ring"])
  single = b.run(f"8x{ctx} self γ{g}", target, draft, Tree.chain(g), alpha["alpha"], batch, ctx,
                 alpha_source=alpha["source"])
  if b.late(a.config_s * 2):                        # its compiles and the first prefills
    return b.put("stream", {"skipped": "deadline"})
  rng = np.random.default_rng(0)
  fed = []

  def requests():                       # consumed lazily: stop feeding when the part's time runs out
    while len(fed) < batch + a.stream_refills and not (len(fed) >= batch and b.late(a.config_s)):
      fed.append(rng.integers(0, target.config.vocab_size, ctx).tolist())
      yield fed[-1]

  compiling.clear()
  t0 = time.perf_counter()
  gen = generate_stream(target, requests(), batch_size=batch, refill_at=1, max_new_tokens=a.n2, draft=draft,
                        gamma=g, eos_token_id=[], max_prompt_tokens=ctx, simulated_acceptance=(alpha["alpha"],))
  try:
    done = sum(1 for _ in gen)
    s = {k: v for k, v in gen.stats.items() if isinstance(v, (int, float)) or v is None}
    decode_tps = s["new_tokens"] / s["decode_s"]
    out = dict(s, results=done, requests=len(fed), wall_s=time.perf_counter() - t0, decode_tokens_per_s=decode_tps,
               decode_insert_tokens_per_s=s["new_tokens"] / (s["decode_s"] + s["insert_s"]),
               steady_state_tokens_per_s=decode_tps / s["slot_utilization"],
               steady_state_note="decode tokens/s over slot utilization: the drain's idle slots removed")
    if "tok_per_s" in single:
      out.update(single_call_tokens_per_s=single["tok_per_s"],
                 steady_over_single_call=out["steady_state_tokens_per_s"] / single["tok_per_s"])
  except Exception:                                                # noqa: BLE001 (recorded)
    out = {"error": traceback.format_exc()[-1500:]}
  b.put("stream", out)
  b.say("stream", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items() if k != "error"})


def part_tree(b: Bench, m: dict):
  a, target, ctx = b.args, m["target"], m["C"]
  alpha = m["alphas"]["self"]
  draft = drafts.StreamingDraft(*m["ring"])
  ar = b.run(f"8x{ctx} AR", target, None, trees.AR_TREE, None, 8, ctx)
  chains = [b.run(f"8x{ctx} self γ2", target, draft, Tree.chain(2), alpha["alpha"], 8, ctx)]   # (stream's)
  vec = simulate.default_vector(alpha["alpha"])
  tree = trees.sequoia_tree(vec, a.tree_nodes, 8)
  t = b.run(f"8x{ctx} self sequoia{a.tree_nodes}", target, draft, tree, alpha["alpha"], 8, ctx, vector=vec,
            tree_parents=list(tree.parents), expected_tokens=tree.expected_tokens(vec))
  chains.append(b.run(f"8x{ctx} self γ3", target, draft, Tree.chain(3), alpha["alpha"], 8, ctx))
  b.put("speedups", b.ratios(ar, chains + [t]))
  best = max((r for r in chains if "tok_per_s" in r), key=lambda r: r["tok_per_s"], default=None)
  if best and "tok_per_s" in t:
    b.put("tree_over_best_chain", {"best_chain": best["label"], "ratio": t["tok_per_s"] / best["tok_per_s"]})


def part_headline(b: Bench, m: dict):
  target, small, ctx = m["target"], m["small"], m["C"]
  sink, window = m["ring"]
  sd = lambda w: drafts.StreamingDraft(sink, window, weights=w)
  ar = b.run("AR", target, None, trees.AR_TREE, None, 8, ctx, profile=True)
  if fl := b.floor(target.config, 8, ctx, ar):
    b.put("floor", fl)
  rows = [b.run(f"self γ{g} {w or 'bf16'}", target, sd(w), Tree.chain(g), ASSUMED["self"], 8, ctx, profile=True)
          for g, w in ((2, None), (2, "int8"), (3, "int4"))]
  all4 = common.QuantFormDraft(sink, window, weights="int4", form=common.int4_form(keep_int8=()))
  rows += [b.run(f"self γ3 int4 all a{al}", target, all4, Tree.chain(3), al, 8, ctx) for al in (0.8, 0.56)]
  rows += [b.run(f"1B γ3 {w or 'bf16'}", target, drafts.ModelDraft(small, sink, window, weights=w), Tree.chain(3),
                 ASSUMED["1B"], 8, ctx, profile=True) for w in (None, "int8")]
  b.put("speedups", b.ratios(ar, rows))
  tp, bs = (2, 8) if b.args.smoke else (8, 64)
  shard = random_model(tp_shard(target.config, tp), 5, "shard")
  sar = b.run(f"shard b{bs} AR", shard, None, trees.AR_TREE, None, bs, ctx)
  srow = b.run(f"shard b{bs} self γ2", shard, sd(None), Tree.chain(2), ASSUMED["self"], bs, ctx)
  b.put("shard_speedups", b.ratios(sar, [srow]))


def part_batch1(b: Bench, m: dict):
  r = b.run("AR 1x4K", m["target"], None, trees.AR_TREE, None, 1, m["C1"], profile=True)
  if fl := b.floor(m["target"].config, 1, m["C1"], r, prefix=""):
    b.put("batch1", fl)


def part_invariant(b: Bench, m: dict):
  ar = b.run("AR invariant", m["target"], None, trees.AR_TREE, None, 8, m["C"], numerics="invariant")
  sp = b.run("self γ3 invariant", m["target"], drafts.StreamingDraft(*m["ring"]), Tree.chain(3), ASSUMED["self"],
             8, m["C"], numerics="invariant")
  b.put("speedups", b.ratios(ar, [sp]))


TIE = 0.01                                  # a near tie: top-2 log-probabilities within this many nats
# the attention output's weight scales tried, in turn, until the identity part's self-draft accepts >= 0.5
# (random weights flip a greedy choice on any change of context: docs/gpu.md#run-6)
CONTEXT_SCALES = (1 / 16, 1 / 64, 1 / 256, 1 / 1024)


def identity_fixed_shapes():
  """The backend's FixedShapes with the fixed-shape attention kernel: Triton on a GPU (the default there),
  the interpreter where the backend's choice is XLA's tiles (a CPU: --smoke checks the kernel's path)."""
  fixed = backend.fixed_shapes()
  return fixed if fixed.attention != "xla" else dataclasses.replace(fixed, attention="pallas_interpret")


def with_context_scale(model: Model, c: float) -> Model:
  """`model` with every layer's attention output weight (o) times c."""
  scale = lambda w: (w * c).astype(w.dtype)
  layers = tuple(dict(lp, attn=dict(lp["attn"], o=scale(lp["attn"]["o"]))) for lp in model.params["layers"])
  return Model(model.config, dict(model.params, layers=layers), name=f"{model.name} o x{c}")


def part_identity(b: Bench, m: dict):
  """Fixed-shape numerics on the kernel against fast numerics, random 8-layer LLaMA-3.2-1B shape, bf16: greedy
  speculative tokens (self-draft, gamma 3, real acceptance) against plain decoding's, logits unsharpened so
  near ties (top-2 within TIE nats) occur; then the cost at 8 x C of the AR step, a chain-3 round and the
  first call (compile + run) under each numerics."""
  cfg = m["target_cfg"] if b.args.smoke else shapes.model_shape("llama32_1b").replace(num_layers=8)
  model = random_model(cfg, 7, "identity")
  fixed = identity_fixed_shapes()
  b.put("fixed_shapes", dataclasses.asdict(fixed))
  n, p, new = (2, 40, 12) if b.args.smoke else (8, 1024, 64)
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (n, p)).tolist()
  tries = {}
  for c in CONTEXT_SCALES:                          # fast numerics, greedy: the draft's acceptance per scale
    scaled = with_context_scale(model, c)
    sp = generation.generate(scaled, prompts, draft=drafts.StreamingDraft(16, 256), gamma=3, max_new_tokens=new,
                             temperature=0.0, progress=False)
    tries[c] = float(np.mean([r.get("acceptance_rate") or 0.0 for r in sp.row_stats]))
    if tries[c] >= 0.5 or b.late(b.args.config_s * 4):
      break
  model = scaled
  b.put("context_scale", {"chosen": c, "acceptance_fast_greedy": tries})
  b.say("identity", "context scale", c, tries)
  for numerics in ("fast", "invariant"):
    if b.late(b.args.config_s):
      b.put(numerics, {"skipped": "deadline"})
      continue
    kw = dict(max_new_tokens=new, temperature=0.0, numerics=numerics, progress=False, logprobs=True, top_logprobs=2,
              fixed_shapes=fixed if numerics == "invariant" else None)
    ar = generation.generate(model, prompts, **kw)
    sp = generation.generate(model, prompts, draft=drafts.StreamingDraft(16, 256), gamma=3, **kw)
    first = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), None) for u, v in zip(ar.tokens, sp.tokens)]
    margins = [[pos[0][1] - pos[1][1] for pos in row[:(len(row) if f is None else f + 1)] if len(pos) > 1]
               for row, f in zip(ar.top_logprobs, first)]             # plain decoding's, up to a first difference
    flat = [x for row in margins for x in row]
    b.put(numerics, {"rows_identical": sum(f is None for f in first), "rows": n, "first_difference": first,
                     "near_ties_passed": sum(x < TIE for x in flat), "positions_compared": len(flat),
                     "smallest_margin": min(flat, default=None),
                     "acceptance": [r.get("acceptance_rate") for r in sp.row_stats]})
    b.say("identity", numerics, b.res["parts"]["identity"][numerics])
    compiling.clear()
    jax.clear_caches()
    gc.collect()
  runs = {}
  for numerics in ("fast", "invariant"):
    kw = dict(numerics=numerics, fixed=fixed)
    runs[numerics] = (b.run(f"identity AR {numerics}", model, None, trees.AR_TREE, None, 8, m["C"], **kw),
                      b.run(f"identity self γ3 {numerics}", model, drafts.StreamingDraft(*m["ring"]), Tree.chain(3),
                            ASSUMED["self"], 8, m["C"], **kw))
  cost = {}
  for i, what in enumerate(("AR step", "chain-3 round")):
    fast, inv = runs["fast"][i], runs["invariant"][i]
    if "ms_per_loop_round" in fast and "ms_per_loop_round" in inv:
      cost[what] = {"fast_ms": fast["ms_per_loop_round"], "invariant_ms": inv["ms_per_loop_round"],
                    "invariant_over_fast": inv["ms_per_loop_round"] / fast["ms_per_loop_round"],
                    "first_call_s": {"fast": fast["first_call_s"], "invariant": inv["first_call_s"]}}
  b.put("cost", cost)
  b.say("identity", "cost", {k: round(v["invariant_over_fast"], 3) for k, v in cost.items()})


USES = {"paper": (), "stream": ("target",), "tree": ("target",), "headline": ("target", "small"),
        "batch1": ("target",), "identity": (), "invariant": ("target",)}   # the full-size models a part reads
PARTS = {"paper": part_paper, "stream": part_stream, "tree": part_tree, "headline": part_headline,
         "batch1": part_batch1, "identity": part_identity, "invariant": part_invariant}


def main(argv=None):
  ap = common.parser(__doc__, smoke="tiny bfloat16 shapes on CPU (checks the harness, measures nothing)")
  ap.add_argument("--parts", default="paper,stream,tree", help="comma-separated, in order; 'all': " + ",".join(PARTS))
  ap.add_argument("--budget", default="", help="PART=SECONDS,...: a part's own budget (defaults: %s)" % BUDGETS)
  ap.add_argument("--deadline-s", type=float, default=1e9, help="no configuration starts after this many seconds")
  ap.add_argument("--config-s", type=float, default=25.0, help="assumed seconds per configuration (deadlines)")
  ap.add_argument("--acceptance", default=str(ACCEPTANCE), help="benchmarks/drafts/acceptance.py's JSON")
  ap.add_argument("--alpha", default="", help="KIND=ALPHA,...: override a draft's simulated acceptance "
                  "(kinds: %s)" % ", ".join(KIND_OF))
  common.flags(ap, n1=16, n2=64, bw_bytes=4 << 30, stream_gamma=2, tree_nodes=16)
  ap.add_argument("--memory-margin", type=float, default=0.03, help="share of device memory left unplanned")
  ap.add_argument("--stream-refills", type=int, default=8, help="requests beyond the batch (fed while time allows)")
  a = common.parse(ap, argv, bw_bytes=1 << 24, config_s=0.0, stream_refills=4, tree_nodes=6)
  parts = list(PARTS) if a.parts == "all" else [p for p in a.parts.split(",") if p]
  budgets = dict(BUDGETS, **{k: float(v) for k, v in (x.split("=") for x in a.budget.split(",") if x)})
  overrides = {k: float(v) for k, v in (x.split("=") for x in a.alpha.split(",") if x)}
  if bad := [p for p in parts if p not in PARTS] + [k for k in list(budgets) + list(overrides)
                                                    if k not in PARTS and k not in KIND_OF]:
    ap.error(f"unknown parts / kinds {bad}")
  b = Bench(a)
  tcfg, dcfg = configs(a.smoke)
  m = {"target_cfg": tcfg, "small_cfg": dcfg, "alphas": load_alphas(a.acceptance, overrides),
       "C": 96 if a.smoke else 32768, "C100K": 160 if a.smoke else 100_000, "C1": 64 if a.smoke else 4096,
       "ring": (4, 32) if a.smoke else (16, 512), "snapkv": (16, 8) if a.smoke else (512, 64)}
  b.res.update(parts_requested=parts, budgets={p: budgets[p] for p in parts}, alphas=m["alphas"],
               acceptance="Bernoulli(alpha) per draft token (simulated; a tree: alpha (1 - alpha)^k per child rank)")
  b.bandwidth()
  for part in parts:
    b.begin(part, budgets[part])
    for name, cfg, seed, shape in (("target", tcfg, 0, "llama31_8b"), ("small", dcfg, 1, "llama32_1b")):
      if name not in USES[part]:                                         # only the models the part reads
        m.pop(name, None)
      elif name not in m:
        gc.collect()
        m[name] = random_model(cfg, seed, shape)
    gc.collect()
    try:
      PARTS[part](b, m)
    except Exception as e:                                      # noqa: BLE001 (recorded, the next part runs)
      b.put("error", traceback.format_exc()[-1500:])
      b.say(part, "error", repr(e)[:300])
  b.save()
  b.say("done in", round(b.elapsed(), 1), "s ->", b.path)
  return b.res


if __name__ == "__main__":
  main()
