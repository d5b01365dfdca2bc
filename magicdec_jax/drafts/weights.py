"""A draft's copy of its network's weights: `weights=None | "bfloat16" | "int8" | "int4"` (layers/quant.py).

StreamingDraft and SnapKVDraft draft with the target's weights or such a copy of them (`TargetWeightCopy`
gives both the same validation, params and XLA options); ModelDraft with its own model's or a copy;
FeatureDraft with a copy of its head's matrices and of the target's embedding / LM head it reads
(drafts/feature.draft_copy). The copy is made once per params tree and kept (`copy_of`, `cached_copy`); the
target always verifies with its own weights.
"""
from __future__ import annotations

import jax.numpy as jnp

from magicdec_jax.layers import quant
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.tuning.draft_cost import WEIGHT_COPIES

DRAFT_WEIGHTS = (None,) + WEIGHT_COPIES


def check_weights(weights, owner: str) -> None:
  """ValueError unless `weights` is one of DRAFT_WEIGHTS (a draft's weight copy)."""
  if weights not in DRAFT_WEIGHTS:
    raise ValueError(f"{owner} weights must be one of {DRAFT_WEIGHTS}, got {weights!r}")


def check_narrower(weights, dtype: str, owner: str) -> None:
  """ValueError where a float weight copy would be no narrower than the weights it copies."""
  if weights == "bfloat16" and jnp.dtype(weights).itemsize >= jnp.dtype(dtype).itemsize:
    raise ValueError(f"{owner} weights={weights!r} is not narrower than the model's {dtype}: draft with its "
                     f"own weights (weights=None)")


_NARROW = {}    # (ids of the source trees..., kind) -> (those trees..., their copy): made once per model


def cached_copy(sources: tuple, kind: str, make):
  """make()'s weight copy of the `sources` trees in `kind`, made once per (sources, kind) and kept (the
  last two such copies)."""
  key = (*map(id, sources), kind)
  hit = _NARROW.get(key)
  if hit is None or any(a is not b for a, b in zip(hit[:-1], sources)):
    if len(_NARROW) >= 2:
      _NARROW.clear()
    hit = _NARROW[key] = (*sources, make())
  return hit[-1]


def drop_copies() -> None:
  """Forget every cached copy (a long measurement frees their memory between configurations)."""
  _NARROW.clear()


def copy_of(params, kind: str):
  """`params` cast (or quantized) to `kind` for a draft, made once per params tree."""
  return cached_copy((params,), kind, lambda: weight_copy(params, kind))


class TargetWeightCopy:
  """For a draft dataclass with a `weights` field that drafts with the target's own weights or a copy."""

  weight_copies = True

  def check_compatible(self, target) -> None:
    check_narrower(self.weights, target.config.dtype, type(self).__name__)

  def params(self, target):
    return None if self.weights is None else copy_of(target.params, self.weights)

  def xla_options(self) -> dict:
    return quant.xla_options(self.weights)
