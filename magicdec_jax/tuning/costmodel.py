"""Roofline cost model for target decode, verification and draft steps (MagicDec's analysis).

A decode step reads every weight once plus the KV cache of every row, and does 2 FLOPs per weight per token plus
attention. At long context and large batch the KV read dominates, and a draft with a fixed KV budget (StreamingLLM
self-speculation, a small draft model, SnapKV) removes it from the draft cost, so speculation *gains* with batch
past a critical context length (S_inflection). Everything here is host-side float arithmetic.

step time = max(bytes / bandwidth, flops / flop_rate) + per-step overhead   (combine="max", the roofline)
          or bytes / bandwidth + flops / flop_rate + overhead               (combine="sum", no overlap)
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np

from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.dense import copy_bytes_per_param, copy_resident_bytes_per_param
from magicdec_jax.layers.quant import kept_int8_share
from magicdec_jax.tuning import batch_tail
from magicdec_jax.tuning.draft_cost import DraftCost
from magicdec_jax import trees as trees_lib

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1, "int4": 0.5}


def dtype_bytes(dtype: str) -> float:
  if dtype not in _BYTES:
    raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(_BYTES)}")
  return _BYTES[dtype]


@dataclasses.dataclass(frozen=True)
class Hardware:
  """An accelerator as seen by the roofline: peak HBM bandwidth, dense bf16 FLOP rate, memory, fixed step cost."""
  name: str
  hbm_bytes_per_s: float
  flops_per_s: float
  memory_bytes: float
  step_overhead_s: float = 0.0
  combine: str = "max"  # "max" (roofline, memory and compute overlap) or "sum"

  def __post_init__(self):
    if self.combine not in ("max", "sum"):
      raise ValueError(f"combine must be 'max' or 'sum', got {self.combine!r}")
    if self.hbm_bytes_per_s <= 0 or self.flops_per_s <= 0:
      raise ValueError("bandwidth and flop rate must be positive (math.inf allowed)")

  def scaled(self, n: int) -> "Hardware":
    """n devices with ideal tensor parallelism (bandwidth, flops and memory times n)."""
    return dataclasses.replace(self, name=f"{n}x{self.name}", hbm_bytes_per_s=self.hbm_bytes_per_s * n,
                               flops_per_s=self.flops_per_s * n, memory_bytes=self.memory_bytes * n)

  def time(self, nbytes: float, flops: float) -> float:
    tm, tc = nbytes / self.hbm_bytes_per_s, flops / self.flops_per_s
    return (max(tm, tc) if self.combine == "max" else tm + tc) + self.step_overhead_s

  def time_step(self, cfg: ModelConfig, batch: int, kv_context: int, new_tokens: int,
                dtype: str = "bfloat16", weights_dtype: str | None = None) -> float:
    """The roofline's seconds for one step (a narrower weight copy priced at its bytes)."""
    return self.time(step_bytes(cfg, batch, kv_context, new_tokens, dtype, weights_dtype=weights_dtype),
                     step_flops(cfg, batch, kv_context, new_tokens))


# Datasheet peaks (dense bf16, no sparsity). Overhead 0: calibrate() fits a real one.
HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("a100", 2.039e12, 312e12, 80 * 2**30),   # A100-80GB SXM
    "h100": Hardware("h100", 3.35e12, 989e12, 80 * 2**30),    # H100 SXM5 80GB
    "h200": Hardware("h200", 4.8e12, 989e12, 141e9),          # H200 SXM 141GB
}


# ---- model byte / flop counts -------------------------------------------------------------------------------

def _layer_matrices(cfg: ModelConfig) -> dict[str, int]:
  """One layer's matmul weight elements by parameter name (layers/quant.CONTRACTED's names)."""
  d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
  q, kv = d * cfg.num_heads * hd, d * cfg.num_kv_heads * hd
  return {"q": q, "k": kv, "v": kv, "o": q, "gate": d * f, "up": d * f, "down": f * d}


