"""Partition rules: which dimension of every param, cache and loop-state array is split over which axis.

Tensor parallelism (Megatron-style, expressed as shardings only; XLA inserts the collectives):
  * q/k/v, gate/up are column-parallel (output heads / MLP columns split over "model"); o and down are
    row-parallel (their input dim split), so each layer needs one all-reduce after attention and one after
    the MLP;
  * the embedding (and an untied LM head) is split over the vocabulary, else over the hidden dim;
  * q/k/v biases split with their projection's heads; o's bias, norm scales (q/k norms included) are
    replicated; everything is replicated over "data".
KV caches (per-layer [B, K, S, D] buffers) split B over "data" and K over "model"; the draft's ring likewise, by its own
model's layout. Per-row loop state splits its batch dim over "data".

Fewer KV heads than model-axis devices (SmolLM2: 3 KV heads; any model size 1..8 must work). Per model:
  * "heads"      K % m == 0: q/k/v/o and the KV caches are split by head (the normal case);
  * "q_heads"    m % K == 0 and each device's query heads share one KV head: query heads (q, o) are split,
                 K/V projections and caches are replicated over "model" (vLLM's KV-head replication: each
                 device computes and stores every KV head, attends with its own query heads; inside
                 the decode loop XLA in fact keeps the cache split over part of the model axis and
                 re-replicates it once on exit, as the compiled HLO shows);
  * "replicated" otherwise (SmolLM2 on 2, 4, 8 devices: 9 heads / 3 KV heads): attention weights and KV
                 caches are replicated over "model" (still split over "data"); the MLP and the vocabulary
                 stay split. The memory planner counts the replicated caches, so a config that no longer
                 fits is refused rather than silently run.
A dimension is only ever split when the axis size divides it (shardings stay even; no padding).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from magicdec_jax.config import ModelConfig, expected_shapes, is_shape, weight_at
from magicdec_jax.layers.quant import QuantizedWeight
from magicdec_jax.sharding.mesh import DATA, MODEL, axis_sizes


@dataclasses.dataclass(frozen=True)
class ModelLayout:
  """How one model's arrays are split over the model axis (see the module docstring)."""
  model_size: int
  attention: str      # "heads" | "q_heads" | "replicated"
  mlp: bool           # gate/up/down split over F
  embed: str          # "vocab" | "hidden" | "replicated"

  @property
  def q_axis(self):
    return MODEL if self.attention in ("heads", "q_heads") else None

  @property
  def kv_axis(self):
    return MODEL if self.attention == "heads" else None


