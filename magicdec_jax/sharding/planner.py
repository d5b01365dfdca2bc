"""Memory planner: bytes per device of params, target KV cache, draft KV cache and activations.

Why: on an accelerator an oversize configuration fails late (after minutes of compilation) with an
allocator error that names no cause. The planner counts, from shapes and the partition rules alone, what
each device holds; `generate` and run.py refuse a configuration whose total exceeds the device memory
before anything compiles, naming every figure.

Params, a draft model's params and KV caches are exact (shape x itemsize / the number of devices the rules
split each array over; a windowed layer's target cache is its ring, cache.ring_sizes). A weight copy
(bfloat16, int8, int4) is its bytes per element times its source's bytes, an estimate: its scales and the
norms a copy keeps in float32 are left out (under 1% at SmolLM2's shape; more on tiny models), and a model
draft's copy is counted beside that model's own weights, which the caller's Model keeps on the device.
Activations are an
estimate: the largest set of transient buffers live at once, the max over prefill (one chunk through one layer, plus a model draft's temporary linear cache and SnapKV's
scores) and one decode round (tree-wide logits over the vocabulary for target and draft, one layer's
attention scores over the whole cache, the MLP's hidden columns). XLA's own scratch is not included.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from magicdec_jax.cache import aligned_slots, ring_margin, ring_sizes
from magicdec_jax.config import ModelConfig, expected_shapes, is_shape
from magicdec_jax.sharding import rules
from magicdec_jax.sharding.mesh import axis_sizes, describe
from magicdec_jax.tuning.costmodel import copy_resident_bytes

GiB = float(1 << 30)


class DoesNotFit(ValueError):
  """A configuration the planner says exceeds device memory (the message names every figure)."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes per device (the most loaded device) for one generate configuration."""
  mesh: str
  batch: int
  max_context: int           # target cache slots (prompt bucket + new-token bucket + tree + 1)
  params: int
  draft_params: int
  target_kv: int
  draft_kv: int
  activations: int

  @property
  def total(self) -> int:
    return self.params + self.draft_params + self.target_kv + self.draft_kv + self.activations

  def describe(self) -> str:
    g = human_bytes
    return (f"{g(self.total)} per device = params {g(self.params)} + draft params {g(self.draft_params)} "
            f"+ target KV {g(self.target_kv)} + draft KV {g(self.draft_kv)} + activations "
            f"{g(self.activations)} (mesh {self.mesh}, batch {self.batch}, context {self.max_context} slots)")


