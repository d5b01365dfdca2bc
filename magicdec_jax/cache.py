"""KV caches as fixed-shape pytrees.

`KVCache` is the target's linear cache: slot s holds position s, per-row lengths live in the loop state.
`RingCache` is a draft's StreamingLLM cache: `num_static` slots that never move (sink tokens, or SnapKV's
selected tokens), a ring of `window` slots for recent committed positions (position j lives at slot
num_static + j % window), and `scratch` slots holding this round's speculative nodes. Speculative tokens
never enter the ring, so a rejection can never evict a live entry: only committed positions are written
there, after verification.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from magicdec_jax.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  k: jax.Array  # [L, B, S, K, D]
  v: jax.Array  # [L, B, S, K, D]

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, num_slots: int) -> "KVCache":
    shape = (cfg.num_layers, batch, num_slots, cfg.num_kv_heads, cfg.head_dim)
    return cls(jnp.zeros(shape, cfg.jnp_dtype), jnp.zeros(shape, cfg.jnp_dtype))

  @property
  def num_slots(self) -> int:
    return self.k.shape[2]


@flax.struct.dataclass
class RingCache:
  k: jax.Array    # [L, B, num_static + window + scratch, K, D]
  v: jax.Array
  pos: jax.Array  # [B, num_static + window] int32 position held by each static/ring slot, -1 if empty
  sink: int = flax.struct.field(pytree_node=False)        # positions < sink live in static slot j
  num_static: int = flax.struct.field(pytree_node=False)  # sink, or SnapKV's budget
  window: int = flax.struct.field(pytree_node=False)

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, sink: int, num_static: int, window: int,
            scratch: int) -> "RingCache":
    shape = (cfg.num_layers, batch, num_static + window + scratch, cfg.num_kv_heads, cfg.head_dim)
    pos = jnp.full((batch, num_static + window), -1, jnp.int32)
    return cls(jnp.zeros(shape, cfg.jnp_dtype), jnp.zeros(shape, cfg.jnp_dtype), pos,
               sink=sink, num_static=num_static, window=window)

  @property
  def scratch_start(self) -> int:
    return self.num_static + self.window

  def slot_of(self, positions: jax.Array) -> jax.Array:
    """Static/ring slot of committed positions (any int shape)."""
    return jnp.where(positions < self.sink, positions,
                     self.num_static + jnp.mod(positions, self.window))

  def visible(self, q_pos: jax.Array, before: jax.Array) -> jax.Array:
    """[B, T] query positions, [B] first uncommitted-in-ring position -> [B, T, static+window] mask.

    A query at p sees the static slots and the ring positions in (p - window, p], restricted to
    positions < `before` (later positions are served from the scratch slots this round).
    """
    pos = self.pos[:, None, :]
    p = q_pos[:, :, None]
    is_static = jnp.arange(self.pos.shape[1]) < self.num_static
    live = (pos >= 0) & (pos < before[:, None, None]) & (pos <= p)
    return live & (is_static[None, None, :] | (pos > p - self.window))

  def write_committed(self, k: jax.Array, v: jax.Array, positions: jax.Array,
                      valid: jax.Array) -> "RingCache":
    """Write K/V [L, B, M, K, D] of committed `positions` [B, M] where `valid` [B, M]."""
    slots = jnp.where(valid, self.slot_of(positions), self.k.shape[2])  # out of range -> dropped
    rows = jnp.arange(positions.shape[0])[:, None]
    new_k = self.k.at[:, rows, slots].set(k.astype(self.k.dtype), mode="drop")
    new_v = self.v.at[:, rows, slots].set(v.astype(self.v.dtype), mode="drop")
    new_pos = self.pos.at[rows, slots].set(positions, mode="drop")
    return self.replace(k=new_k, v=new_v, pos=new_pos)


def gather_slots(cache_k: jax.Array, cache_v: jax.Array, slots: jax.Array):
  """Per-row gather of slots [B, M] from [L, B, S, K, D] caches -> two [L, B, M, K, D] arrays."""
  rows = jnp.arange(slots.shape[0])[:, None]
  safe = jnp.clip(slots, 0, cache_k.shape[2] - 1)
  return cache_k[:, rows, safe], cache_v[:, rows, safe]
