"""`FeatureDraft(head, sink, window)`: the feature head (feature_head.py) as a draft in the fused loop.

Head position t reads (target features at t, token t+1) and predicts token t+2, so with L committed
tokens (token L-1 pending) the tree's root node sits at head position L-2, and a node at depth d at L-2+d.
The head keeps its own StreamingLLM ring (cache.RingCache, one layer): `sink` first positions + the last
`window` committed positions, only ever holding K/V computed from the target's true features, so its
step costs O(sink + window + tree) whatever the context length.

Per round (`loop.decode_round`, through the draft interface of drafts/base.py):
  * propose: the root from the stored target features at L-2 (`FeatureRing.feat`) and the pending token;
    deeper nodes from their parent's head output h (EAGLE), level by level into the ring's scratch slots;
  * the target's verify pass returns its features at every tree node (`feature_layers`);
  * commit: positions L-2 .. L-2+n (n accepted) are re-encoded with their true features (the root's stored
    ones, then the accepted path's) and written into the ring; the features at the last accepted node
    (position L-1+n = the next root's L'-2) become the stored features.
Prefill: one extra target pass over the sink + last-window prompt positions (reading the prefilled cache)
gives their features, and the head writes those positions' K/V into the ring. A one-layer head's K/V at a
position depend only on that position's input, so no attention pattern matters when filling the ring.
The draft only shapes the proposals: verification is the usual lossless accept, so outputs equal AR's.

`weights=None | "bfloat16" | "int8" | "int4"` (drafts/weights.py, layers/quant.py): the draft step reads
a copy of its matrices instead, made once per (head, target) pair. Without a draft vocabulary a draft
token's largest read is not the head (one layer + fuse + fc) but the target's full LM head, V x D, so the
copy covers both: the draft params are the head's params copied (fuse, fc, the layer, vocab_head; norm
scales kept) plus "target_head", a copy of the target matrices the step reads (its embedding, gathered
with `QuantizedWeight.rows`, and its LM head where untied and the head has no draft vocabulary;
feature_head.target_weights). The target's features and its verification use its own weights, so
outputs still equal AR's; only acceptance moves.
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import feature_head
from magicdec_jax.cache import KVCache, RingCache, aligned_slots, gather_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import (Draft, DraftSpec, Footprint, Prefill, Round, check_sink_window, choose_children,
                                      draft_levels, ring_key_positions, scratch_mask)
from magicdec_jax.drafts.streaming import DEFAULT_SINK, DEFAULT_WINDOW
from magicdec_jax.drafts.weights import cached_copy, check_narrower, check_weights
from magicdec_jax.feature_head import FeatureHead
from magicdec_jax.layers import quant
from magicdec_jax.layers.attention import DenseMask, PrefixTree
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.model import forward
from magicdec_jax.trees import Tree
from magicdec_jax.tuning.draft_cost import DraftCost


@flax.struct.dataclass
class FeatureRing:
  """The draft state in LoopState.ring: the head's ring and the target's features at position L-2."""
  ring: RingCache
  feat: jax.Array        # [B, n_layers * D]


def _self_only(num_slots: int, slots: jax.Array) -> DenseMask:
  """Each query sees only its own slot: the ring fills need K/V, which do not depend on attention."""
  return DenseMask(slots[:, :, None] == jnp.arange(num_slots)[None, None, :])


@dataclasses.dataclass(frozen=True)
class FeatureSpec(DraftSpec):
  """The static part of a FeatureDraft: the head's one-layer config, the target layers it reads, its ring."""
  config: ModelConfig
  layers: tuple[int, ...]
  sink: int
  window: int
  vocab: tuple[int, ...] | None = None      # the head's draft vocabulary (target ids); None = the target's
  weights: str | None = None                # the copy its step reads (FeatureDraft.weights); None: as they are

  positions = "absolute"
  commits_plain_rounds = False   # not verified with plain rounds: adaptive schedules switch chains only

  feature_layers = property(lambda self: self.layers)
  num_static = property(lambda self: self.sink)

  def network_config(self, cfg: ModelConfig) -> ModelConfig:
    return self.config

  def empty_ring(self, cfg: ModelConfig, batch: int, tree: Tree, num_slots: int) -> FeatureRing:
    ring = RingCache.zeros(self.config, batch, self.sink, self.sink, self.window, tree.num_nodes)
    return FeatureRing(ring, jnp.zeros((batch, len(self.layers) * cfg.hidden_size), cfg.jnp_dtype))

  # ------------------------------------------------------------------------------------------- prefill

  def prefill_ring(self, fr: FeatureRing, p: Prefill) -> FeatureRing:
    """Ring filled for head positions 0..sink-1 and the last `window` before L-2; features at L-2 stored."""
    b, n = p.tokens.shape
    last = (p.lengths - 2)[:, None]
    recent = last - self.window + jnp.arange(self.window + 1)[None, :]            # .. L-2 (stored)
    pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(self.sink), (b, self.sink)), recent], axis=1)
    safe = jnp.clip(pos, 0, n - 1)
    mask = jnp.arange(p.target.num_slots)[None, None, :] <= safe[:, :, None]
    _, _, feats = forward(p.target_params, p.cfg, jnp.take_along_axis(p.tokens, safe, axis=1), safe, p.target,
                          None, DenseMask(mask, filled=p.lengths - 1), compute_logits=False,
                          feature_layers=self.layers)
    if self.sink and any(p.target.is_ring(i) for i in range(p.cfg.num_layers)):
      feats = feats.at[:, :self.sink].set(self._sink_features(p))     # a ring no longer holds their keys
    nxt = jnp.take_along_axis(p.tokens, jnp.clip(safe + 1, 0, n - 1), axis=1)     # token t+1
    m = pos.shape[1] - 1                                                          # ring entries
    scratch = KVCache.zeros(self.config, b, aligned_slots(m))
    slots = jnp.broadcast_to(jnp.arange(m), (b, m))
    g = feature_head.fuse(p.draft_params, feats[:, :m], p.cfg.rms_norm_eps)
    _, _, k, v = feature_head.step(self.config, p.draft_params, p.target_params, g, nxt[:, :m], safe[:, :m],
                                   scratch.k[0], scratch.v[0], slots, _self_only(scratch.num_slots, slots))
    in_region = jnp.concatenate([jnp.ones((b, self.sink), bool), recent[:, :-1] >= self.sink], axis=1)
    valid = in_region & (pos[:, :m] >= 0) & (pos[:, :m] <= last - 1)
    ks, vs = gather_slots((k,), (v,), slots)
    return FeatureRing(fr.ring.write_committed(ks, vs, pos[:, :m], valid), feats[:, m])

  def _sink_features(self, p: Prefill) -> jax.Array:
    """The target's features at positions 0 .. sink - 1, from a forward over those tokens alone."""
    b, sink = p.tokens.shape[0], self.sink
    pos = jnp.broadcast_to(jnp.arange(sink, dtype=jnp.int32), (b, sink))
    toks = jnp.take_along_axis(p.tokens, jnp.minimum(pos, p.tokens.shape[1] - 1), axis=1)
    rule = PrefixTree(jnp.zeros((b,), jnp.int32), jnp.tril(jnp.ones((sink, sink), bool)))
    return forward(p.target_params, p.cfg, toks, pos, KVCache.zeros(p.cfg, b, aligned_slots(sink)), pos, rule,
                   compute_logits=False, feature_layers=self.layers)[-1]

  # ------------------------------------------------------------------------------------------- propose

  def propose(self, fr: FeatureRing, r: Round):
    """Same contract as every draft: node tokens [B, N], the draft distribution [B, N, V], the new ring."""
    tree, cfg = r.tree, r.cfg
    b, n_nodes = r.last.shape[0], tree.num_nodes
    node_pos = jnp.maximum((r.lengths - 2)[:, None] + jnp.asarray(tree.depths)[None, :], 0)   # [B, N]
    before = r.lengths - 2
    anc = jnp.asarray(tree.ancestor_mask)
    parents = jnp.asarray(np.maximum(np.asarray(tree.parents_array), 0))
    root_g = feature_head.fuse(r.draft_params, fr.feat, cfg.rms_norm_eps)[:, None, :]

    def level(carry, d, expanding, children):
      node_tokens, dist, hidden, ring = carry
      g = root_g if isinstance(d, int) and d == 0 else hidden[:, parents[expanding]]
      q_pos = node_pos[:, expanding]
      mask = scratch_mask(ring, self.sink, self.window, anc[expanding], q_pos, node_pos, before)
      slots = jnp.broadcast_to(ring.scratch_start + expanding, q_pos.shape)
      logits, h, k, v = feature_head.step(self.config, r.draft_params, r.target_params, g,
                                          node_tokens[:, expanding], q_pos, ring.k[0], ring.v[0], slots,
                                          DenseMask(mask, key_pos=ring_key_positions(ring, node_pos)))
      logits = feature_head.to_target_vocab(logits, self.vocab, cfg.vocab_size)     # [B, E, V]
      hidden = hidden.at[:, expanding].set(h)
      children_tok, level_dist = choose_children(logits, r, d, children.shape[1], expanding, node_tokens)
      dist = dist.at[:, expanding].set(level_dist)
      node_tokens = node_tokens.at[:, children].set(children_tok, mode="drop")
      return node_tokens, dist, hidden, ring.replace(k=(k,), v=(v,))

    carry = (jnp.zeros((b, n_nodes), jnp.int32).at[:, 0].set(r.last),
             jnp.zeros((b, n_nodes, cfg.vocab_size), jnp.float32),
             jnp.zeros((b, n_nodes, cfg.hidden_size), fr.feat.dtype), fr.ring)
    node_tokens, dist, _, ring = draft_levels(tree, level, carry, unrolled=1)
    return node_tokens, dist, fr.replace(ring=ring)

  # -------------------------------------------------------------------------------------------- commit

  def commit(self, fr: FeatureRing, r: Round) -> FeatureRing:
    """Write head positions L-2 .. L-2+n, re-encoded from true features, into the ring; store the features
    at the last accepted node. r.features [B, N, n_layers * D]: the target's features at the tree nodes."""
    b, dp1 = r.path.shape
    ring = fr.ring
    path_feats = jnp.take_along_axis(r.features, r.path[:, :, None], axis=1)              # [B, D+1, F]
    in_feats = jnp.concatenate([fr.feat[:, None], path_feats[:, :-1]], axis=1)            # at L-2+j
    toks = jnp.take_along_axis(r.node_tokens, r.path, axis=1)                             # token L-1+j
    pos = (r.lengths - 2)[:, None] + jnp.arange(dp1)[None, :]
    slots = jnp.broadcast_to(ring.scratch_start + jnp.arange(dp1), (b, dp1))
    g = feature_head.fuse(r.draft_params, in_feats, r.cfg.rms_norm_eps)
    _, _, k, v = feature_head.step(self.config, r.draft_params, r.target_params, g, toks, jnp.maximum(pos, 0),
                                   ring.k[0], ring.v[0], slots, _self_only(ring.num_slots, slots))
    ks, vs = gather_slots((k,), (v,), slots)
    valid = (pos >= 0) & (jnp.arange(dp1)[None, :] <= r.n[:, None])
    ring = ring.replace(k=(k,), v=(v,)).write_committed(ks, vs, pos, valid)
    new_feat = jnp.take_along_axis(path_feats, r.n[:, None, None], axis=1)[:, 0]
    return FeatureRing(ring, new_feat)

  # ------------------------------------------------------------------------------------------ tuning

  def cost(self) -> DraftCost:
    """A one-layer network of its own over a sink + window ring, whose LM head spans its own vocabulary
    (the target's, read from the copy, without one); its matrices read at the copy's bytes."""
    head = self.config if self.vocab is None else self.config.replace(vocab_size=len(self.vocab))
    return DraftCost(self.sink + self.window, head, self.weights, label="feature head")

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    """The head (priced as a one-layer model of the target's shape: its layer, embedding and LM head)
    and, with `weights`, a copy of that size: the head's matrices and the target's embedding / LM head."""
    return Footprint(weights=self.config, ring=self.config, ring_slots=self.sink + self.window + tree_nodes,
                     row_bytes=4 * (self.sink + self.window) + len(self.layers) * cfg.hidden_size * 4,
                     weight_copy=self.weights)


