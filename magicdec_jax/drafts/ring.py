"""Drafts that run a transformer over a StreamingLLM-style ring (cache.RingCache): the self drafts
(StreamingDraft, SnapKVDraft: the target's own weights) and ModelDraft (a smaller model of its own).

A round drafts the tree level by level into the ring's scratch slots (after the static and ring slots);
only committed positions ever enter the ring. Self drafts commit the target's exact K/V (the verify pass
wrote them, compacted to slots L-1 ..); a model draft commits its own scratch K/V of the accepted path,
and re-encodes the previous token every round (after a full accept its K/V was never computed).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from magicdec_jax.cache import RingCache, gather_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import (DraftSpec, Round, choose_children, draft_levels, ring_key_positions, scratch_mask,
                                      window_attention)
from magicdec_jax.model import forward
from magicdec_jax.trees import Tree


class RingDraft(DraftSpec):
  """Propose / commit for a network over a RingCache; subclasses give the network and the prefill."""

  num_static: int = 0          # slots that never move: the sinks (or SnapKV's selected positions)

  def _network(self, r: Round) -> tuple[object, ModelConfig]:
    """(params, config) the draft runs: the target's (or draft_params, a narrower copy of them)."""
    return (r.target_params if r.draft_params is None else r.draft_params), r.cfg

  def ring_config(self, cfg: ModelConfig) -> ModelConfig:
    return cfg

  def empty_ring(self, cfg: ModelConfig, batch: int, tree: Tree, num_slots: int) -> RingCache:
    scratch = tree.num_nodes + int(self.needs_prev_token)
    return RingCache.zeros(self.ring_config(cfg), batch, self.sink, self.num_static, self.window, scratch)

  def propose(self, ring: RingCache, r: Round):
    """Node tokens [B, N] (node 0 = the pending token), the draft distribution [B, N, V] at expanded nodes
    (0 elsewhere) and the ring with this round's scratch slots written."""
    params, cfg = self._network(r)
    tree = r.tree
    b, n_nodes = r.last.shape[0], tree.num_nodes
    off = int(self.needs_prev_token)
    depths = np.concatenate([[-1] * off, tree.depths]).astype(np.int32)         # scratch index -> depth
    anc = np.zeros((n_nodes + off, n_nodes + off), bool)
    anc[off:, off:] = tree.ancestor_mask
    if off:
      anc[:, 0] = True                                                            # all see prev
    anc = jnp.asarray(anc)
    scratch_pos = (r.lengths - 1)[:, None] + jnp.asarray(depths)[None, :]         # [B, N + off]
    before = r.lengths - 1 - off

    def level(carry, d, expanding, children):
      node_tokens, dist, ring = carry
      rows_sc = expanding + off                                                   # scratch indices
      toks = node_tokens[:, expanding]
      with_prev = off == 1 and isinstance(d, int) and d == 0
      if with_prev:
        rows_sc = jnp.concatenate([jnp.zeros((1,), rows_sc.dtype), rows_sc])
        toks = jnp.concatenate([r.prev[:, None], toks], axis=1)
      q_pos = scratch_pos[:, rows_sc]
      mask = scratch_mask(ring, self.sink, self.window, anc[rows_sc], q_pos, scratch_pos, before)
      slots = jnp.broadcast_to(ring.scratch_start + rows_sc, q_pos.shape)
      logits, ring = forward(params, cfg, toks, jnp.maximum(q_pos, 0), ring, slots,
                             window_attention(self, mask, q_pos, self.num_static,
                                              ring_key_positions(ring, scratch_pos)))
      logits = logits[:, 1:] if with_prev else logits                             # drop prev's output
      children_tok, level_dist = choose_children(logits, r, d, children.shape[1], expanding, node_tokens)
      dist = dist.at[:, expanding].set(level_dist)
      node_tokens = node_tokens.at[:, children].set(children_tok, mode="drop")
      return node_tokens, dist, ring

    carry = (jnp.zeros((b, n_nodes), jnp.int32).at[:, 0].set(r.last),
             jnp.zeros((b, n_nodes, cfg.vocab_size), jnp.float32), ring)
    return draft_levels(tree, level, carry, unrolled=off)

  def commit(self, ring: RingCache, r: Round) -> RingCache:
    """Write the committed positions L-1-off .. L-1+n into the ring: the target's exact K/V (self
    drafts), or the draft's own scratch K/V of the path nodes (and of the previous token)."""
    b, dp1 = r.path.shape
    i = jnp.arange(dp1)[None, :]
    if self.uses_target_weights:
      pos = (r.lengths - 1)[:, None] + i
      k, v = r.target.gather(pos)
      return ring.write_committed(k, v, pos, i <= r.n[:, None])
    pos = (r.lengths - 2)[:, None] + jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                                                      jnp.broadcast_to(i + 1, (b, dp1))], axis=1)
    scratch = ring.scratch_start + jnp.concatenate([jnp.zeros((b, 1), jnp.int32), r.path + 1], axis=1)
    k, v = gather_slots(ring.k, ring.v, scratch)
    valid = (pos >= 0) & (jnp.concatenate([jnp.zeros((b, 1), bool), i <= r.n[:, None]], axis=1) |
                          (jnp.arange(dp1 + 1)[None, :] == 0))
    return ring.write_committed(k, v, pos, valid)
