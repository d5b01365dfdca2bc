"""Slots for continuous batching: an all-free decode state, and `insert` of freshly prefilled rows.

The decode state has B slots. `insert(state, prefilled, slots, ...)` writes k prefilled prompts into chosen
free slots in one jitted call whose slot indices are traced (one executable for every choice of slots);
the state is donated, so only the chosen rows are written in place. Everything a slot holds is reset:
lengths, pending / previous token, output buffer and count, log-probability buffers (where the state has
them), done, budget, PRNG key, per-row counters, its draft-ring rows (the draft's `insert_rows`: copied
from the new prompt's prefill) and its target-cache rows (the prefilled slots are copied; slots past them
keep the old occupant's K/V, which no query can see: attention is masked by the row's length). A
destination equal to B marks a padding entry and is dropped by the scatter. One prefilled row may go to
several slots (n samples of one prompt, each with its own stream id).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from magicdec_jax import loop
from magicdec_jax.cache import KVCache, ring_margin
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import DraftSpec
from magicdec_jax.sampling import RowSampling
from magicdec_jax.trees import Tree

LOGPROB_FIELDS = ("out_logprob", "out_top_ids", "out_top_logprob")   # per-row log-probability buffers


def empty_state(eos: jax.Array, *, cfg: ModelConfig, spec: DraftSpec | None, tree: Tree, batch: int,
                num_slots: int, out_len: int, num_variants: int = 1, logprobs: int = -1) -> loop.LoopState:
  """A LoopState of `batch` free slots (every row done, zero caches), ready for `insert`; logprobs: as
  loop.initial_state's."""
  target = KVCache.zeros(cfg, batch, num_slots, ring_margin(tree.num_nodes))
  ring = None if spec is None else spec.empty_ring(cfg, batch, tree, num_slots)
  tokens = jnp.zeros((batch, 1), jnp.int32)
  keys = jax.random.split(jax.random.key(0), batch)
  return loop.initial_state(tokens, jnp.ones((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32), eos, keys,
                            target, ring, out_len, tree, num_variants, logprobs)


def _put(dst: jax.Array, x: jax.Array, values: jax.Array) -> jax.Array:
  """x [B, ...] with rows dst [n] set to values [n, ...]; dst == B is dropped."""
  return x.at[dst].set(values.astype(x.dtype), mode="drop")


def _put_cache(dst, cache: tuple, pre: tuple, rows: jax.Array) -> tuple:
  """Per-layer [B, K, S, D] buffers: rows dst take the first S' slots of prefilled rows `rows` [n]. A ring
  layer has the same size in both (cache.ring_sizes: the same margin), or the prefill's is linear and no
  longer than the state's (position p at slot p in both): the slot pattern is the same."""
  return tuple(c.at[dst, :, :p.shape[2]].set(p[rows].astype(c.dtype), mode="drop") for c, p in zip(cache, pre))


def insert(state: loop.LoopState, target: KVCache, ring: Any, tokens: jax.Array, lengths: jax.Array,
           slots: jax.Array, rows: jax.Array, stream_ids: jax.Array, max_new: jax.Array, seed: jax.Array,
           row_sampling: RowSampling, *, spec: DraftSpec | None) -> loop.LoopState:
  """Write prefilled rows into free slots.

  target / ring / tokens [k, P] / lengths [k]: a `loop.prefill` batch (its cache may have fewer slots than
  the state's). slots [n]: destination slot of each entry (B: padding, skipped); rows [n]: the prefilled row
  it takes; stream_ids [n] (uint32) and seed []: its PRNG key, fold_in(key(seed), stream id), the same key
  `generate` gives that stream; max_new [n]: its token budget; row_sampling [n]: its sampling settings
  (read by a per-row Sampling only).
  """
  b = state.lengths.shape[0]
  dst = jnp.where((slots >= 0) & (slots < b), slots, b)
  n = slots.shape[0]
  toks, lens = tokens[rows], lengths[rows]
  ar = jnp.arange(n)
  base = jax.random.key(seed)
  keys = jax.vmap(lambda s: jax.random.fold_in(base, s))(stream_ids)
  new_target = state.target.replace(k=_put_cache(dst, state.target.k, target.k, rows),
                                    v=_put_cache(dst, state.target.v, target.v, rows))
  new_ring = state.ring if spec is None else spec.insert_rows(state.ring, ring, dst, rows)
  zeros = jnp.zeros((n,), jnp.int32)
  lp = {f: _put(dst, getattr(state, f), jnp.zeros((n,) + getattr(state, f).shape[1:]))
        for f in LOGPROB_FIELDS if getattr(state, f).size}      # (placeholders of logprobs off: nothing)
  return state.replace(
      out=_put(dst, state.out, jnp.full((n, state.out.shape[1]), -1, jnp.int32)),
      n_out=_put(dst, state.n_out, zeros),
      lengths=_put(dst, state.lengths, lens), last=_put(dst, state.last, toks[ar, lens - 1]),
      prev=_put(dst, state.prev, toks[ar, jnp.maximum(lens - 2, 0)]),
      done=_put(dst, state.done, max_new <= 0),
      max_new=_put(dst, state.max_new, max_new), keys=state.keys.at[dst].set(keys, mode="drop"),
      target=new_target, ring=new_ring, rounds=_put(dst, state.rounds, zeros),
      accepted=_put(dst, state.accepted, zeros), drafted=_put(dst, state.drafted, zeros),
      accepted_at=_put(dst, state.accepted_at, jnp.zeros((n, state.accepted_at.shape[1]), jnp.int32)),
      row_sampling=jax.tree.map(lambda x, v: _put(dst, x, v), state.row_sampling, row_sampling), **lp)