def draft_copy(head: FeatureHead, target_params: dict, tie_embeddings: bool, kind: str) -> dict:
  """The draft params of a FeatureDraft with weights=`kind`: the head's params and "target_head" (the
  target's embedding, and its LM head where untied and the head has no draft vocabulary) as one
  weight_copy (layers/dense.py), made once per (head, target) params pair (drafts/weights.cached_copy)."""
  def make():
    tables = {"embed": target_params["embed"]}
    if head.vocab is None and not tie_embeddings:
      tables["lm_head"] = target_params["lm_head"]
    return weight_copy({**head.params, "target_head": tables}, kind)
  return cached_copy((head.params, target_params), kind, make)


class FeatureDraft(Draft):
  """An EAGLE-style feature head with a sink + window ring (see the module docstring)."""

  name = "feature"
  weight_copies = True

  def __init__(self, head: FeatureHead, sink: int = DEFAULT_SINK, window: int = DEFAULT_WINDOW,
               weights: str | None = None):
    """weights: None (the head's and the target's matrices as they are), "bfloat16" (a copy of a float32
    head's and target's), "int8" or "int4" (quantized copies, layers/quant.py): see the module docstring."""
    check_sink_window(sink, window)
    check_weights(weights, "FeatureDraft")
    if not isinstance(head, FeatureHead):
      raise ValueError(f"FeatureDraft needs a feature_head.FeatureHead, got {type(head).__name__}")
    check_narrower(weights, head.config.dtype, "FeatureDraft")
    self.head = head
    self._spec = FeatureSpec(head.config, tuple(head.layers), int(sink), int(window), head.vocab, weights)

  @property
  def spec(self) -> FeatureSpec:
    return self._spec

  def params(self, target):
    w = self._spec.weights
    return self.head.params if w is None else draft_copy(self.head, target.params, target.config.tie_embeddings, w)

  def xla_options(self) -> dict:
    return quant.xla_options(self._spec.weights)

  def check_compatible(self, target) -> None:
    feature_head.check_compatible(self.head, target.config)
    feature_head.check_target(self.head, target)
    check_narrower(self._spec.weights, target.config.dtype, "FeatureDraft")

  def __repr__(self) -> str:
    w = "" if self.spec.weights is None else f", weights={self.spec.weights!r}"
    return f"FeatureDraft(layers={list(self.spec.layers)}, sink={self.spec.sink}, window={self.spec.window}{w})"