def _layer_params(cfg: ModelConfig) -> int:
  return sum(_layer_matrices(cfg).values()) + 2 * cfg.hidden_size  # + two RMSNorm scales


def matmul_params(cfg: ModelConfig) -> int:
  """Weights used in matmuls per token: all layers + the LM head (the input embedding is only gathered)."""
  return cfg.num_layers * _layer_params(cfg) + cfg.vocab_size * cfg.hidden_size


def matrix_elements(cfg: ModelConfig) -> dict[str, int]:
  """Matmul weight elements by parameter name (layers/quant.CONTRACTED's names; the LM head as "embed" when
  tied): what a quantized copy's mixed bytes are averaged over."""
  return {**{name: cfg.num_layers * n for name, n in _layer_matrices(cfg).items()},
          ("embed" if cfg.tie_embeddings else "lm_head"): cfg.vocab_size * cfg.hidden_size}


def copy_bytes(cfg: ModelConfig, kind: str) -> float:
  """Bytes per matmul weight element of a `kind` copy of cfg's weights (an "int4" copy's int8 matrices
  included: layers/quant.QuantForm.keep_int8)."""
  return copy_bytes_per_param(kind, kept_int8_share(matrix_elements(cfg), kind))


def copy_resident_bytes(cfg: ModelConfig, kind: str) -> float:
  """Bytes per matmul weight element a `kind` copy of cfg's weights occupies while decoding (copy_bytes plus
  what a backend holds beside it: layers/quant.QuantForm.hoisted)."""
  return copy_resident_bytes_per_param(kind, kept_int8_share(matrix_elements(cfg), kind))


def num_params(cfg: ModelConfig) -> int:
  emb = cfg.vocab_size * cfg.hidden_size
  return cfg.num_layers * _layer_params(cfg) + emb * (1 if cfg.tie_embeddings else 2) + cfg.hidden_size


def param_bytes(cfg: ModelConfig, dtype: str = "bfloat16") -> float:
  return num_params(cfg) * dtype_bytes(dtype)


def kv_bytes_per_token(cfg: ModelConfig, dtype: str = "bfloat16") -> float:
  """K and V of one token across all layers."""
  return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes(dtype)


def kv_read_tokens(cfg: ModelConfig, kv: float) -> float:
  """Cached tokens a step reads per layer, averaged over layers: kv in a global layer, min(kv, window) in a
  sliding-window one (its ring holds the window; the ring's few margin slots are left out). A draft passes
  its own kv (sink + window): min(that, window) per layer, so on Gemma 3 its saving is on the global layers
  and on local ones only where its window is narrower than theirs."""
  if not cfg.layer_windows:
    return float(kv)
  return sum(min(kv, w) if w else kv for w in cfg.layer_windows) / cfg.num_layers


def step_bytes(cfg: ModelConfig, batch: int, context: int, new_tokens: int, dtype: str = "bfloat16",
               kv_context: int | None = None, weights_dtype: str | None = None) -> float:
  """HBM bytes of one forward step over `new_tokens` tokens per row, attending to kv_context cached tokens.

  Weights read once (matmul weights, at weights_dtype's bytes when the step reads a narrower or quantized
  copy, scales included; the input embedding contributes only the gathered rows), KV read of batch *
  kv_context tokens (a windowed layer's: min(kv_context, window), kv_read_tokens), KV write of the new
  tokens, float32 logits written.
  """
  kv = kv_read_tokens(cfg, context if kv_context is None else kv_context)
  b = dtype_bytes(dtype) if weights_dtype is None else copy_bytes(cfg, weights_dtype)
  tokens = batch * new_tokens
  weights = matmul_params(cfg) * b + (0 if cfg.tie_embeddings else tokens * cfg.hidden_size * b)
  kv_rw = (batch * kv + tokens) * kv_bytes_per_token(cfg, dtype)
  logits = tokens * cfg.vocab_size * 4
  return float(weights + kv_rw + logits)


