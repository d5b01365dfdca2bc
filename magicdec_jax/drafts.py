"""The three drafts and how each fills, uses and updates its small fixed-size cache.

* `StreamingDraft(sink, window)` — self-speculation: the target's own weights attending only to the sink
  tokens and the last `window` tokens (StreamingLLM). Its ring holds the target's exact K/V for those
  positions: filled from the target's prefill cache, refreshed from the target's verify pass after every
  round, so drafting costs O(sink + window) whatever the context length.
* `SnapKVDraft(budget, window, observation_window)` — self-speculation whose static part holds, per layer and
  KV head, the `budget` prompt positions the last `observation_window` queries attended to most.
* `ModelDraft(model, sink, window)` — a separate (smaller) model with its own StreamingLLM ring; every one of
  its K/V entries is computed with sink + window attention (prefill included), so it is exactly "the draft
  model with StreamingLLM attention".

Positions are absolute (keys rotated at their true position), see README "RoPE positions in the draft".
A round drafts the tree level by level into scratch slots; only committed positions ever enter the ring.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.cache import KVCache, RingCache, gather_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.attention import DenseMask, PrefixTree
from magicdec_jax.model import Model, forward
from magicdec_jax.sampling import Sampling, probabilities, sample_without_replacement
from magicdec_jax.trees import Tree


DRAFT_WEIGHTS = (None, "bfloat16")


@dataclasses.dataclass(frozen=True)
class StreamingDraft:
  """Self-speculation with a StreamingLLM cache: `sink` first tokens + the last `window` tokens.

  positions: "absolute" (every key at its true position) or "cache" (StreamingLLM: sink keys are seen as
  if they sat right before the window, i.e. RoPE positions within the cache).
  weights: None (draft with the target's weights) or "bfloat16": draft with a bfloat16 copy of the
  target's weight matrices (norms stay as they are), which halves the bytes a draft step reads. The ring
  still holds the target's exact K/V and the target verifies in its own precision, so output is exactly
  the target's; only acceptance can change (a little: the copy rounds each weight to 8 bits of mantissa).
  """
  sink: int = 4
  window: int = 256
  positions: str = "absolute"
  weights: str | None = None

  def __post_init__(self):
    _check_sink_window(self.sink, self.window)
    _check_positions(self.positions)
    if self.weights not in DRAFT_WEIGHTS:
      raise ValueError(f"StreamingDraft weights must be one of {DRAFT_WEIGHTS}, got {self.weights!r}")

  num_static = property(lambda self: self.sink)


@dataclasses.dataclass(frozen=True)
class SnapKVDraft:
  """Self-speculation keeping `budget` selected prompt positions per KV head plus the last `window`."""
  budget: int = 256
  window: int = 64
  observation_window: int = 32
  pool_kernel: int = 5
  positions = "absolute"

  def __post_init__(self):
    _check_sink_window(0, self.window)
    if self.budget < 1:
      raise ValueError(f"SnapKVDraft budget must be >= 1, got {self.budget}")
    if self.observation_window < 1:
      raise ValueError(f"SnapKVDraft observation_window must be >= 1, got {self.observation_window}")
    if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
      raise ValueError(f"SnapKVDraft pool_kernel must be odd and >= 1, got {self.pool_kernel}")

  sink = property(lambda self: 0)
  num_static = property(lambda self: self.budget)


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """The static part of a feature_draft.FeatureDraft: the head's one-layer config, the target layers it
  reads, its ring (its propose / commit live in feature_draft.py)."""
  config: ModelConfig
  layers: tuple[int, ...]
  sink: int
  window: int
  vocab: tuple[int, ...] | None = None      # the head's draft vocabulary (target ids); None = the target's
  positions = "absolute"

  num_static = property(lambda self: self.sink)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The static part of a ModelDraft (hashable, a jit static argument)."""
  config: ModelConfig
  sink: int
  window: int
  positions: str = "absolute"

  num_static = property(lambda self: self.sink)


class ModelDraft:
  """A standalone draft model (same vocabulary) with its own StreamingLLM ring cache."""

  def __init__(self, model: Model, sink: int = 4, window: int = 256, positions: str = "absolute"):
    _check_sink_window(sink, window)
    _check_positions(positions)
    self.model = model
    self.spec = ModelSpec(model.config, sink, window, positions)

  def check_compatible(self, target: Model):
    if self.model.config.vocab_size != target.config.vocab_size:
      raise ValueError(f"draft vocabulary size {self.model.config.vocab_size} differs from the target's "
                       f"{target.config.vocab_size}; a draft must share the target's tokenizer")


def _check_sink_window(sink: int, window: int):
  if not isinstance(sink, (int, np.integer)) or sink < 0:
    raise ValueError(f"draft sink must be an integer >= 0, got {sink!r}")
  if not isinstance(window, (int, np.integer)) or window < 1:
    raise ValueError(f"draft window must be an integer >= 1, got {window!r}")


def _check_positions(positions: str):
  if positions not in ("absolute", "cache"):
    raise ValueError(f"draft positions must be 'absolute' or 'cache', got {positions!r}")


def window_attention(spec, mask: jax.Array, q_pos: jax.Array, num_static: int) -> DenseMask:
  """The draft's visibility rule, with StreamingLLM cache positions for static slots if asked."""
  if spec.positions == "absolute" or num_static == 0:
    return DenseMask(mask)
  alt_pos = jnp.minimum(q_pos, spec.sink + spec.window - 1)
  return DenseMask(mask, alt_pos, jnp.arange(mask.shape[-1]) < num_static)


def truncate_layers(model: Model, n: int) -> Model:
  """The first n layers of `model` + its final norm and head: a real, smaller draft of the same family."""
  if not 1 <= n <= model.config.num_layers:
    raise ValueError(f"truncate_layers: n must be in [1, {model.config.num_layers}], got {n}")
  params = dict(model.params)
  params["layers"] = tuple(model.params["layers"][:n])
  return dataclasses.replace(model, config=model.config.replace(num_layers=n), params=params,
                             name=f"{model.name}[:{n} layers]")


def static_spec(draft) -> Any:
  """What the compiled loop needs to know about a draft (hashable)."""
  if isinstance(draft, ModelDraft) or isinstance(getattr(draft, "spec", None), FeatureSpec):
    return draft.spec
  return draft


def is_self(spec) -> bool:
  """Drafts that run the target's own weights (their ring holds the target's K/V)."""
  return not isinstance(spec, (ModelSpec, FeatureSpec))


def needs_prev(spec) -> bool:
  """A model draft re-encodes the previous token each round (its K/V may be missing after a full accept)."""
  return isinstance(spec, ModelSpec)


# ---------------------------------------------------------------------------------------------------------
# Prefill: fill the ring for committed positions 0 .. L-2 (the last prompt token is the pending root).

def _ring_positions(spec, lengths: jax.Array):
  """Positions [B, sink + window] to copy at prefill and whether each is committed and in its region."""
  recent = (lengths - 1 - spec.window)[:, None] + jnp.arange(spec.window)[None, :]
  sinks = jnp.broadcast_to(jnp.arange(spec.sink), (lengths.shape[0], spec.sink))
  pos = jnp.concatenate([sinks, recent], axis=1)
  in_region = jnp.concatenate([jnp.ones_like(sinks, bool), recent >= spec.sink], axis=1)
  return pos, in_region & (pos >= 0) & (pos <= (lengths - 2)[:, None])


def empty_ring(spec, cfg: ModelConfig, batch: int, tree: Tree) -> RingCache:
  scratch = tree.num_nodes + int(needs_prev(spec))
  return RingCache.zeros(cfg, batch, spec.sink, spec.num_static, spec.window, scratch)


def prefill_from_target(spec, ring: RingCache, target_cache: KVCache, lengths: jax.Array) -> RingCache:
  """Self drafts: copy the target's exact K/V of the sink and recent positions."""
  pos, valid = _ring_positions(spec, lengths)
  k, v = gather_slots(target_cache.k, target_cache.v, pos)
  return ring.write_committed(k, v, pos, valid)


def snapkv_select(spec: SnapKVDraft, ring: RingCache, target_cache: KVCache, scores, lengths: jax.Array
                  ) -> RingCache:
  """Fill the static slots with each (layer, KV head)'s top-`budget` prompt positions by pooled score.

  scores: L x [B, K, S] attention mass of the observation-window queries on each cache slot. Candidates
  are positions before the initial recent window (those are kept by the ring anyway).
  """
  pad = spec.pool_kernel // 2
  s = jnp.arange(target_cache.num_slots)
  candidate = s[None, :] < (lengths - spec.window)[:, None]                      # [B, S]
  new_k, new_v = [], []
  for sc, tk, tv, rk, rv in zip(scores, target_cache.k, target_cache.v, ring.k, ring.v, strict=True):
    pooled = jax.lax.reduce_window(sc, 0.0, jax.lax.add, (1, 1, spec.pool_kernel), (1, 1, 1),
                                   [(0, 0), (0, 0), (pad, pad)]) / spec.pool_kernel
    pooled = jnp.where(candidate[:, None, :], pooled, -jnp.inf)
    idx = jax.lax.top_k(pooled, spec.budget)[1][..., None]                         # [B, K, budget, 1]
    new_k.append(rk.at[:, :, :spec.budget].set(jnp.take_along_axis(tk, idx, axis=2).astype(rk.dtype)))
    new_v.append(rv.at[:, :, :spec.budget].set(jnp.take_along_axis(tv, idx, axis=2).astype(rv.dtype)))
  new_pos = ring.pos.at[:, :spec.budget].set(0)     # static slots: always visible
  return ring.replace(k=tuple(new_k), v=tuple(new_v), pos=new_pos)


def windowed_mask(sink: int, window: int, q_pos: jax.Array, num_slots: int) -> jax.Array:
  """[B, T] query positions -> [B, T, S] StreamingLLM visibility over a linear cache (slot == position)."""
  s = jnp.arange(num_slots)[None, None, :]
  p = q_pos[:, :, None]
  return (s <= p) & ((s < sink) | (s > p - window))


# ---------------------------------------------------------------------------------------------------------
# One round: draft the tree level by level.

def _draft_params_cfg(spec, target_params, target_cfg, draft_params):
  if is_self(spec):         # draft_params: None, or a narrower copy of the target's (StreamingDraft.weights)
    return (target_params if draft_params is None else draft_params), target_cfg
  return draft_params, spec.config


def propose(spec, tree: Tree, sampling: Sampling, target_params, target_cfg: ModelConfig, draft_params,
            ring: RingCache, last: jax.Array, prev: jax.Array, lengths: jax.Array, keys: jax.Array):
  """Draft the tree's candidates. last/prev [B]: tokens at positions L-1 (root) and L-2; lengths [B] = L.

  Returns node_tokens [B, N] (node 0 = last), the draft's distribution [B, N, V] at expanded nodes (0
  elsewhere: logits under greedy, the filtered probabilities q it sampled from under sampling, so the round
  does not filter them twice), and the ring with this round's scratch slots written. A tree is drafted level by level, unrolled (levels
  differ in width); a chain's levels all have one node, so they run as one `fori_loop` whose body is
  compiled once (with one unrolled forward per level, a 30-layer model would compile gamma copies).
  """
  params, cfg = _draft_params_cfg(spec, target_params, target_cfg, draft_params)
  b, n_nodes = last.shape[0], tree.num_nodes
  off = int(needs_prev(spec))
  depths = np.concatenate([[-1] * off, tree.depths]).astype(np.int32)        # scratch index -> depth
  anc = np.zeros((n_nodes + off, n_nodes + off), bool)
  anc[off:, off:] = tree.ancestor_mask
  if off:
    anc[:, 0] = True                                                           # all see prev
  anc = jnp.asarray(anc)
  scratch_pos = (lengths - 1)[:, None] + jnp.asarray(depths)[None, :]          # [B, N + off]
  before = lengths - 1 - off

  def level(carry, d, expanding, children, with_prev: bool):
    """Draft one level: expanding [E] node ids, children [E, W] their child ids (n_nodes = none)."""
    node_tokens, all_logits, ring = carry
    rows_sc = expanding + off                                                  # scratch indices
    toks = node_tokens[:, expanding]
    if with_prev:
      rows_sc = jnp.concatenate([jnp.zeros((1,), rows_sc.dtype), rows_sc])
      toks = jnp.concatenate([prev[:, None], toks], axis=1)
    q_pos = scratch_pos[:, rows_sc]
    sc_vis = anc[rows_sc][None] & (
        (scratch_pos[:, None, :] < spec.sink) | (scratch_pos[:, None, :] > q_pos[:, :, None] - spec.window))
    sc_vis = sc_vis & (scratch_pos[:, None, :] >= 0)
    pad = jnp.zeros(sc_vis.shape[:2] + (ring.num_slots - ring.scratch_start - sc_vis.shape[2],), bool)
    mask = jnp.concatenate([ring.visible(q_pos, before), sc_vis, pad], axis=2)   # alignment slots: unseen
    slots = jnp.broadcast_to(ring.scratch_start + rows_sc, q_pos.shape)
    logits, ring = forward(params, cfg, toks, jnp.maximum(q_pos, 0), ring, slots,
                           window_attention(spec, mask, q_pos, spec.num_static))
    logits = logits[:, 1:] if with_prev else logits                            # drop prev's output
    width = children.shape[1]
    level_keys = jax.vmap(lambda k: jax.random.fold_in(k, 7919 + d))(keys)
    if sampling.greedy:
      all_logits = all_logits.at[:, expanding].set(logits)
      children_tok = jax.lax.top_k(logits, width)[1].astype(jnp.int32)           # [B, E, W]
    else:
      q = probabilities(logits, sampling)
      all_logits = all_logits.at[:, expanding].set(q)
      keys_e = jax.vmap(lambda k: jax.random.split(k, expanding.shape[0]))(level_keys)
      children_tok = sample_without_replacement(keys_e, q, width)
    node_tokens = node_tokens.at[:, children].set(children_tok, mode="drop")
    return node_tokens, all_logits, ring

  carry = (jnp.zeros((b, n_nodes), jnp.int32).at[:, 0].set(last),
           jnp.zeros((b, n_nodes, cfg.vocab_size), jnp.float32), ring)
  levels = tree.levels[:-1]
  loop_from = off if tree.is_chain else len(levels)            # chain levels >= loop_from: one fori_loop
  for d, lvl in enumerate(levels[:loop_from]):
    expanding = np.asarray([u for u in lvl if tree.num_children[u] > 0], np.int32)
    width = int(tree.num_children[expanding].max())
    children = np.full((len(expanding), width), n_nodes, np.int32)
    for j, u in enumerate(expanding):
      children[j, :len(tree.children[u])] = tree.children[u]
    carry = level(carry, d, jnp.asarray(expanding), jnp.asarray(children), d == 0 and off == 1)
  if loop_from < len(levels):     # chain node d sits at depth d; its child is node d + 1
    carry = jax.lax.fori_loop(
        loop_from, len(levels),
        lambda d, c: level(c, d, d[None].astype(jnp.int32), (d + 1)[None, None].astype(jnp.int32),
                           False), carry)
  return carry


def commit(spec, ring: RingCache, tree: Tree, target_cache: KVCache, path: jax.Array, n: jax.Array,
           lengths: jax.Array) -> RingCache:
  """After verification: write the committed positions L-1-off .. L-1+n into the ring.

  path [B, D+1] accepted node ids; n [B] accepted candidates; lengths [B] = L before this round.
  Self drafts take the target's exact K/V (already compacted to slots L-1+i); a model draft takes its own
  scratch K/V of the path nodes (and of the previous token).
  """
  b, dp1 = path.shape
  i = jnp.arange(dp1)[None, :]
  if is_self(spec):
    pos = (lengths - 1)[:, None] + i
    k, v = gather_slots(target_cache.k, target_cache.v, pos)
    return ring.write_committed(k, v, pos, i <= n[:, None])
  pos = (lengths - 2)[:, None] + jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                                                  jnp.broadcast_to(i + 1, (b, dp1))], axis=1)
  scratch = ring.scratch_start + jnp.concatenate([jnp.zeros((b, 1), jnp.int32), path + 1], axis=1)
  k, v = gather_slots(ring.k, ring.v, scratch)
  valid = (pos >= 0) & (jnp.concatenate([jnp.zeros((b, 1), bool), i <= n[:, None]], axis=1) |
                        (jnp.arange(dp1 + 1)[None, :] == 0))
  return ring.write_committed(k, v, pos, valid)
