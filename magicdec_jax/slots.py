"""Slots for continuous batching: an all-free decode state, and `insert` of freshly prefilled rows.

The decode state has B slots. `insert(state, prefilled, slots, ...)` writes k prefilled prompts into chosen
free slots in one jitted call whose slot indices are traced (one executable for every choice of slots);
the state is donated, so only the chosen rows are written in place. Everything a slot holds is reset:
its `Rows` (loop_state.py: a tree map putting `fresh_rows` of the new prompts into the slots, so the
output and log-probability buffers, counters, budget, PRNG key and the row features' states are whatever
a fresh row has, with no field named here), its draft-ring rows (the draft's `insert_rows`: copied from
the new prompt's prefill) and its target-cache rows (the prefilled slots are copied; slots past them keep
the old occupant's K/V, which no query can see: attention is masked by the row's length). A destination
equal to B marks a padding entry and is dropped by the scatter. One prefilled row may go to several slots
(n samples of one prompt, each with its own stream id).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from magicdec_jax import loop
from magicdec_jax.cache import KVCache, ring_margin
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import DraftSpec
from magicdec_jax.loop_state import fresh_rows, logprob_width
from magicdec_jax.trees import Tree


def empty_state(eos: jax.Array, features: dict | None = None, *, cfg: ModelConfig, spec: DraftSpec | None,
                tree: Tree, batch: int, num_slots: int, out_len: int, num_variants: int = 1,
                logprobs: int = -1) -> loop.LoopState:
  """A LoopState of `batch` free slots (every row done, zero caches), ready for `insert`; logprobs and
  features ([batch, ...] states of the row features compiled in): as loop.initial_state's."""
  target = KVCache.zeros(cfg, batch, num_slots, ring_margin(tree.num_nodes))
  ring = None if spec is None else spec.empty_ring(cfg, batch, tree, num_slots)
  tokens = jnp.zeros((batch, 1), jnp.int32)
  keys = jax.random.split(jax.random.key(0), batch)
  return loop.initial_state(tokens, jnp.ones((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32), eos, keys,
                            target, ring, out_len, tree, num_variants, logprobs, features)


def _put(dst: jax.Array, x: jax.Array, values: jax.Array) -> jax.Array:
  """x [B, ...] with rows dst [n] set to values [n, ...]; dst == B is dropped."""
  return x.at[dst].set(values if values.dtype == x.dtype else values.astype(x.dtype), mode="drop")


def _put_cache(dst, cache: tuple, pre: tuple, rows: jax.Array) -> tuple:
  """Per-layer [B, K, S, D] buffers: rows dst take the first S' slots of prefilled rows `rows` [n]. A ring
  layer has the same size in both (cache.ring_sizes: the same margin), or the prefill's is linear and no
  longer than the state's (position p at slot p in both): the slot pattern is the same."""
  return tuple(c.at[dst, :, :p.shape[2]].set(p[rows].astype(c.dtype), mode="drop") for c, p in zip(cache, pre))


def insert(state: loop.LoopState, target: KVCache, ring: Any, tokens: jax.Array, lengths: jax.Array,
           slots: jax.Array, rows: jax.Array, stream_ids: jax.Array, max_new: jax.Array, seed: jax.Array,
           features: dict | None = None, *, spec: DraftSpec | None) -> loop.LoopState:
  """Write prefilled rows into free slots.

  target / ring / tokens [k, P] / lengths [k]: a `loop.prefill` batch (its cache may have fewer slots than
  the state's). slots [n]: destination slot of each entry (B: padding, skipped); rows [n]: the prefilled row
  it takes; stream_ids [n] (uint32) and seed []: its PRNG key, fold_in(key(seed), stream id), the same key
  `generate` gives that stream; max_new [n]: its token budget; features: the row features' states of the
  n entries ([n, ...] each, row_features.fill; the same features as the state's).
  """
  rs = state.rows
  b = rs.lengths.shape[0]
  dst = jnp.where((slots >= 0) & (slots < b), slots, b)
  base = jax.random.key(seed)
  keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(stream_ids)
  if sorted(features or {}) != sorted(rs.features):
    raise ValueError(f"insert got row feature states {sorted(features or {})}, the state holds {sorted(rs.features)}")
  fresh = fresh_rows(tokens[rows], lengths[rows], max_new, keys, out_len=rs.out.shape[1],
                     depth=rs.accepted_at.shape[1], logprobs=logprob_width(rs), features=features)
  new_target = state.target.replace(k=_put_cache(dst, state.target.k, target.k, rows),
                                    v=_put_cache(dst, state.target.v, target.v, rows))
  new_ring = state.ring if spec is None else spec.insert_rows(state.ring, ring, dst, rows)
  return state.replace(rows=jax.tree.map(lambda x, v: _put(dst, x, v), rs, fresh), target=new_target,
                       ring=new_ring)