def step_flops(cfg: ModelConfig, batch: int, context: int, new_tokens: int, kv_context: int | None = None) -> float:
  """2 FLOPs per matmul weight per token + attention (QK^T and PV: 4 * kv * heads * head_dim per token per layer;
  a windowed layer's kv: min(kv, window))."""
  kv = kv_read_tokens(cfg, context if kv_context is None else kv_context)
  tokens = batch * new_tokens
  attn = 4 * tokens * (kv + new_tokens) * cfg.num_heads * cfg.head_dim * cfg.num_layers
  return float(2 * matmul_params(cfg) * tokens + attn)


@dataclasses.dataclass(frozen=True)
class StepShape:
  """One measured forward step, for calibrate()."""
  cfg: ModelConfig
  batch: int
  context: int
  new_tokens: int = 1
  dtype: str = "bfloat16"
  kv_context: int | None = None

  @property
  def bytes(self) -> float:
    return step_bytes(self.cfg, self.batch, self.context, self.new_tokens, self.dtype, self.kv_context)

  @property
  def flops(self) -> float:
    return step_flops(self.cfg, self.batch, self.context, self.new_tokens, self.kv_context)


def step_time(cfg: ModelConfig, hw: Hardware, batch: int, context: int, new_tokens: int,
              dtype: str = "bfloat16", kv_context: int | None = None, weights_dtype: str | None = None) -> float:
  """Seconds for one step as `hw` prices it: a Hardware by the roofline of step_bytes / step_flops plus its
  step_overhead_s, a stepfit.FittedHardware (a measured profile, see magicdec_jax/measure/calibrate.py) by its fitted
  linear model. weights_dtype: the step runs on a narrower copy of the weights."""
  return hw.time_step(cfg, batch, context if kv_context is None else kv_context, new_tokens, dtype,
                      weights_dtype)


def t_ar(cfg: ModelConfig, hw: Hardware, b: int, n: int, dtype: str = "bfloat16") -> float:
  """One autoregressive decode step of the target (1 token per row, context n)."""
  return step_time(cfg, hw, b, n, 1, dtype)


def t_verify(cfg: ModelConfig, hw: Hardware, b: int, n: int, num_tokens: int, dtype: str = "bfloat16") -> float:
  """Target verification of num_tokens tokens per row (gamma + 1 for a chain, tree.num_nodes for a tree)."""
  return step_time(cfg, hw, b, n, num_tokens, dtype)


# ---- drafts ------------------------------------------------------------------------------------------------

def t_draft(cfg: ModelConfig, hw: Hardware, draft: DraftCost, b: int, n: int, num_tokens: int = 1,
            dtype: str = "bfloat16") -> float:
  """One draft step feeding num_tokens tokens per row (1 for a chain, a level's expanding nodes for a tree):
  a step of the draft's network against its own KV (draft.kv_tokens(n)), its weights at the copy's bytes
  (a profile's fit for that copy where calibrate timed one); zero where it runs no network."""
  if not draft.runs_network:
    return 0.0
  return step_time(draft.network_config(cfg), hw, b, n, num_tokens, dtype, kv_context=draft.kv_tokens(n),
                   weights_dtype=draft.weights_dtype)


DEFAULT_TREE_SIZES = (2, 4, 8, 16, 32, 64, 128)


# ---- speedup -----------------------------------------------------------------------------------------------

def expected_tokens_chain(alpha: float, gamma: int) -> float:
  """Omega(gamma, alpha) = (1 - alpha^(gamma+1)) / (1 - alpha): tokens per verify step of a gamma chain."""
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if alpha == 1:
    return float(gamma + 1)
  return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def chain_tokens_per_round(alpha: float, gamma: int, batch: int = 1, new_tokens: int | None = None) -> float:
  """Tokens a row gains per round of a gamma chain: its mean accepted length (a steady state, slots
  refilled), or for a fixed batch of `batch` rows generating new_tokens each, new_tokens / E[the slowest
  row's rounds] (batch_tail)."""
  if new_tokens is None:
    return expected_tokens_chain(alpha, gamma)
  return batch_tail.tokens_per_round(alpha, gamma, new_tokens, batch)


