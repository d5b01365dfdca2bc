"""Pure jnp operations over an `AutomatonTable`: fixed shapes, jit-friendly, one [.., V] gather per mask.

A row's constraint state is (auto [B] int32: its automaton in the table, state: a local state, -1 dead).
`state` may carry extra dims after the batch ([B], [B, N] for the N nodes of a tree, ...); `auto` is [B].
Unconstrained rows are automaton FREE (0), state 0: every token allowed, always accepting, never forced.
The table's arrays may be numpy (as `build_table` makes them) or already placed on a device.
A dead state (-1: a token that was not allowed was taken) allows nothing, so a path through a rejected token
masks everything after it; a loop must not sample from an all-False mask.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.constraints.table import DEAD, AutomatonTable


def _per_row(auto: jax.Array, like: jax.Array) -> jax.Array:
  """auto [B] broadcast to like's shape [B, ...]."""
  return jnp.broadcast_to(auto.reshape(auto.shape + (1,) * (like.ndim - auto.ndim)), like.shape)


def state_rows(table: AutomatonTable, auto: jax.Array, state: jax.Array) -> jax.Array:
  """The global rows (of next_state / accepting / forced / done) of local states: [B, ...] int32."""
  return jnp.where(state >= 0, jnp.asarray(table.offset)[_per_row(auto, state)] + state, DEAD)


def start_states(auto: jax.Array) -> jax.Array:
  """Every automaton starts in local state 0: [B] int32."""
  return jnp.zeros(auto.shape, jnp.int32)


def allowed(table: AutomatonTable, auto: jax.Array, state: jax.Array) -> jax.Array:
  """[B, ..., V] bool: the tokens allowed in each state (EOS only where accepting)."""
  rows = jnp.asarray(table.next_state)[state_rows(table, auto, state)]      # [B, ..., C]
  classes = jnp.asarray(table.token_class)[auto]                             # [B, V]
  return jax.vmap(lambda r, c: r[..., c])(rows, classes) >= 0


def advance(table: AutomatonTable, auto: jax.Array, state: jax.Array, token: jax.Array) -> jax.Array:
  """The state after `token` (same shape as state): -1 where the token is not allowed (or state is dead);
  EOS leaves an accepting state unchanged."""
  cls = jnp.asarray(table.token_class)[_per_row(auto, token), token]
  return jnp.asarray(table.next_state)[state_rows(table, auto, state), cls]


def chain_states(table: AutomatonTable, auto: jax.Array, state: jax.Array, tokens: jax.Array) -> jax.Array:
  """[B, K + 1]: state, then the state after each of tokens [B, K] in turn."""
  def step(s, t):
    n = advance(table, auto, s, t)
    return n, n
  _, after = jax.lax.scan(step, state, tokens.T)
  return jnp.concatenate([state[:, None], after.T], axis=1)


def tree_states(table: AutomatonTable, auto: jax.Array, state: jax.Array, tokens: jax.Array,
                parents: Sequence[int]) -> jax.Array:
  """[B, N]: the state at each node of a token tree, i.e. after the tokens on its path from the root.
  Node 0 is the root (its token already consumed: its state is `state` [B]); node i > 0 holds token
  tokens[:, i] under parents[i] (static, e.g. `Tree.parents`). One `advance` per tree level."""
  parents = np.asarray(parents, np.int64)
  n = len(parents)
  if tokens.shape[1] != n or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
    raise ValueError(f"tree of {n} nodes needs parents[0] == -1, 0 <= parents[i] < i and tokens [B, {n}], "
                     f"got parents {tuple(parents)} and tokens {tokens.shape}")
  depth = np.zeros(n, np.int64)
  for i in range(1, n):
    depth[i] = depth[parents[i]] + 1
  out = jnp.zeros(tokens.shape, jnp.int32).at[:, 0].set(state)
  for d in range(1, int(depth.max(initial=0)) + 1):
    idx = np.flatnonzero(depth == d)
    out = out.at[:, idx].set(advance(table, auto, out[:, parents[idx]], tokens[:, idx]))
  return out


def forced(table: AutomatonTable, auto: jax.Array, state: jax.Array) -> jax.Array:
  """The one token allowed in each state (not accepting), else -1: [B, ...] int32."""
  return jnp.asarray(table.forced)[state_rows(table, auto, state)]


def is_accepting(table: AutomatonTable, auto: jax.Array, state: jax.Array) -> jax.Array:
  """Whether the output may end here (EOS allowed): [B, ...] bool."""
  return jnp.asarray(table.accepting)[state_rows(table, auto, state)]


def is_done(table: AutomatonTable, auto: jax.Array, state: jax.Array) -> jax.Array:
  """Accepting with nothing but EOS allowed: the output is complete. [B, ...] bool."""
  return jnp.asarray(table.done)[state_rows(table, auto, state)]