def human_bytes(n: float) -> str:
  for unit, size in (("GiB", GiB), ("MiB", float(1 << 20)), ("KiB", 1024.0)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{int(n)} B"


def _sizes(mesh) -> tuple[int, int]:
  return (1, 1) if mesh is None else axis_sizes(mesh)


def _split(spec, shape, sizes: dict) -> int:
  """How many ways a spec (after rules.fit) splits an array."""
  n = 1
  for i, ax in enumerate(spec):
    if ax is not None and shape[i] % sizes[ax] == 0:
      n *= sizes[ax]
  return n


def param_bytes(cfg: ModelConfig, mesh=None) -> int:
  """Bytes of cfg's params on one device under the partition rules."""
  d, m = _sizes(mesh)
  lay = rules.layout_for(cfg, m)
  sizes = {"data": d, "model": m}
  shapes = expected_shapes(cfg)
  specs = rules.param_specs(shapes, lay)
  total = 0
  for shape, spec in zip(jax.tree.leaves(shapes, is_leaf=is_shape),
                         jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
    total += math.prod(shape) * cfg.jnp_dtype.itemsize // _split(spec, shape, sizes)
  return total


def cache_bytes(cfg: ModelConfig, mesh, batch: int, slots) -> int:
  """K and V of a cache of L x [B, K, slots, D] buffers on one device; slots: one count for every layer,
  or one per layer (a target cache whose windowed layers are rings: cache.ring_sizes)."""
  d, m = _sizes(mesh)
  spec = rules.cache_spec(rules.layout_for(cfg, m))
  total = 0
  for s in ((slots,) * cfg.num_layers if isinstance(slots, int) else slots):
    shape = (batch, cfg.num_kv_heads, s, cfg.head_dim)
    total += 2 * math.prod(shape) * cfg.jnp_dtype.itemsize // _split(spec, shape, {"data": d, "model": m})
  return total


def plan_memory(cfg: ModelConfig, mesh, *, batch: int, max_context: int, draft=None, tree_nodes: int = 1,
                prompt_len: int | None = None, chunk: int = 256) -> MemoryPlan:
  """Per-device bytes for generate(): batch rows (padded), max_context target-cache slots, a draft
  (a drafts.Draft or its spec, or None: it says its own footprint), a tree of `tree_nodes` nodes
  (1 = autoregressive, gamma + 1 for a chain), prompts padded to `prompt_len` (default max_context)."""
  d, m = _sizes(mesh)
  bd = batch // d if batch % d == 0 else batch                 # rows per device
  prompt_len = max_context if prompt_len is None else prompt_len
  chunk = min(chunk, prompt_len)
  f32 = 4
  lay = rules.layout_for(cfg, m)
  mv = m if lay.embed == "vocab" else 1
  mq = m if lay.q_axis else 1
  mf = m if lay.mlp else 1
  it = cfg.jnp_dtype.itemsize
  params = param_bytes(cfg, mesh)
  layer_slots = ring_sizes(cfg, max_context, ring_margin(tree_nodes, chunk))   # windowed layers: rings
  target_kv = cache_bytes(cfg, mesh, batch, layer_slots)
  draft_params = draft_kv = 0
  prefill_extra = 0
  n = tree_nodes
  if draft is not None:
    fp = draft.spec.footprint(cfg, n, max_context)
    draft_kv = bd * fp.row_bytes
    if fp.ring is not None:
      draft_kv += cache_bytes(fp.ring, mesh, batch, aligned_slots(fp.ring_slots))
    if fp.weights is not None:
      draft_params = param_bytes(fp.weights, mesh)
    if fp.weight_copy is not None:                 # a narrower / quantized copy held beside the weights
      src = fp.weights or cfg
      draft_params += int(param_bytes(src, mesh) * copy_resident_bytes(src, fp.weight_copy)
                          / src.jnp_dtype.itemsize)
    if fp.prefill_cache is not None:
      prefill_extra = cache_bytes(fp.prefill_cache, mesh, batch, prompt_len)   # its own linear prefill cache
    kv_split = m if lay.kv_axis else 1
    prefill_extra += (fp.prefill_score_buffers * cfg.num_layers * bd * cfg.num_kv_heads * max_context * f32
                      // kv_split)

  def layer_transients(t: int) -> int:
    scores = 2 * bd * cfg.num_heads * t * max(layer_slots) * f32 // mq    # logits + probs, one layer
    mlp = 3 * bd * t * cfg.intermediate_size * it // mf                      # gate, up, product
    hidden = 4 * bd * t * cfg.hidden_size * f32
    return scores + mlp + hidden

  vocab_rows = (2 + (draft is not None)) * bd * n * cfg.vocab_size * f32 // mv
  decode = layer_transients(n) + vocab_rows
  prefill = layer_transients(chunk) + prefill_extra
  return MemoryPlan(describe(mesh) if mesh is not None else "single device", batch, max_context, params,
                    draft_params, target_kv, draft_kv, max(decode, prefill))


def device_memory(mesh=None) -> int | None:
  """The smallest `bytes_limit` among the (local) devices, or None where the backend reports none (CPU)."""
  devs = jax.local_devices() if mesh is None else [x for x in np.ravel(mesh.devices)
                                                  if x.process_index == jax.process_index()]
  limits = []
  for dev in devs:
    try:
      stats = dev.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats
      stats = None
    if not stats or "bytes_limit" not in stats:
      return None
    limits.append(int(stats["bytes_limit"]))
  return min(limits) if limits else None


def check_fits(plan: MemoryPlan, limit: int | None) -> None:
  """Raise DoesNotFit (a ValueError) naming the numbers when the plan exceeds `limit` bytes per device
  (None: no check)."""
  if limit is None:
    return
  if plan.total > limit:
    raise DoesNotFit(f"configuration does not fit device memory: needs {plan.describe()}, but a device "
                     f"has {human_bytes(limit)} ({plan.total} > {limit} bytes); use a larger model axis, "
                     "a smaller batch or a shorter context")