def predicted_speedup(cfg: ModelConfig, hw: Hardware, draft: DraftCost, batch: int, context: int, *,
                      gamma: int | None = None, alpha: float | None = None,
                      tree: trees_lib.Tree | None = None, acceptance_vector: Sequence[float] | None = None,
                      dtype: str = "bfloat16", new_tokens: int | None = None) -> float:
  """E[tokens/step] * T_AR / (draft time + T_verify) for a chain (gamma, alpha) or a tree (tree, vector).

  A chain is drafted in gamma one-token steps and verified as gamma + 1 tokens; a tree in max_depth steps, step d
  feeding the level-d nodes that have children, and verified as num_nodes tokens. new_tokens (a chain): a
  fixed batch generating that many tokens per row runs until its slowest row is done (batch_tail), so
  E[tokens/step] becomes new_tokens / E[the slowest row's rounds]; None prices a steady state (slots refilled).
  """
  if tree is None:
    if gamma is None or alpha is None:
      raise ValueError("give (gamma, alpha) for a chain or (tree, acceptance_vector) for a tree")
    e, widths, n_verify = chain_tokens_per_round(alpha, gamma, batch, new_tokens), [1] * gamma, gamma + 1
  else:
    if new_tokens is not None:
      raise ValueError("new_tokens prices a chain's fixed-batch tail; a tree is priced without it")
    if acceptance_vector is None:
      raise ValueError("a tree needs acceptance_vector")
    e, widths, n_verify = tree.expected_tokens(acceptance_vector), tree.expanding_per_level, tree.num_nodes
  t = sum(t_draft(cfg, hw, draft, batch, context, int(w), dtype) for w in widths)
  t += t_verify(cfg, hw, batch, context, n_verify, dtype)
  return e * t_ar(cfg, hw, batch, context, dtype) / t


def gamma_speedups(cfg: ModelConfig, hw: Hardware, draft: DraftCost, batch: int, context: int, alpha: float | None,
                   max_gamma: int = 8, dtype: str = "bfloat16", acceptance_vector: Sequence[float] | None = None,
                   new_tokens: int | None = None) -> list[tuple[int, float]]:
  """[(gamma, predicted speedup)] for gamma 1..max_gamma (gamma_table on this model's step times)."""
  return gamma_table(
      t_ar(cfg, hw, batch, context, dtype),
      lambda w: t_draft(cfg, hw, draft, batch, context, w, dtype),
      lambda n: t_verify(cfg, hw, batch, context, n, dtype),
      alpha=alpha if acceptance_vector is None else None, acceptance_vector=acceptance_vector,
      max_gamma=max_gamma, batch=batch, new_tokens=new_tokens)


def choose_gamma(cfg: ModelConfig, hw: Hardware, draft: DraftCost, batch: int, context: int, alpha: float,
                 max_gamma: int = 8, dtype: str = "bfloat16",
                 acceptance_vector: Sequence[float] | None = None, tie: float = 0.0,
                 new_tokens: int | None = None) -> tuple[int, float]:
  """(best gamma in 1..max_gamma, its predicted speedup); ties go to the smaller gamma. With an acceptance
  vector the chain's expected tokens come from it (a chain node's one child is rank 0: p[0] per position).
  tie: the smallest gamma predicted within this fraction of the best counts as the best. new_tokens: price
  a fixed batch's tail (predicted_speedup)."""
  return within_tie(gamma_speedups(cfg, hw, draft, batch, context, alpha, max_gamma, dtype, acceptance_vector,
                                   new_tokens), tie)[0]


