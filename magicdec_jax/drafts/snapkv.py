"""`SnapKVDraft(budget, window, observation_window)`: self-speculation whose static part holds, per layer
and KV head, the `budget` prompt positions the last `observation_window` prompt queries attended to most
(SnapKV), plus a ring of the last `window` positions."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from magicdec_jax.cache import KVCache, RingCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import Draft, Footprint, Prefill, check_sink_window, copy_from_linear
from magicdec_jax.drafts.ring import RingDraft
from magicdec_jax.drafts.weights import TargetWeightCopy, check_weights
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.model import forward
from magicdec_jax.options import check_count
from magicdec_jax.tuning.draft_cost import DraftCost


MAX_POOL_KERNEL = 1023      # the scores' pooling window (SnapKV uses 5-7); a wider one is a mistake


@dataclasses.dataclass(frozen=True)
class SnapKVDraft(TargetWeightCopy, RingDraft, Draft):
  """Self-speculation keeping `budget` selected prompt positions per KV head plus the last `window`."""
  budget: int = 256
  window: int = 64
  observation_window: int = 32
  pool_kernel: int = 5
  weights: str | None = None      # a copy of the target's matrices to draft with (StreamingDraft.weights)

  name = "snapkv"
  uses_target_weights = True
  positions = "absolute"

  def __post_init__(self):
    check_sink_window(0, self.window)
    check_weights(self.weights, "SnapKVDraft")
    check_count("SnapKVDraft budget", self.budget, 1)
    check_count("SnapKVDraft observation_window", self.observation_window, 1)
    check_count("SnapKVDraft pool_kernel", self.pool_kernel, 1, MAX_POOL_KERNEL)
    if self.pool_kernel % 2 == 0:
      raise ValueError(f"SnapKVDraft pool_kernel must be odd and >= 1, got {self.pool_kernel}")

  sink = property(lambda self: 0)
  num_static = property(lambda self: self.budget)

  def check_prompts(self, ids: Sequence[Sequence[int]]) -> None:
    need = max(self.budget + self.window, self.observation_window) + 1
    short = min((len(p) for p in ids), default=need)
    if short < need:
      raise ValueError(f"SnapKVDraft needs prompts of at least max(budget={self.budget} + window={self.window}, "
                       f"observation_window={self.observation_window}) + 1 = {need} tokens; the shortest is "
                       f"{short} tokens")

  def prefill_ring(self, ring: RingCache, p: Prefill) -> RingCache:
    """The observation window's queries score every prompt slot; the top `budget` per (layer, KV head)
    fill the static slots, the recent window is copied as a StreamingDraft's is."""
    obs = self.observation_window
    base = p.lengths - 1 - obs
    pos = base[:, None] + jnp.arange(obs)[None, :]
    toks = jnp.take_along_axis(p.tokens, jnp.maximum(pos, 0), axis=1)
    _, _, scores = forward(p.target_params, p.cfg, toks, pos, p.target, None,
                           PrefixTree(base, jnp.tril(jnp.ones((obs, obs), bool))),
                           compute_logits=False, return_scores=True)
    ring = self._select(ring, p.target, scores, p.lengths)
    return copy_from_linear(ring, 0, self.window, p.target, p.lengths)

  def _select(self, ring: RingCache, target: KVCache, scores, lengths: jax.Array) -> RingCache:
    """Fill the static slots with each (layer, KV head)'s top-`budget` prompt positions by pooled score.
    scores: L x [B, K, S] attention mass of the observation queries on each cache slot. Candidates are
    positions before the initial recent window (those are kept by the ring anyway)."""
    pad = self.pool_kernel // 2
    new_k, new_v = [], []
    for i, (sc, tk, tv, rk, rv) in enumerate(zip(scores, target.k, target.v, ring.k, ring.v, strict=True)):
      pos = target.slot_positions(i, lengths - 1)                                  # [B, S]: ring layers
      candidate = (pos >= 0) & (pos < (lengths - 1 - self.window)[:, None])     # (the ring holds L-1-window ..)
      pooled = jax.lax.reduce_window(sc, 0.0, jax.lax.add, (1, 1, self.pool_kernel), (1, 1, 1),
                                     [(0, 0), (0, 0), (pad, pad)]) / self.pool_kernel
      pooled = jnp.where(candidate[:, None, :], pooled, -jnp.inf)
      idx = jax.lax.top_k(pooled, self.budget)[1][..., None]                         # [B, K, budget, 1]
      new_k.append(rk.at[:, :, :self.budget].set(jnp.take_along_axis(tk, idx, axis=2).astype(rk.dtype)))
      new_v.append(rv.at[:, :, :self.budget].set(jnp.take_along_axis(tv, idx, axis=2).astype(rv.dtype)))
    new_pos = ring.pos.at[:, :self.budget].set(0)     # static slots: always visible
    return ring.replace(k=tuple(new_k), v=tuple(new_v), pos=new_pos)

  def cost(self) -> DraftCost:
    return DraftCost(self.budget + self.window, weights_dtype=self.weights, label="snapkv")

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    return Footprint(ring=cfg, ring_slots=self.budget + self.window + tree_nodes,
                     row_bytes=4 * (self.budget + self.window), prefill_score_buffers=3,
                     weight_copy=self.weights)

  def forward_network(self, target):
    return target.params, target.config
