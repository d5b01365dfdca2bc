"""Per-row sampling as a row feature: each row's temperature / top-k / top-p / min-p as data in the loop.

Its state is a `sampling.RowSampling` [B] (the request's own settings over the run's), compiled in where the
run's settings ask for per-row sampling (`per_row_sampling`, which a list of requests with their own
settings gets by itself), so one executable serves any mix of greedy and sampled rows. On a round's logits
it applies each row's filter (`sampling.filter_logits_rows`) and marks the greedy rows (temperature 0) as
argmax rows, whose logits it leaves as they are: they decode as greedy decoding would, and speculative
sampling accepts their one-hot p exactly as greedy verification does.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Sequence

import jax.numpy as jnp

from magicdec_jax.options import RequestOptions
from magicdec_jax.row_features.base import Nodes, RowFeature, Run
from magicdec_jax.sampling import (ROW_FIELDS, RowSampling, Sampling, Scores, filter_logits_rows, greedy_rows,
                                   rows_over)


def own_sampling(options: RequestOptions, run: Sampling) -> Sampling:
  """A request's sampling: its own fields over the run's (per_row off)."""
  return run.over(**{name: getattr(options, name) for name in ROW_FIELDS})


@dataclasses.dataclass(frozen=True)
class PerRowSampling(RowFeature):
  """Each row samples with its own settings (RowSampling [B])."""

  name: ClassVar[str] = "sampling"
  fields: ClassVar[tuple[str, ...]] = ROW_FIELDS
  switch: ClassVar[str] = "pass per_row_sampling=True (a list of requests gets it by itself)"

  def enabled(self, settings) -> bool:
    return bool(settings.per_row_sampling)

  def enable(self, settings):
    return settings.replace(per_row_sampling=True)

  def wanted(self, options: RequestOptions, run: Run) -> bool:
    return own_sampling(options, run.sampling) != run.sampling

  def fill(self, options: Sequence[RequestOptions], run: Run) -> RowSampling:
    return RowSampling.of([own_sampling(o, run.sampling) for o in options])

  def logits(self, state: RowSampling, scores: Scores, nodes: Nodes, sampling: Sampling) -> Scores:
    greedy = greedy_rows(state)
    keep = rows_over(greedy, scores.x.shape[:-1])[..., None]
    x = jnp.where(keep, scores.x.astype(jnp.float32), filter_logits_rows(scores.x, state))
    return Scores(x, greedy if scores.argmax is None else scores.argmax | greedy)