def gamma_table(t_ar_s: float, t_draft, t_verify_fn, *, alpha: float | None = None,
                acceptance_vector: Sequence[float] | None = None, max_gamma: int = 8, batch: int = 1,
                new_tokens: int | None = None) -> list[tuple[int, float]]:
  """[(gamma, predicted speedup)] for gamma 1..max_gamma on any step-time table: t_draft(width) /
  t_verify_fn(tokens) seconds (callables). speedup(gamma) = E[tokens | gamma] * t_ar / (gamma * t_draft(1) +
  t_verify(gamma + 1)); new_tokens: E[tokens | gamma] is that of a fixed batch of `batch` rows generating
  new_tokens each (batch_tail: its slowest row sets the pace)."""
  if (alpha is None) == (acceptance_vector is None):
    raise ValueError("give alpha or acceptance_vector")
  a = alpha if acceptance_vector is None else acceptance_vector[0]
  return [(g, chain_tokens_per_round(a, g, batch, new_tokens) * t_ar_s / (g * t_draft(1) + t_verify_fn(g + 1)))
          for g in range(1, max_gamma + 1)]


def within_tie(table: Sequence[tuple[int, float]], tie: float) -> list[tuple[int, float]]:
  """The entries of a (gamma ascending) speedup table predicted within `tie` (a fraction) of the best, in
  table order: the first is the chooser's pick (the smallest gamma that close to the best)."""
  if not 0 <= tie < 1:
    raise ValueError(f"tie must be in [0, 1), got {tie}")
  best = max(s for _, s in table)
  return [(g, s) for g, s in table if s >= best * (1 - tie) - 1e-12 * abs(best)]


def choose_gamma_table(t_ar_s: float, t_draft, t_verify_fn, *, alpha: float | None = None,
                       acceptance_vector: Sequence[float] | None = None, max_gamma: int = 8,
                       tie: float = 0.0, batch: int = 1, new_tokens: int | None = None) -> tuple[int, float]:
  """The chain chooser on any step-time table (gamma_table): the smallest gamma predicted within `tie` (a
  fraction) of the best predicted speedup, and its speedup."""
  return within_tie(gamma_table(t_ar_s, t_draft, t_verify_fn, alpha=alpha, acceptance_vector=acceptance_vector,
                                max_gamma=max_gamma, batch=batch, new_tokens=new_tokens), tie)[0]


def choose_tree(cfg: ModelConfig, hw: Hardware, draft: DraftCost, batch: int, context: int,
                acceptance_vector: Sequence[float], sizes: Sequence[int] = DEFAULT_TREE_SIZES,
                max_depth: int = 12, dtype: str = "bfloat16", min_depth: int = 0) -> tuple[trees_lib.Tree, dict]:
  """Hardware-aware Sequoia tree for (batch, context) of depth min_depth..max_depth; info gains 'speedup'
  (vs. autoregressive)."""
  tree, info = trees_lib.hardware_aware_tree(
      acceptance_vector, sizes, max_depth,
      t_draft=lambda w: t_draft(cfg, hw, draft, batch, context, w, dtype),
      t_verify=lambda n: t_verify(cfg, hw, batch, context, n, dtype), min_depth=min_depth)
  info = dict(info, speedup=t_ar(cfg, hw, batch, context, dtype) / info["time_per_token"])
  return tree, info


# ---- S_inflection ------------------------------------------------------------------------------------------

def batch_gain(cfg: ModelConfig, hw: Hardware, draft: DraftCost, gamma: int, alpha: float, context: int,
               batch_lo: int = 64, batch_hi: int = 128, dtype: str = "bfloat16") -> float:
  """S(batch_hi, n) - S(batch_lo, n): positive iff the (fixed-gamma) speedup grows with batch at this context."""
  s = lambda b: predicted_speedup(cfg, hw, draft, b, context, gamma=gamma, alpha=alpha, dtype=dtype)
  return s(batch_hi) - s(batch_lo)


