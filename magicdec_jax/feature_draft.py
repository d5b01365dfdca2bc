"""`FeatureDraft(head, sink, window)`: the feature head (feature_head.py) as a draft in the fused loop.

Head position t reads (target features at t, token t+1) and predicts token t+2, so with L committed
tokens (token L-1 pending) the tree's root node sits at head position L-2, and a node at depth d at L-2+d.
The head keeps its own StreamingLLM ring (cache.RingCache, one layer): `sink` first positions + the last
`window` committed positions, only ever holding K/V computed from the target's true features, so its
step costs O(sink + window + tree) whatever the context length.

Per round (loop.py `_round`):
  * propose: the root from the stored target features at L-2 (`FeatureRing.feat`) and the pending token;
    deeper nodes from their parent's head output h (EAGLE), level by level into the ring's scratch slots;
  * the target's verify pass returns its features at every tree node (model.forward(feature_layers=...));
  * commit: positions L-2 .. L-2+n (n accepted) are re-encoded with their true features (the root's stored
    ones, then the accepted path's) and written into the ring; the features at the last accepted node
    (position L-1+n = the next root's L'-2) become the stored features.
Prefill: one extra target pass over the sink + last-window prompt positions (reading the prefilled cache)
gives their features, and the head writes those positions' K/V into the ring. A one-layer head's K/V at a
position depend only on that position's input, so no attention pattern matters when filling the ring.
The draft only shapes the proposals: verification is the usual lossless accept, so outputs equal AR's.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import feature_head
from magicdec_jax.cache import KVCache, RingCache, aligned_slots, gather_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts import FeatureSpec, _check_sink_window
from magicdec_jax.feature_head import FeatureHead
from magicdec_jax.layers.attention import DenseMask
from magicdec_jax.model import forward
from magicdec_jax.sampling import Sampling, probabilities, sample_without_replacement
from magicdec_jax.trees import Tree


class FeatureDraft:
  """An EAGLE-style feature head with a sink + window ring (see the module docstring)."""

  def __init__(self, head: FeatureHead, sink: int = 4, window: int = 256):
    _check_sink_window(sink, window)
    if not isinstance(head, FeatureHead):
      raise ValueError(f"FeatureDraft needs a feature_head.FeatureHead, got {type(head).__name__}")
    self.head = head
    self.spec = FeatureSpec(head.config, tuple(head.layers), int(sink), int(window), head.vocab)

  def check_compatible(self, target):
    feature_head.check_compatible(self.head, target.config)


@flax.struct.dataclass
class FeatureRing:
  """The draft state in LoopState.ring: the head's ring and the target's features at position L-2."""
  ring: RingCache
  feat: jax.Array        # [B, n_layers * D]


def is_feature(spec) -> bool:
  return isinstance(spec, FeatureSpec)


def empty(spec: FeatureSpec, tcfg: ModelConfig, batch: int, tree: Tree) -> FeatureRing:
  ring = RingCache.zeros(spec.config, batch, spec.sink, spec.sink, spec.window, tree.num_nodes)
  return FeatureRing(ring, jnp.zeros((batch, len(spec.layers) * tcfg.hidden_size), tcfg.jnp_dtype))


def _self_only(positions: jax.Array, num_slots: int, slots: jax.Array) -> DenseMask:
  """Each query sees only its own slot: the ring fills need K/V, which do not depend on attention."""
  return DenseMask(slots[:, :, None] == jnp.arange(num_slots)[None, None, :])


# ---------------------------------------------------------------------------------------------- prefill

def prefill(spec: FeatureSpec, head_params, target_params, tcfg: ModelConfig, target: KVCache,
            tokens: jax.Array, lengths: jax.Array, tree: Tree) -> FeatureRing:
  """Ring filled for head positions 0..sink-1 and the last `window` before L-2; features at L-2 stored.

  tokens [B, P] right-padded prompts; `target` the prefilled target cache (positions 0..L-2).
  """
  b, p = tokens.shape
  last = (lengths - 2)[:, None]
  recent = last - spec.window + jnp.arange(spec.window + 1)[None, :]            # .. L-2 (stored)
  pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(spec.sink), (b, spec.sink)), recent], axis=1)
  safe = jnp.clip(pos, 0, p - 1)
  mask = jnp.arange(target.num_slots)[None, None, :] <= safe[:, :, None]
  _, _, feats = forward(target_params, tcfg, jnp.take_along_axis(tokens, safe, axis=1), safe, target,
                        None, DenseMask(mask), compute_logits=False, feature_layers=spec.layers)
  nxt = jnp.take_along_axis(tokens, jnp.clip(safe + 1, 0, p - 1), axis=1)        # token t+1
  m = pos.shape[1] - 1                                                            # ring entries
  scratch = KVCache.zeros(spec.config, b, aligned_slots(m))
  slots = jnp.broadcast_to(jnp.arange(m), (b, m))
  g = feature_head.fuse(head_params, feats[:, :m], tcfg.rms_norm_eps)
  _, _, k, v = feature_head.step(spec.config, head_params, target_params, g, nxt[:, :m], safe[:, :m],
                                 scratch.k[0], scratch.v[0], slots,
                                 _self_only(safe[:, :m], scratch.num_slots, slots))
  in_region = jnp.concatenate([jnp.ones((b, spec.sink), bool), recent[:, :-1] >= spec.sink], axis=1)
  valid = in_region & (pos[:, :m] >= 0) & (pos[:, :m] <= last - 1)
  fr = empty(spec, tcfg, b, tree)
  ks, vs = gather_slots((k,), (v,), slots)
  return FeatureRing(fr.ring.write_committed(ks, vs, pos[:, :m], valid), feats[:, m])


# ---------------------------------------------------------------------------------------------- propose

def _level(spec, tcfg, head_params, target_params, ring: RingCache, node_pos, anc, before, g, toks,
           expanding):
  """One tree level through the head: expanding [E] node ids, g [B, E, D], toks [B, E]."""
  q_pos = node_pos[:, expanding]
  sc = node_pos[:, None, :]
  sc_vis = anc[expanding][None] & ((sc < spec.sink) | (sc > q_pos[:, :, None] - spec.window))
  pad = jnp.zeros(sc_vis.shape[:2] + (ring.num_slots - ring.scratch_start - sc_vis.shape[2],), bool)
  mask = jnp.concatenate([ring.visible(q_pos, before), sc_vis, pad], axis=2)
  slots = jnp.broadcast_to(ring.scratch_start + expanding, q_pos.shape)
  logits, h, k, v = feature_head.step(spec.config, head_params, target_params, g, toks, q_pos, ring.k[0],
                                      ring.v[0], slots, DenseMask(mask))
  logits = feature_head.to_target_vocab(logits, spec.vocab, tcfg.vocab_size)     # [B, E, V]
  return logits, h, ring.replace(k=(k,), v=(v,))


def propose(spec: FeatureSpec, tree: Tree, sampling: Sampling, target_params, tcfg: ModelConfig,
            head_params, fring: FeatureRing, last: jax.Array, prev: jax.Array, lengths: jax.Array,
            keys: jax.Array):
  """Same contract as drafts.propose: node_tokens [B, N], draft logits (greedy) or q (sampling) [B, N, V],
  the updated state."""
  del prev
  b, n_nodes = last.shape[0], tree.num_nodes
  node_pos = jnp.maximum((lengths - 2)[:, None] + jnp.asarray(tree.depths)[None, :], 0)   # [B, N]
  before = lengths - 2
  anc = jnp.asarray(tree.ancestor_mask)
  parents = np.asarray(tree.parents_array)

  def level(carry, d, expanding, children, g):
    node_tokens, all_logits, hidden, ring = carry
    logits, h, ring = _level(spec, tcfg, head_params, target_params, ring, node_pos, anc, before, g,
                             node_tokens[:, expanding], expanding)
    hidden = hidden.at[:, expanding].set(h)
    width = children.shape[1]
    if sampling.greedy:
      all_logits = all_logits.at[:, expanding].set(logits)
      children_tok = jax.lax.top_k(logits, width)[1].astype(jnp.int32)
    else:
      q = probabilities(logits, sampling)
      all_logits = all_logits.at[:, expanding].set(q)
      level_keys = jax.vmap(lambda k: jax.random.fold_in(k, 7919 + d))(keys)
      keys_e = jax.vmap(lambda k: jax.random.split(k, expanding.shape[0]))(level_keys)
      children_tok = sample_without_replacement(keys_e, q, width)
    node_tokens = node_tokens.at[:, children].set(children_tok, mode="drop")
    return node_tokens, all_logits, hidden, ring

  carry = (jnp.zeros((b, n_nodes), jnp.int32).at[:, 0].set(last),
           jnp.zeros((b, n_nodes, tcfg.vocab_size), jnp.float32),
           jnp.zeros((b, n_nodes, tcfg.hidden_size), fring.feat.dtype), fring.ring)
  root_g = feature_head.fuse(head_params, fring.feat, tcfg.rms_norm_eps)[:, None, :]
  levels = tree.levels[:-1]
  loop_from = 1 if tree.is_chain else len(levels)
  for d, lvl in enumerate(levels[:loop_from]):
    expanding = np.asarray([u for u in lvl if tree.num_children[u] > 0], np.int32)
    width = int(tree.num_children[expanding].max())
    children = np.full((len(expanding), width), n_nodes, np.int32)
    for j, u in enumerate(expanding):
      children[j, :len(tree.children[u])] = tree.children[u]
    g = root_g if d == 0 else carry[2][:, parents[expanding]]
    carry = level(carry, d, jnp.asarray(expanding), jnp.asarray(children), g)
  if loop_from < len(levels):     # chain node d sits at depth d; its child is node d + 1
    def chain_level(d, c):
      g = jax.lax.dynamic_slice_in_dim(c[2], d - 1, 1, axis=1)
      return level(c, d, d[None].astype(jnp.int32), (d + 1)[None, None].astype(jnp.int32), g)
    carry = jax.lax.fori_loop(loop_from, len(levels), chain_level, carry)
  node_tokens, all_logits, _, ring = carry
  return node_tokens, all_logits, fring.replace(ring=ring)


# ----------------------------------------------------------------------------------------------- commit

def commit(spec: FeatureSpec, fring: FeatureRing, tree: Tree, target_params, tcfg: ModelConfig,
           head_params, feats: jax.Array, node_tokens: jax.Array, path: jax.Array, n: jax.Array,
           lengths: jax.Array) -> FeatureRing:
  """Write head positions L-2 .. L-2+n, re-encoded from true features, into the ring; store the features
  at the last accepted node. feats [B, N, n_layers * D]: the target's features at the tree nodes."""
  b, dp1 = path.shape
  ring = fring.ring
  path_feats = jnp.take_along_axis(feats, path[:, :, None], axis=1)                 # [B, D+1, F]
  in_feats = jnp.concatenate([fring.feat[:, None], path_feats[:, :-1]], axis=1)     # at L-2+j
  toks = jnp.take_along_axis(node_tokens, path, axis=1)                             # token L-1+j
  pos = (lengths - 2)[:, None] + jnp.arange(dp1)[None, :]
  slots = jnp.broadcast_to(ring.scratch_start + jnp.arange(dp1), (b, dp1))
  g = feature_head.fuse(head_params, in_feats, tcfg.rms_norm_eps)
  _, _, k, v = feature_head.step(spec.config, head_params, target_params, g, toks, jnp.maximum(pos, 0),
                                 ring.k[0], ring.v[0], slots, _self_only(pos, ring.num_slots, slots))
  ks, vs = gather_slots((k,), (v,), slots)
  valid = (pos >= 0) & (jnp.arange(dp1)[None, :] <= n[:, None])
  ring = ring.replace(k=(k,), v=(v,)).write_committed(ks, vs, pos, valid)
  new_feat = jnp.take_along_axis(path_feats, n[:, None, None], axis=1)[:, 0]
  return FeatureRing(ring, new_feat)
