"""`StreamingDraft(sink, window)`: self-speculation, the target's own weights over a StreamingLLM cache.

Its ring holds the target's exact K/V for the `sink` first and the last `window` positions: filled from
the target's prefill cache, refreshed from the target's verify pass after every round, so drafting costs
O(sink + window) whatever the context length (MagicDec's self-speculation).
"""
from __future__ import annotations

import dataclasses

from magicdec_jax.cache import RingCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import Draft, Footprint, Prefill, check_positions, check_sink_window, copy_from_linear
from magicdec_jax.drafts.ring import RingDraft
from magicdec_jax.drafts.weights import TargetWeightCopy, check_weights
from magicdec_jax.tuning.draft_cost import DraftCost

DEFAULT_SINK = 4
DEFAULT_WINDOW = 256


@dataclasses.dataclass(frozen=True)
class StreamingDraft(TargetWeightCopy, RingDraft, Draft):
  """Self-speculation with a StreamingLLM cache: `sink` first tokens + the last `window` tokens.

  positions: "absolute" (every key at its true position) or "cache" (StreamingLLM: sink keys are seen as
  if they sat right before the window, i.e. RoPE positions within the cache).
  weights: None (draft with the target's weights), "bfloat16" (a bfloat16 copy of the target's weight
  matrices: half the bytes of a float32 target's), "int8" (per output channel scales) or "int4" (group-wise
  scales, packed two per byte; layers/quant.py); norms stay as they are. The ring still holds the target's
  exact K/V and the target verifies in its own precision, so output is exactly the target's; only
  acceptance can change.
  """
  sink: int = DEFAULT_SINK
  window: int = DEFAULT_WINDOW
  positions: str = "absolute"
  weights: str | None = None

  name = "streaming"
  uses_target_weights = True

  def __post_init__(self):
    check_sink_window(self.sink, self.window)
    check_positions(self.positions)
    check_weights(self.weights, "StreamingDraft")

  num_static = property(lambda self: self.sink)

  def prefill_ring(self, ring: RingCache, p: Prefill) -> RingCache:
    return copy_from_linear(ring, self.sink, self.window, p.target, p.lengths)

  def cost(self) -> DraftCost:
    return DraftCost(self.sink + self.window, weights_dtype=self.weights, label="self")

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    return Footprint(ring=cfg, ring_slots=self.sink + self.window + tree_nodes,
                     row_bytes=4 * (self.sink + self.window), weight_copy=self.weights)

  def forward_network(self, target):
    return target.params, target.config

  def windowed_network(self, target):
    return target.params, target.config, self.sink, self.window