def s_inflection(cfg: ModelConfig, hw: Hardware, draft: DraftCost, gamma: int, alpha: float, *,
                 batch_lo: int = 64, batch_hi: int = 128, n_min: int = 1, n_max: int = 1 << 20,
                 dtype: str = "bfloat16") -> int | None:
  """Smallest context n in [n_min, n_max] with batch_gain(n) > 0, i.e. where the speedup of a gamma chain is
  larger at batch_hi than at batch_lo ("grows with batch for large batches"). None if there is none.

  Found by scanning a log grid (64 points per octave) for the first positive point and bisecting on integers
  between it and the previous grid point; assumes the sign of batch_gain changes at most once (checked in tests).
  """
  gain = lambda n: batch_gain(cfg, hw, draft, gamma, alpha, n, batch_lo, batch_hi, dtype)
  grid = np.unique(np.round(np.geomspace(n_min, n_max, int(64 * math.log2(max(n_max / n_min, 2))) + 2)))
  grid = [int(n) for n in grid]
  prev = None
  for n in grid:
    if gain(n) > 0:
      if prev is None:
        return n
      lo, hi = prev, n  # gain(lo) <= 0 < gain(hi)
      while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if gain(mid) > 0 else (mid, hi)
      return hi
    prev = n
  return None


# ---- plans -------------------------------------------------------------------------------------------------

def plan_table(cfg: ModelConfig, hw: Hardware, batches: Sequence[int], contexts: Sequence[int],
               draft: DraftCost, alpha: float | None = None, acceptance_vector: Sequence[float] | None = None, *,
               max_gamma: int = 8, tree_sizes: Sequence[int] = DEFAULT_TREE_SIZES, tree_max_depth: int = 12,
               dtype: str = "bfloat16") -> list[dict]:
  """One row per (batch, context): best chain gamma and its speedup, draft / verify cost relative to T_AR, the
  best hardware-aware tree (from acceptance_vector, or [alpha] if none: then the tree is a chain), and whether
  weights + KV fit in hw.memory_bytes (None where the hardware states no memory: a profile calibrated on a
  device that reports none, as CPUs). alpha defaults to acceptance_vector[0]."""
  if alpha is None and acceptance_vector is None:
    raise ValueError("give alpha or acceptance_vector")
  alpha = float(acceptance_vector[0]) if alpha is None else float(alpha)
  vec = tuple(acceptance_vector) if acceptance_vector is not None else (alpha,)
  rows = []
  for n in contexts:
    for b in batches:
      g, s = choose_gamma(cfg, hw, draft, b, n, alpha, max_gamma, dtype)
      tar = t_ar(cfg, hw, b, n, dtype)
      tree, info = choose_tree(cfg, hw, draft, b, n, vec, tree_sizes, tree_max_depth, dtype)
      mem = param_bytes(cfg, dtype) + b * kv_read_tokens(cfg, n + tree.num_nodes) * kv_bytes_per_token(cfg, dtype)
      if draft.config is not None:                  # a network of its own: its weights too
        mem += param_bytes(draft.config, dtype)
      mem += b * draft.kv_tokens(n) * kv_bytes_per_token(draft.network_config(cfg), dtype)
      rows.append(dict(
          batch=b, context=n, gamma=g, speedup=s,
          draft_ratio=t_draft(cfg, hw, draft, b, n, 1, dtype) / tar,
          verify_ratio=t_verify(cfg, hw, b, n, g + 1, dtype) / tar,
          t_ar_ms=tar * 1e3, tree_size=tree.num_nodes, tree_depth=tree.max_depth,
          tree_speedup=info["speedup"], fits=None if math.isinf(hw.memory_bytes) else bool(mem <= hw.memory_bytes)))
  return rows