def attention_split(num_heads: int, num_kv_heads: int, model_size: int) -> str:
  """"heads" | "q_heads" | "replicated": how attention splits over `model_size` devices (module docstring)."""
  m, h, k = model_size, num_heads, num_kv_heads
  if k % m == 0:
    return "heads"
  if m % k == 0 and h % m == 0 and (h // k) % (m // k) == 0:
    return "q_heads"
  return "replicated"


def layout_for(cfg: ModelConfig, model_size: int) -> ModelLayout:
  """The layout of `cfg` on a model axis of `model_size` devices."""
  m = model_size
  attention = attention_split(cfg.num_heads, cfg.num_kv_heads, m)
  if cfg.vocab_size % m == 0:
    embed = "vocab"
  elif cfg.hidden_size % m == 0:
    embed = "hidden"
  else:
    embed = "replicated"
  return ModelLayout(m, attention, cfg.intermediate_size % m == 0, embed)


def path_keys(path) -> list[str]:
  """A pytree key path as plain names (dict keys, attribute names, sequence indices as strings), the form
  the rules and the weight declarations are looked up by."""
  out = []
  for p in path:
    for attr in ("key", "name", "idx"):
      if hasattr(p, attr):
        out.append(str(getattr(p, attr)))
        break
  return out


def axis_rule(lay: ModelLayout) -> dict:
  """Logical axis (config.AXIS_SIZES) -> the mesh axis it is split over in layout `lay` (absent: none)."""
  return {"heads": lay.q_axis, "q_flat": lay.q_axis, "kv_heads": lay.kv_axis, "kv_flat": lay.kv_axis,
          "mlp": MODEL if lay.mlp else None, "vocab": MODEL if lay.embed == "vocab" else None,
          "table": MODEL if lay.embed == "hidden" else None}


def param_spec(keys: list[str], ndim: int, lay: ModelLayout) -> P:
  """The PartitionSpec of one param leaf, by its path in the param pytree (layers/<i>/attn/q, ...): its
  declared axes (config.WEIGHTS) split as axis_rule says; an undeclared leaf is replicated."""
  w = weight_at(keys)
  if w is None or len(w.axes) != ndim:
    return P(*([None] * ndim))
  rule = axis_rule(lay)
  spec = tuple(rule.get(a) for a in w.axes)
  if w.under == "top" and not any(spec):                   # a replicated embedding / LM head
    return P()
  return P(*spec)


def param_specs(params: Any, lay: ModelLayout) -> Any:
  """PartitionSpecs for a param pytree (arrays or ShapeDtypeStructs or shape tuples)."""
  ndim = lambda x: len(x) if is_shape(x) else x.ndim
  return jax.tree_util.tree_map_with_path(lambda p, x: param_spec(path_keys(p), ndim(x), lay), params,
                                          is_leaf=is_shape)


def cache_spec(lay: ModelLayout) -> P:
  """One layer's KV buffer [B, K, S, D]: batch over data, KV heads over model when the layout splits them."""
  return P(DATA, lay.kv_axis, None, None)


def state_spec(keys: list[str], ndim: int, target: ModelLayout, ring: ModelLayout | None) -> P:
  """Specs for loop.LoopState / prefill outputs by path: caches as cache_spec, per-row arrays over data."""
  in_ring = "ring" in keys or keys[:1] == ["1"]           # LoopState.ring, or prefill's output[1]
  if len(keys) >= 2 and keys[-2] in ("k", "v") and ndim == 4:     # cache.k[layer]
    return cache_spec(ring if in_ring and ring is not None else target)
  if "shared" in keys or ndim == 0:                        # LoopState.shared: batch-wide
    return P()
  return P(DATA, *([None] * (ndim - 1)))                   # [B, ...] rows (incl. ring.pos, keys)


def fit(spec: P, shape, mesh: Mesh) -> P:
  """Drop any axis that does not divide its dimension (a safety net: shardings are always even)."""
  sizes = dict(mesh.shape)
  out = []
  for i, ax in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
    n = 1 if ax is None else sizes.get(ax, 0)
    out.append(ax if ax is not None and n and shape[i] % n == 0 else None)
  return P(*out)


def shardings(tree: Any, mesh: Mesh, spec_fn) -> Any:
  """NamedShardings for a pytree of arrays / ShapeDtypeStructs: spec_fn(keys, ndim) -> PartitionSpec."""
  def one(path, x):
    return NamedSharding(mesh, fit(spec_fn(path_keys(path), x.ndim), x.shape, mesh))
  return jax.tree_util.tree_map_with_path(one, tree)


def param_shardings(params: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
  """NamedShardings for `params` of a model with config `cfg` on `mesh`; a quantized weight's integers,
  scales and offsets are split as its parameter is (quantized_specs; offsets as scales)."""
  lay = layout_for(cfg, axis_sizes(mesh)[1])
  quantized = lambda x: isinstance(x, QuantizedWeight)

  def one(path, x):
    keys = path_keys(path)
    if quantized(x):
      q_spec, s_spec = quantized_specs(param_spec(keys, x.ndim, lay), x)
      scales = lambda a: None if a is None else NamedSharding(mesh, fit(s_spec, a.shape, mesh))
      return x.replace(q=NamedSharding(mesh, fit(q_spec, x.q.shape, mesh)), scale=scales(x.scale),
                       offset=scales(x.offset))
    return NamedSharding(mesh, fit(param_spec(keys, x.ndim, lay), x.shape, mesh))
  return jax.tree_util.tree_map_with_path(one, params, is_leaf=quantized)


def quantized_specs(logical: P, w: QuantizedWeight) -> tuple[P, P]:
  """The specs of a QuantizedWeight's stored matrix and scales from its parameter's spec: the stored 2-D
  matrix [K, N] (or [N, K] for an embedding) flattens the parameter's axes, so a split of the outermost
  axis of either group carries over (the rules split no inner one). int8 scales [N] follow N; int4 scales
  [K / group, N] follow both. `fit` drops a split that does not divide (packed rows, few groups)."""
  e = tuple(logical) + (None,) * (w.ndim - len(logical))
  if w.axis == 1:                                        # [V, D]: rows and the contracted features
    rows, cols = e[0], e[1]
    return P(rows, cols), (P(rows) if w.kind == "int8" else P(rows, cols))
  lead = w.leading_contracted
  k_ax = e[0] if all(a is None for a in e[1:lead]) else None
  n_ax = e[lead] if all(a is None for a in e[lead + 1:]) else None
  return P(k_ax, n_ax), (P(n_ax) if w.kind == "int8" else P(k_ax, n_ax))


def abstract_param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict:
  """NamedShardings shaped like checkpoints.expected_shapes(cfg): what an orbax restore needs."""
  structs = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, cfg.jnp_dtype), expected_shapes(cfg),
                         is_leaf=is_shape)
  return param_shardings(structs, cfg, mesh)


def state_shardings(tree: Any, mesh: Mesh, cfg: ModelConfig, draft_cfg: ModelConfig | None) -> Any:
  """NamedShardings for a LoopState, or a (target cache, draft ring) pair, by state_spec: the target's
  caches by its own layout, the ring by the draft network's (draft_cfg None: the target's)."""
  m = axis_sizes(mesh)[1]
  target = layout_for(cfg, m)
  ring = target if draft_cfg is None else layout_for(draft_cfg, m)
  return shardings(tree, mesh, lambda keys, ndim: state_spec(keys, ndim, target, ring))


def row_sharding(shape, mesh: Mesh) -> NamedSharding:
  """A per-row array [B, ...]: rows over "data" (where the axis divides B)."""
  return NamedSharding(mesh, fit(P(DATA), shape, mesh))


def place_params(params: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
  """params device_put into their shards (a no-op for arrays already placed so)."""
  return jax.device_put(params, param_shardings(params, cfg, mesh))


def shard_model(model, mesh: Mesh):
  """A copy of `model` whose params live in their shards on `mesh` (do this once, not per call)."""
  return dataclasses.replace(model, params=place_params(model.params, model.config, mesh))
