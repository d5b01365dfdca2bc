"""`DraftCost`: what one draft step costs, as plain numbers the cost model prices without knowing the draft.

Every draft's `DraftSpec.cost()` returns one (drafts/). It lives apart from the pricing (costmodel.py), so a
draft names its cost without importing the cost model, and the cost model prices any draft, a new one
included, with no list of draft kinds: a step of `network_config(target)` against `kv_tokens(context)` cached
tokens per row, its matmul weights read at `weights_dtype`'s bytes, or nothing where it runs no network.
"""
from __future__ import annotations

import dataclasses
import numbers

from magicdec_jax.config import ModelConfig

WEIGHT_COPIES = ("bfloat16", "int8", "int4")    # the weight copies a draft step may read (drafts/weights.py)


@dataclasses.dataclass(frozen=True)
class DraftCost:
  """One draft step as the cost model sees it.

  kv_slots: cached tokens the step reads per row (sink + window, budget + window; a shorter context caps it);
  config: the network it runs (None: the target's own weights and shape);
  weights_dtype: the narrower or quantized copy of that network's matmul weights it reads (None: their own);
  runs_network: False for a draft that runs no network (prompt lookup): its step is priced at zero;
  label: a name for display only (plan headers, calibration rows); pricing never reads it.
  """
  kv_slots: int
  config: ModelConfig | None = None
  weights_dtype: str | None = None
  runs_network: bool = True
  label: str = "draft"

  def __post_init__(self):
    if not isinstance(self.kv_slots, numbers.Integral) or self.kv_slots < 0:
      raise ValueError(f"DraftCost kv_slots must be an integer >= 0, got {self.kv_slots!r}")
    if self.weights_dtype is not None and self.weights_dtype not in WEIGHT_COPIES:
      raise ValueError(f"DraftCost weights_dtype must be None or one of {WEIGHT_COPIES}, got {self.weights_dtype!r}")
    if not self.runs_network and (self.config is not None or self.kv_slots or self.weights_dtype):
      raise ValueError("a DraftCost that runs no network reads no config, cache or weights")

  def network_config(self, target: ModelConfig) -> ModelConfig:
    """The config of the network the step runs (the target's where it has none of its own)."""
    return target if self.config is None else self.config

  def kv_tokens(self, context: int) -> int:
    """Cached tokens the step reads per row at this context (0 where it runs no network)."""
    return min(int(context), self.kv_slots) if self.runs_network else 0