def format_plan(rows: Sequence[dict], compare: Sequence[dict] | None = None) -> str:
  """Fixed-width text table of plan_table rows; `compare` (same grid, e.g. a datasheet's rows) adds its gamma,
  speedup and T_AR beside each row."""
  head = f"{'batch':>6} {'context':>8} {'gamma':>5} {'speedup':>8} {'draft/AR':>9} {'verify/AR':>10} " \
         f"{'T_AR ms':>8} {'tree':>8} {'tree_sp':>8} {'fits':>5}"
  if compare is not None:
    head += f" {'ds_gamma':>8} {'ds_speedup':>10} {'ds_T_AR ms':>10}"
  lines = [head]
  for i, r in enumerate(rows):
    line = (f"{r['batch']:>6} {r['context']:>8} {r['gamma']:>5} {r['speedup']:>8.3f} {r['draft_ratio']:>9.3f} "
            f"{r['verify_ratio']:>10.3f} {r['t_ar_ms']:>8.2f} {r['tree_size']:>4}/{r['tree_depth']:<3} "
            f"{r['tree_speedup']:>8.3f} {'?' if r['fits'] is None else str(r['fits']):>5}")
    if compare is not None:
      c = compare[i]
      line += f" {c['gamma']:>8} {c['speedup']:>10.3f} {c['t_ar_ms']:>10.2f}"
    lines.append(line)
  return "\n".join(lines)


# ---- calibration -------------------------------------------------------------------------------------------

def nnls_small(a: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Exact non-negative least squares for a handful of columns: best unconstrained fit over every support set."""
  k = a.shape[1]
  scale = np.linalg.norm(a, axis=0)
  scale[scale == 0] = 1
  an = a / scale
  best, best_x = math.inf, np.zeros(k)
  for r in range(1, k + 1):
    for support in itertools.combinations(range(k), r):
      cols = list(support)
      sol, *_ = np.linalg.lstsq(an[:, cols], y, rcond=None)
      if (sol < 0).any():
        continue
      x = np.zeros(k)
      x[cols] = sol
      res = float(np.sum((an @ x - y) ** 2))
      if res < best - 1e-18:
        best, best_x = res, x
  return best_x / scale


def calibrate(name: str, measurements: Sequence[tuple[StepShape, float]], combine: str = "max",
              memory_bytes: float = math.inf) -> Hardware:
  """Fit effective bandwidth, flop rate and per-step overhead to measured (StepShape, seconds) pairs.

  combine='sum': t = bytes * x + flops * y + c, non-negative least squares in (x = 1/bw, y = 1/rate, c).
  combine='max': t = max(bytes * x, flops * y) + c. Which term wins depends only on the arithmetic intensity
  flops / bytes (compute-bound iff intensity > x / y), so every threshold between sorted intensities gives a
  linear problem; the fit with the smallest squared error of the max model wins. A zero coefficient becomes an
  infinite rate. Relative errors are minimized (rows weighted by 1 / t) so short steps count as much as long ones.
  """
  shapes = [m[0] for m in measurements]
  t = np.asarray([m[1] for m in measurements], np.float64)
  if len(t) < 3:
    raise ValueError("need at least 3 measurements")
  nb = np.asarray([s.bytes for s in shapes])
  nf = np.asarray([s.flops for s in shapes])
  w = 1 / t
  ones = np.ones_like(t)

  def pack(x):
    bw = 1 / x[0] if x[0] > 0 else math.inf
    fl = 1 / x[1] if x[1] > 0 else math.inf
    return Hardware(name, bw, fl, memory_bytes, float(x[2]), combine)

  if combine == "sum":
    a = np.stack([nb, nf, ones], 1)
    return pack(nnls_small(a * w[:, None], t * w))
  if combine != "max":
    raise ValueError(f"combine must be 'max' or 'sum', got {combine!r}")
  order = np.argsort(nf / nb)
  best, best_x = math.inf, None
  for cut in range(len(t) + 1):  # rows order[:cut] memory-bound, the rest compute-bound
    mem = np.zeros(len(t), bool)
    mem[order[:cut]] = True
    a = np.stack([np.where(mem, nb, 0.0), np.where(mem, 0.0, nf), ones], 1)
    x = nnls_small(a * w[:, None], t * w)
    pred = np.maximum(nb * x[0], nf * x[1]) + x[2]
    err = float(np.sum(((pred - t) * w) ** 2))
    if err < best:
      best, best_x = err, x
  return pack(best_x)
