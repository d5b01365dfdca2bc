"""KV caches as fixed-shape pytrees.

Layout [L, B, K, S, D] (layer, batch, KV head, slot, head dim): each (row, KV head) reads one contiguous
[S, D] block, which is what both the batched matmuls and a split-K attention kernel want.
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
  k: jax.Array  # [L, B, K, S, D]
  v: jax.Array  # [L, B, K, S, D]

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, num_slots: int) -> "KVCache":
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, num_slots, cfg.head_dim)
    return cls(jnp.zeros(shape, cfg.jnp_dtype), jnp.zeros(shape, cfg.jnp_dtype))

  @property
  def num_slots(self) -> int:
    return self.k.shape[3]


@flax.struct.dataclass
class RingCache:
  k: jax.Array    # [L, B, K, num_static + window + scratch, D]
  v: jax.Array
  pos: jax.Array  # [B, num_static + window] int32 position held by each static/ring slot, -1 if empty
  sink: int = flax.struct.field(pytree_node=False)        # positions < sink live in static slot j
  num_static: int = flax.struct.field(pytree_node=False)  # sink, or SnapKV's budget
  window: int = flax.struct.field(pytree_node=False)

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, sink: int, num_static: int, window: int,
            scratch: int) -> "RingCache":
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, num_static + window + scratch, cfg.head_dim)
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
    """Write K/V [L, B, K, M, D] of committed `positions` [B, M] where `valid` [B, M]."""
    slots = jnp.where(valid, self.slot_of(positions), self.k.shape[3])  # out of range -> dropped
    rows = jnp.arange(positions.shape[0])[:, None]
    new_pos = self.pos.at[rows, slots].set(positions, mode="drop")
    return self.replace(k=put_slots(self.k, slots, k), v=put_slots(self.v, slots, v), pos=new_pos)


def gather_slots(cache_k: jax.Array, cache_v: jax.Array, slots: jax.Array):
  """Per-row gather of slots [B, M] from [L, B, K, S, D] caches -> two [L, B, K, M, D] arrays."""
  safe = jnp.clip(slots, 0, cache_k.shape[3] - 1)
  take = jax.vmap(lambda c, s: c[:, :, s], in_axes=(1, 0), out_axes=1)
  return take(cache_k, safe), take(cache_v, safe)


def put_slots(cache: jax.Array, slots: jax.Array, values: jax.Array) -> jax.Array:
  """Per-row write of values [L, B, K, M, D] at slots [B, M] (out-of-range slots are dropped)."""
  put = jax.vmap(lambda c, s, x: c.at[:, :, s].set(x.astype(c.dtype), mode="drop"), in_axes=(1, 0, 1),
                 out_axes=1)
  return put(cache, slots, values)
