"""KV caches as fixed-shape pytrees of per-layer buffers.

Each cache holds one K and one V buffer per layer (tuples of L arrays [B, K, S, D]: batch, KV head, slot,
head dim), not one stacked [L, ...] array: a layer reads and writes its own buffer in place, so the
compiled decode step never copies a layer's cache out of a stack (docs/measurements.md#notes-per-layer: that
copy plus the pad that followed it cost 24 ms of a 54 ms step at 8 x 32K). [S, D] blocks are contiguous per
(row, KV head), which is what the batched matmuls and the split-K attention kernel want.

`KVCache` is the target's cache: slot s holds position s (per-row lengths live in the loop state), except
in a layer with a sliding window w, whose buffer is a ring of R slots (`ring_sizes`: R >= w + a round's
tree + 1 and >= w + a prefill chunk) holding position p at slot p % R, so Gemma 3 at 32K context keeps
~1.3K slots in five of its six layers. Callers address every layer by the linear slot ("virtual slot":
position, or base + node index in a round); `layer_slots` maps it, and the model sees a ring layer through
`layers.attention.ring_rule`, which masks by the position each slot holds. A ring slot is valid once
every virtual slot below the round's top has been written in order (prefill chunks, then each round's
nodes), which the prefill keeps by writing no padding position past a row's length.
`RingCache` is a draft's StreamingLLM cache: `num_static` slots that never move (sink tokens, or SnapKV's
selected tokens), a ring of `window` slots for recent committed positions (position j lives at slot
num_static + j % window), and `scratch` slots holding this round's speculative nodes. Speculative tokens
never enter the ring, so a rejection can never evict a live entry: only committed positions are written
there, after verification.

Slot counts are rounded up to a multiple of `slot_align()` (`aligned_slots`) by the engine and the ring
constructor, so attention over a cache never needs a padded copy of it; the extra slots are never visible.
On an accelerator that is the attention tile (128); on a CPU only the vector width matters, and the slots
past the live ones are read by every attention dot: a draft ring of sink 4 + window 256 + 3 scratch took
384 slots at 128, 272 at 16, and the 30-layer ring attention of SmolLM2 at batch 8 fell from 12.7 to 9.0 ms
(docs/measurements.md#notes-draft-step-profile).
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from magicdec_jax import backend
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.attention import write_rows

MAX_CHUNK = 256      # the longest prefill chunk (plan.DecodePlan.chunk): a ring's room for one beyond its window
SLOT_ALIGN = 128      # attention tile: XLA's GPU dot tiles and the Pallas kernel's block_k divide it
CPU_SLOT_ALIGN = 16   # a CPU has no tile to fill: the logits' slot axis fills whole 16-lane float32 vectors
Layers = tuple        # one jax.Array per layer


def slot_align() -> int:
  """The slot-count multiple for caches on the default backend (CPU_SLOT_ALIGN on a CPU, else SLOT_ALIGN)."""
  return CPU_SLOT_ALIGN if backend.name() == "cpu" else SLOT_ALIGN


def aligned_slots(n: int) -> int:
  """n rounded up to a multiple of slot_align()."""
  align = slot_align()
  return -(-int(n) // align) * align


def ring_margin(tree_nodes: int, chunk: int = MAX_CHUNK) -> int:
  """Slots a windowed layer's ring keeps beyond its window: a round's tree nodes (+ the pending token), so
  no rejected node overwrites a key some query of the round still sees, and a prefill chunk."""
  return max(int(chunk), MAX_CHUNK, int(tree_nodes) + 1)


def ring_sizes(cfg: ModelConfig, num_slots: int, margin: int | None) -> tuple[int, ...]:
  """Per-layer slot counts of a target cache of `num_slots` linear slots: a windowed layer keeps
  aligned_slots(window + margin) when that is smaller (a ring), every other layer num_slots (linear).
  margin None: every layer linear (a full cache, for one-shot forwards over many tokens)."""
  sizes = []
  for i in range(cfg.num_layers):
    w = cfg.layer_window(i)
    sizes.append(num_slots if margin is None or w is None else min(num_slots, aligned_slots(w + margin)))
  return tuple(sizes)


def _zeros(cfg: ModelConfig, batch: int, sizes) -> Layers:
  sizes = (sizes,) * cfg.num_layers if isinstance(sizes, int) else sizes
  return tuple(jnp.zeros((batch, cfg.num_kv_heads, s, cfg.head_dim), cfg.jnp_dtype) for s in sizes)


@flax.struct.dataclass
class KVCache:
  k: Layers  # L x [B, K, S_l, D]: S_l = num_slots (linear) or a windowed layer's ring size
  v: Layers  # L x [B, K, S_l, D]
  length: int | None = flax.struct.field(pytree_node=False, default=None)   # linear slots (None: k[0]'s)

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, num_slots: int, margin: int | None = None) -> "KVCache":
    """A zero cache of `num_slots` linear slots; with `margin` (ring_margin) windowed layers are rings."""
    sizes = ring_sizes(cfg, num_slots, margin)
    return cls(_zeros(cfg, batch, sizes), _zeros(cfg, batch, sizes), length=int(num_slots))

  @property
  def num_slots(self) -> int:
    """Linear slots: positions 0 .. num_slots - 1 can be written (a ring layer keeps the latest of them)."""
    return self.k[0].shape[2] if self.length is None else self.length

  def is_ring(self, layer: int) -> bool:
    return self.k[layer].shape[2] != self.num_slots

  def layer_slots(self, layer: int, slots: jax.Array) -> jax.Array:
    """Virtual (linear) slots -> slots of layer `layer`'s buffer: slot % R in a ring; out of range (how
    callers say "do not write") stays out of range."""
    if not self.is_ring(layer):
      return slots
    size = self.k[layer].shape[2]
    return jnp.where((slots >= 0) & (slots < self.num_slots), jnp.mod(slots, size), size)

  def slot_positions(self, layer: int, top: jax.Array) -> jax.Array:
    """[B, S_l] the position each slot of layer `layer` holds once virtual slots 0 .. top - 1 ([B]) are
    written: s in a linear layer, the latest v = s (mod R) below top in a ring; -1: none."""
    size = self.k[layer].shape[2]
    s = jnp.arange(size, dtype=jnp.int32)[None, :]
    v = s + size * jnp.floor_divide(top[:, None].astype(jnp.int32) - 1 - s, size) if self.is_ring(layer) else s
    return jnp.where((v >= 0) & (v < top[:, None]), v, -1)

  def gather(self, slots: jax.Array) -> tuple[Layers, Layers]:
    """Per-row gather of virtual slots [B, M] from every layer -> L x [B, K, M, D] each (clipped to range)."""
    safe = jnp.clip(slots, 0, self.num_slots - 1)
    return gather_slots(self.k, self.v, tuple(self.layer_slots(i, safe) for i in range(len(self.k))))

  def put(self, slots: jax.Array, k: Layers, v: Layers) -> "KVCache":
    """Per-row write of L x [B, K, M, D] at virtual slots [B, M] (out-of-range slots are dropped)."""
    per = tuple(self.layer_slots(i, slots) for i in range(len(self.k)))
    return self.replace(k=put_slots(self.k, per, k), v=put_slots(self.v, per, v))


@flax.struct.dataclass
class RingCache:
  k: Layers       # L x [B, K, num_static + window + scratch (+ alignment), D]
  v: Layers
  pos: jax.Array  # [B, num_static + window] int32 position held by each static/ring slot, -1 if empty
  sink: int = flax.struct.field(pytree_node=False)        # positions < sink live in static slot j
  num_static: int = flax.struct.field(pytree_node=False)  # sink, or SnapKV's budget
  window: int = flax.struct.field(pytree_node=False)

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, sink: int, num_static: int, window: int,
            scratch: int) -> "RingCache":
    slots = aligned_slots(num_static + window + scratch)
    pos = jnp.full((batch, num_static + window), -1, jnp.int32)
    return cls(_zeros(cfg, batch, slots), _zeros(cfg, batch, slots), pos,
               sink=sink, num_static=num_static, window=window)

  @property
  def num_slots(self) -> int:
    return self.k[0].shape[2]

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

  def write_committed(self, k: Layers, v: Layers, positions: jax.Array, valid: jax.Array) -> "RingCache":
    """Write K/V (L x [B, K, M, D]) of committed `positions` [B, M] where `valid` [B, M].

    Of several valid positions that map to one slot (more than `window` committed at once) only the
    latest is written: every slot receives at most one update, so no backend's choice among duplicate
    scatter indices can matter.
    """
    slots = self.slot_of(positions)
    later_same_slot = ((slots[:, None, :] == slots[:, :, None]) & valid[:, None, :]
                       & (positions[:, None, :] > positions[:, :, None])).any(-1)    # [B, M]
    keep = valid & ~later_same_slot
    slots = jnp.where(keep, slots, self.num_slots)                                  # out of range -> dropped
    rows = jnp.arange(positions.shape[0])[:, None]
    new_pos = self.pos.at[rows, slots].set(positions, mode="drop")
    return self.replace(k=put_slots(self.k, slots, k), v=put_slots(self.v, slots, v), pos=new_pos)


def _per_layer(slots, num_layers: int) -> tuple:
  """One slots array for every layer, or already a tuple of one per layer."""
  return tuple(slots) if isinstance(slots, (tuple, list)) else (slots,) * num_layers


def gather_slots(cache_k: Layers, cache_v: Layers, slots) -> tuple[Layers, Layers]:
  """Per-row gather of slots [B, M] (or one [B, M] per layer) from per-layer [B, K, S, D] buffers
  -> L x [B, K, M, D] each; slots are clipped to each buffer's range."""
  def take(c, s):
    return jnp.take_along_axis(c, jnp.clip(s, 0, c.shape[2] - 1)[:, None, :, None], axis=2)
  per = _per_layer(slots, len(cache_k))
  return tuple(map(take, cache_k, per)), tuple(map(take, cache_v, per))


def put_slots(cache: Layers, slots, values: Layers) -> Layers:
  """Per-row write of L x [B, K, M, D] values at slots [B, M] (or one [B, M] per layer; out-of-range
  slots are dropped)."""
  return tuple(write_rows(c, s, jnp.swapaxes(x, 1, 2))
               for c, s, x in zip(cache, _per_layer(slots, len(cache)), values))
