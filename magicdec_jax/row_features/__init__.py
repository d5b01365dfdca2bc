"""Row features: per-request behaviour of the compiled loop, one interface (base.py), one module per feature.

  Constraints      structured output: each row's JSON schema / regex / choices as a token automaton
                   masking what the round draws from (constraint.py)
  PerRowSampling   each row's temperature / top-k / top-p / min-p as data (sampling.py)

REGISTRY is ordered: the order in which the features transform a round's logits (a mask before the
sampling filters: per-row sampling stays last). A new feature: a module here with a subclass of
`base.RowFeature`, and its line in REGISTRY. The helpers below are what the loop, the slots and the
stream ask of the registered set.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax

from magicdec_jax.options import FEATURE_FIELDS, OptionError, RequestOptions
from magicdec_jax.row_features.base import Nodes, RowFeature, Run
from magicdec_jax.row_features.constraint import Constraints
from magicdec_jax.row_features.sampling import PerRowSampling, own_sampling
from magicdec_jax.sampling import Sampling, Scores, with_static_filter

REGISTRY: dict[str, RowFeature] = {f.name: f for f in (Constraints(), PerRowSampling())}


def enabled(settings) -> tuple[str, ...]:
  """The names of the features `settings` (a DecodeSettings) compile in, in registry order."""
  return tuple(name for name, f in REGISTRY.items() if f.enabled(settings))


def check_served(options: RequestOptions, run: Run | None = None) -> None:
  """OptionError naming the first field a request sets that no registered feature serves; with the run,
  also each feature's own `check` of the options it is wanted for (e.g. a schema that cannot compile)."""
  served = {field for f in REGISTRY.values() for field in f.fields}
  for field, kind in FEATURE_FIELDS.items():
    if getattr(options, field) is not None and field not in served:
      raise OptionError(field, getattr(options, field), "",
                        message=f"{kind} is not available yet (no registered row feature serves it)")
  if run is not None:
    for f in REGISTRY.values():
      if f.wanted(options, run):
        f.check(options, run)


def shapes(names: Sequence[str], options: Sequence[RequestOptions], run: Run) -> dict[str, Any]:
  """run.shapes grown, entry by entry, to what features `names` need for these requests (the buckets a
  state holding them is built with)."""
  out = dict(run.shapes)
  for name in names:
    need = REGISTRY[name].shape(options, run)
    if need is not None:
      have = out.get(name)
      out[name] = tuple(need) if have is None else tuple(max(a, b) for a, b in zip(have, need))
  return out


def finish_reason(states: dict[str, Any], row: int) -> str | None:
  """The first finish reason a finished row's feature states (on the host) give; None: none does."""
  for f, state in active(states):
    reason = f.finish_reason(state, row)
    if reason is not None:
      return reason
  return None


def wanted(options: Sequence[RequestOptions], run: Run) -> tuple[str, ...]:
  """The names of the features some of these requests need, in registry order."""
  return tuple(name for name, f in REGISTRY.items() if any(f.wanted(o, run) for o in options))


def fill(names: Sequence[str], options: Sequence[RequestOptions], run: Run) -> dict[str, Any]:
  """The states [n, ...] of features `names` for n requests."""
  return {name: REGISTRY[name].fill(options, run) for name in names}


def active(states: dict[str, Any]) -> list[tuple[RowFeature, Any]]:
  """(feature, its state) for the features a loop state holds, in registry order."""
  unknown = sorted(set(states) - set(REGISTRY))
  if unknown:
    raise ValueError(f"loop state holds unregistered row features {unknown}")
  return [(f, states[name]) for name, f in REGISTRY.items() if name in states]


def scores_at(states: dict[str, Any], sampling: Sampling, logits: jax.Array, nodes: Nodes) -> Scores:
  """The scores the round draws from at `nodes`: the raw logits [B, E, V] through every active feature
  in order, then the static sampling's filter."""
  scores = Scores(logits)
  for f, state in active(states):
    scores = f.logits(state, scores, nodes, sampling)
  return with_static_filter(scores, sampling)


def masks(states: dict[str, Any]) -> bool:
  """Whether an active feature may rule tokens out (static: from the state's structure)."""
  return any(f.masks for f, _ in active(states))


def end_and_advance(states: dict[str, Any], emitted: jax.Array, count: jax.Array):
  """The round's emitted tokens [B, D+1] with count [B] standing -> (count [B], ended [B] bool or None,
  the new states): each feature may lower the count and end rows (in order), then every feature advances
  over the tokens that stand."""
  ended = None
  for f, state in active(states):
    count, e = f.end(state, emitted, count)
    if e is not None:
      ended = e if ended is None else ended | e
  new = {f.name: f.advance(state, emitted, count) for f, state in active(states)}
  return count, ended, new


__all__ = ["REGISTRY", "Constraints", "Nodes", "PerRowSampling", "RowFeature", "Run", "active", "check_served",
           "end_and_advance", "enabled", "fill", "finish_reason", "masks", "own_sampling", "scores_at", "shapes", "wanted"]
