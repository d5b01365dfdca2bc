"""A linear step-time model fitted to measured forward steps: the fit of a hardware profile.

Where the roofline (costmodel.Hardware) prices a step from datasheet bandwidth and FLOP rate, a measured
device is priced by t = coef . step_features(...): non-negative coefficients on terms that mean something on
both a bandwidth-bound GPU and a compute-bound CPU (FEATURE_DOC). measure/calibrate.py measures the steps and
stores the fit in a profile; every cost-model function taking a `hw` accepts a FittedHardware (its time_step).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from magicdec_jax.tuning import costmodel
from magicdec_jax.config import ModelConfig

FEATURES = ("const", "layers", "weight_bytes", "weight_tiles", "matmul_flops", "activations", "kv_bytes",
            "attn_flops")
FEATURE_DOC = {
    "const": "1 per step (dispatch, launch, host sync)",
    "layers": "num_layers (per-layer fixed cost: kernel launches, the scan's slicing)",
    "weight_bytes": "matmul weight bytes, read once per step (bandwidth-bound GPU decode)",
    "weight_tiles": "weight bytes * (ceil(batch * tokens / tile) - 1): extra weight passes once the token "
                    "count exceeds a matmul tile (GPU)",
    "matmul_flops": "2 * matmul weights * batch * tokens (compute-bound CPU, large-batch verify)",
    "activations": "batch * tokens * hidden * layers (norms, RoPE, cache writes)",
    "kv_bytes": "batch * kv_context * KV bytes per token, all layers (the cache read; min(kv_context, window) "
                "in a windowed layer)",
    "attn_flops": "4 * batch * tokens * (kv_context + tokens) * heads * head_dim * layers",
}

MIN_STEPS = 3      # measured steps a fit needs at least


def step_features(cfg: ModelConfig, batch: int, kv_context: int, new_tokens: int, dtype: str = "bfloat16",
                  tile: int = 128) -> np.ndarray:
  """The FEATURES of one forward step over new_tokens tokens per row against kv_context cached ones."""
  b = costmodel.dtype_bytes(dtype)
  tokens = batch * new_tokens
  kv_context = costmodel.kv_read_tokens(cfg, kv_context)          # a windowed layer reads its window
  wbytes = costmodel.matmul_params(cfg) * b
  return np.asarray([
      1.0, cfg.num_layers, wbytes, wbytes * (math.ceil(tokens / tile) - 1), 2.0 * costmodel.matmul_params(cfg) * tokens,
      float(tokens) * cfg.hidden_size * cfg.num_layers, batch * kv_context * costmodel.kv_bytes_per_token(cfg, dtype),
      4.0 * tokens * (kv_context + new_tokens) * cfg.num_heads * cfg.head_dim * cfg.num_layers], np.float64)


@dataclasses.dataclass(frozen=True)
class FittedHardware:
  """A device as seen through measured step times: t = coef . step_features(...) (+ nothing else).

  Fitted by fit_step_model from (config, batch, kv_context, tokens, seconds) rows; every cost-model function
  taking a `hw` accepts one (costmodel.step_time calls its time_step). memory_bytes for the plan's fit check.
  """
  name: str
  coef: tuple[float, ...]
  memory_bytes: float = math.inf
  tile: int = 128
  features: tuple[str, ...] = FEATURES
  # (weights dtype, coefficients) fitted to steps run on a narrower copy of the weights (a StreamingDraft
  # with weights="bfloat16"): on a CPU such a step is not the half-bytes step the main fit would price
  narrow: tuple[tuple[str, tuple[float, ...]], ...] = ()

  def __post_init__(self):
    if len(self.coef) != len(self.features) or tuple(self.features) != FEATURES:
      raise ValueError(f"a fitted profile needs one coefficient per feature {FEATURES}, got {self.features} "
                       f"/ {len(self.coef)} coefficients")
    for dtype, coef in [("", self.coef)] + [(d, c) for d, c in self.narrow]:
      if len(coef) != len(FEATURES) or any(c < 0 or not math.isfinite(c) for c in coef):
        raise ValueError(f"fitted coefficients{' for ' + dtype + ' weights' if dtype else ''} must be "
                         f"{len(FEATURES)} finite values >= 0, got {coef}")
      if not any(coef):
        raise ValueError(f"fitted coefficients{' for ' + dtype + ' weights' if dtype else ''} are all 0: "
                         "every step would take no time")

  def time_step(self, cfg: ModelConfig, batch: int, kv_context: int, new_tokens: int,
                dtype: str = "bfloat16", weights_dtype: str | None = None) -> float:
    """Seconds for the step; `weights_dtype` names a narrower weight copy (a fitted one if this profile
    timed it, else the main fit at that dtype's bytes)."""
    coef = dict(self.narrow).get(weights_dtype, self.coef)
    return float(np.dot(coef, step_features(cfg, batch, kv_context, new_tokens, weights_dtype or dtype,
                                            self.tile)))

  def to_dict(self) -> dict:
    d = {"name": self.name, "features": list(self.features), "coef": list(self.coef), "tile": self.tile,
         "memory_bytes": None if math.isinf(self.memory_bytes) else self.memory_bytes}
    if self.narrow:
      d["narrow"] = {dtype: list(coef) for dtype, coef in self.narrow}
    return d

  @classmethod
  def from_dict(cls, d: dict) -> "FittedHardware":
    mem = d.get("memory_bytes")
    narrow = tuple((str(k), tuple(float(c) for c in v)) for k, v in (d.get("narrow") or {}).items())
    return cls(str(d["name"]), tuple(float(c) for c in d["coef"]), math.inf if mem is None else float(mem),
               int(d.get("tile", 128)), tuple(d.get("features", FEATURES)), narrow)


@dataclasses.dataclass(frozen=True)
class StepRow:
  """One measured forward step for fit_step_model: the model it ran, its shape, its seconds."""
  cfg: ModelConfig
  batch: int
  kv_context: int
  new_tokens: int
  seconds: float
  dtype: str = "bfloat16"
  role: str = ""
  weights_dtype: str | None = None   # run on a narrower copy of the weights (fitted apart: FittedHardware.narrow)

  def features(self, tile: int = 128) -> np.ndarray:
    return step_features(self.cfg, self.batch, self.kv_context, self.new_tokens, self.weights_dtype or self.dtype,
                         tile)


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
  from scipy.optimize import nnls   # imported where used: scipy is slow to import, and only a fit needs it
  scale = np.linalg.norm(a, axis=0)
  scale[scale == 0] = 1
  x, _ = nnls(a / scale, y, maxiter=50 * a.shape[1])
  return x / scale


def fit_step_model(name: str, rows: Sequence[StepRow], *, tile: int = 128, memory_bytes: float = math.inf,
                   features: Sequence[str] | None = None) -> FittedHardware:
  """Non-negative least squares of seconds on FEATURES, relative error minimized (rows weighted by 1 / t).

  `features` restricts the fit to a subset (the others get coefficient 0), e.g. to drop terms a grid cannot
  separate. Non-negativity keeps every term a cost, so extrapolation never predicts a step getting cheaper
  with more batch, context or tokens.
  """
  if len(rows) < MIN_STEPS:
    raise ValueError(f"need at least {MIN_STEPS} measured steps")
  use = [FEATURES.index(f) for f in (features or FEATURES)]
  a = np.stack([r.features(tile) for r in rows])[:, use]
  t = np.asarray([r.seconds for r in rows], np.float64)
  if (t <= 0).any():
    raise ValueError("measured seconds must be positive")
  w = 1 / t
  x = np.zeros(len(FEATURES))
  x[use] = _nnls(a * w[:, None], t * w)
  return FittedHardware(name, tuple(float(c) for c in x), memory_bytes, tile)


def relative_errors(hw: FittedHardware, rows: Sequence[StepRow]) -> np.ndarray:
  """|predicted - measured| / measured per row."""
  return np.asarray([abs(hw.time_step(r.cfg, r.batch, r.kv_context, r.new_tokens, r.dtype, r.weights_dtype)
                         - r.seconds) / r.seconds for r in rows])
