"""`gamma="auto"` / `tree="auto"`: pick the speculation size for (batch, context) from the cost model.

The hardware is named ("h100", "a100", "h200", "cpu") or detected from the first JAX device; a calibrated
`costmodel.Hardware`, a `stepfit.FittedHardware` or the path of a hardware profile JSON (written by
`run.py --mode=calibrate`, fitted to this machine's measured step times) can be passed instead. The
acceptance rate (chain) or acceptance vector (chain and tree) defaults to the profile's vector if it has
one, else the paper's self-speculation figure and the shipped Sequoia vector; measure your own with
`run.py --mode=profile_acceptance`.
"""
from __future__ import annotations

import json

import jax

from magicdec_jax import trees
from magicdec_jax.tuning import costmodel, profiles, stepfit
from magicdec_jax.tuning.draft_cost import DraftCost
from magicdec_jax.config import ModelConfig

DEFAULT_ALPHA = 0.8
# Nominal effective figures for a 2-core x86 CPU in float32 (an assumption, not a fit): fit your own with
# `run.py --mode=calibrate` and pass the result as `hardware=`.
CPU = costmodel.Hardware("cpu", hbm_bytes_per_s=8e9, flops_per_s=4e10, memory_bytes=24 * 2**30,
                         step_overhead_s=2e-3, combine="sum")


def detect_hardware(name=None):
  """A Hardware / FittedHardware from a name, a profile path (*.json), an object, or the first device."""
  if isinstance(name, (costmodel.Hardware, stepfit.FittedHardware)):
    return name
  if profiles.is_profile_path(name):
    return profiles.load_profile(str(name))[0]
  if name is None:
    kind = jax.devices()[0].device_kind.lower()
    name = next((k for k in ("h200", "h100", "a100") if k in kind), "cpu")
  if name == "cpu":
    return CPU
  if name not in costmodel.HARDWARE:
    raise ValueError(f"unknown hardware {name!r}; known: cpu, {', '.join(costmodel.HARDWARE)}")
  return costmodel.HARDWARE[name]


def load_acceptance(acceptance):
  """None, a vector, or a JSON path ({'acceptance_vector': [...]} from profile_acceptance, or a hardware
  profile holding one) -> a list of floats or None."""
  if acceptance is None:
    return None
  if isinstance(acceptance, (str, bytes)) or hasattr(acceptance, "__fspath__"):
    try:
      with open(acceptance) as f:
        d = json.load(f)
      acceptance = d["acceptance_vector"] if isinstance(d, dict) else d
    except (OSError, ValueError, KeyError) as e:
      raise ValueError(f"acceptance={acceptance!r}: expected a readable JSON file with an 'acceptance_vector' "
                       f"list ({e})") from None
  try:
    vec = [float(x) for x in acceptance]
  except (TypeError, ValueError):
    raise ValueError(f"acceptance must be a list of probabilities or a JSON file, got {acceptance!r:.80}") from None
  if not vec or any(not 0 <= x <= 1 for x in vec) or sum(vec) > 1 + 1e-6:
    raise ValueError(f"acceptance vector entries must be in [0, 1] and sum to <= 1, got {vec}")
  return vec


def cost_draft(draft) -> DraftCost:
  """The cost model's view of a draft (or its static spec): the plain numbers it gives of one step."""
  return draft.spec.cost()


# "auto" hedges against the cost model's error (a fitted CPU profile's held-out step-time error is ~9%,
# and in-loop rounds cost up to 10% more than their isolated steps): it speculates only where the predicted
# speedup is at least 1 + AUTO_MARGIN, and takes the shortest chain predicted within AUTO_TIE of the best
# (a shorter chain loses less when acceptance or the verify cost is worse than predicted). Measured:
# docs/decisions.md#auto-margin.
AUTO_MARGIN = 0.05
AUTO_TIE = 0.03


def choose(cfg: ModelConfig, spec, batch: int, context: int, *, want_tree: bool, hardware=None,
           alpha: float | None = None, acceptance_vector=None, max_gamma: int = 8,
           allow_autoregressive: bool = False, new_tokens: int | None = None) -> tuple[trees.Tree, dict]:
  """The chain or tree the cost model predicts fastest; info holds the predicted speedup.

  allow_autoregressive: where even the best chain / tree is not predicted at least AUTO_MARGIN faster
  than plain decoding, return the root-only tree (no speculation) with info["speculate"] = False. A chain
  is the shortest one predicted within AUTO_TIE of the best.

  acceptance_vector (a list or a JSON path) drives both: a chain's expected tokens use its first entry
  per position; alpha (a chain only) overrides it. Without either, a hardware profile's stored vector is
  used, then the defaults. new_tokens: a chain is priced as a fixed batch of `batch` rows generating that
  many tokens each, waiting for its slowest row (batch_tail); None prices a steady state (refilled slots).
  """
  hw = detect_hardware(hardware)
  vec = _vector(hardware, acceptance_vector)
  tree, info = _choose(cfg, hw, spec, batch, context, want_tree, alpha, vec, max_gamma, new_tokens,
                       allow_autoregressive)
  if allow_autoregressive and (not _pays(info.get("best_speedup", info["speedup"])) or tree.max_depth == 0):
    # (the margin asks the best chain; depth 0: no speculation)
    return trees.AR_TREE, dict(info, speculate=False)
  return tree, dict(info, speculate=True)


def _pays(speedup: float) -> bool:
  """Whether "auto" speculates at this predicted speedup (rather than decode autoregressively)."""
  return speedup >= 1 + AUTO_MARGIN


def chain_band(cfg: ModelConfig, spec, batch: int, context: int, *, hardware=None, alpha: float,
               max_gamma: int, allow_autoregressive: bool = False, new_tokens: int | None = None) -> list[int]:
  """The settings the cost model cannot tell apart from choose's chain at this context, best predicted
  first: the chains of gamma 1..max_gamma predicted within AUTO_TIE of the best one, and plain decoding
  (0) where allow_autoregressive and choose would not speculate (choose's own table and rules)."""
  close = costmodel.within_tie(costmodel.gamma_speedups(cfg, detect_hardware(hardware), cost_draft(spec), batch,
                                                        context, alpha, max_gamma, cfg.dtype,
                                                        new_tokens=new_tokens), AUTO_TIE)
  band = [g for g, _ in sorted(close, key=lambda e: -e[1])]
  if allow_autoregressive and not _pays(max(s for _, s in close)):
    band.append(0)
  return band


def _vector(hardware, acceptance_vector):
  """The acceptance vector `choose` prices with: the given one, else a hardware profile's stored one."""
  vec = load_acceptance(acceptance_vector)
  if vec is None and profiles.is_profile_path(hardware):
    stored = profiles.load_profile(str(hardware))[1].get("acceptance_vector")
    if stored is not None:
      try:
        if not isinstance(stored, list):
          raise ValueError(f"'acceptance_vector' must be a list of probabilities, got {stored!r:.80}")
        vec = load_acceptance(stored)
      except ValueError as e:
        raise ValueError(f"hardware profile {hardware}: {e}") from None
  return vec


def chain_alpha(hardware=None, acceptance_vector=None) -> float:
  """The per-position acceptance `choose` prices a chain with when given no alpha: the first entry of
  the acceptance vector it would use, else DEFAULT_ALPHA."""
  vec = _vector(hardware, acceptance_vector)
  return float(vec[0]) if vec else DEFAULT_ALPHA


def _choose(cfg, hw, spec, batch, context, want_tree, alpha, vec, max_gamma, new_tokens, allow_autoregressive):
  draft = cost_draft(spec)
  if want_tree:           # (without plain decoding allowed, the root-only tree is not a choice either)
    # (a node has at most one child per token: a vector longer than the vocabulary would build wider ones)
    vec = tuple(vec or trees.DEFAULT_ACCEPTANCE_VECTOR)[:cfg.vocab_size]
    tree, info = costmodel.choose_tree(cfg, hw, draft, batch, context, vec, dtype=cfg.dtype,
                                       min_depth=0 if allow_autoregressive else 1)
    return tree, dict(info, hardware=hw.name)
  by_vector = alpha is None and vec is not None
  a = vec[0] if by_vector else DEFAULT_ALPHA if alpha is None else alpha
  table = costmodel.gamma_speedups(cfg, hw, draft, batch, context, a, max_gamma, cfg.dtype,
                                   vec if by_vector else None, new_tokens)
  (gamma, speedup), best = costmodel.within_tie(table, AUTO_TIE)[0], max(s for _, s in table)
  return trees.Tree.chain(gamma), {"gamma": gamma, "speedup": speedup, "best_speedup": best, "alpha": a,
                                   "hardware": hw.name}
