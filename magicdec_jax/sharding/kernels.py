"""Run the Pallas kernels per shard inside `jax.shard_map`.

The dispatch (pallas.tree_attention, pallas.int4_matmul) knows nothing of meshes: importing this module
(the sharding package does) injects `maybe_shard_map` and `maybe_shard_int4` as their shard wrappers, so
pallas never imports sharding.

Why: a pallas_call has no SPMD partitioning rule; left to the partitioner it would be run on gathered,
replicated operands. Under a ("data", "model") mesh (set by the engine via `jax.set_mesh`) the kernel
instead runs on each device's block: rows split over "data", heads over "model" as the partition rules
split them. Attention is independent per (row, KV head), so the per-shard results are the global ones
with no collective. In the "q_heads" layout (KV heads replicated, query heads split) each device slices
out the one KV head its query heads read.
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from magicdec_jax import pallas
from magicdec_jax.sharding.mesh import DATA, MODEL
from magicdec_jax.sharding.rules import attention_split


def _mesh():
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or set(mesh.axis_names) != {DATA, MODEL}:
    return None      # (one device: the kernel as it is, no shard_map)
  return mesh


def maybe_shard_map(kernel, q, k, v, base, anc):
  """kernel(q [B,T,H,D], k/v [B,K,S,D], base [B], anc [T,T]) -> [B,T,H,D], per shard when a mesh is set."""
  mesh = _mesh()
  if mesh is None:
    return kernel(q, k, v, base, anc)
  d, m = mesh.shape[DATA], mesh.shape[MODEL]
  b, h, kh = q.shape[0], q.shape[2], k.shape[1]
  row = DATA if b % d == 0 else None
  split = attention_split(h, kh, m)                       # the partition rules' own choice
  if split == "heads":                                    # q and K/V split alike
    q_ax, kv_ax, per_dev_kv = MODEL, MODEL, None
  elif split == "q_heads":                                # one KV head per device
    q_ax, kv_ax, per_dev_kv = MODEL, None, m // kh
  else:                                                   # replicated over the model axis
    q_ax, kv_ax, per_dev_kv = None, None, None

  def body(q, k, v, base, anc):
    if per_dev_kv is not None:
      i = jax.lax.axis_index(MODEL) // per_dev_kv
      k = jax.lax.dynamic_slice_in_dim(k, i, 1, axis=1)
      v = jax.lax.dynamic_slice_in_dim(v, i, 1, axis=1)
    return kernel(q, k, v, base, anc)

  qs = P(row, None, q_ax, None)
  kvs = P(row, kv_ax, None, None)
  return jax.shard_map(body, mesh=mesh, in_specs=(qs, kvs, kvs, P(row), P()), out_specs=qs,
                       check_vma=False)(q, k, v, base, anc)


def maybe_shard_int4(kernel, fallback, x, packed, scale, offset):
  """kernel(x [M, K], packed [K/2, N], scale / offset [K/g, N]) -> [M, N], per shard when a mesh is set.

  With no model axis (weights replicated) the rows of x go over "data" and each device multiplies its rows
  by the whole matrix. A model axis splits the matrix by N (column-parallel) or by K (row-parallel, then
  partial sums), which the call cannot see here, so there `fallback` (XLA's grouped product, partitioned by
  XLA) runs instead: correct, but without the kernel's byte savings."""
  mesh = _mesh()
  if mesh is None:
    return kernel(x, packed, scale, offset)
  if mesh.shape[MODEL] > 1:
    return fallback(x)
  row = DATA if x.shape[0] % mesh.shape[DATA] == 0 else None
  if offset is None:
    body, args, specs = (lambda a, p, s: kernel(a, p, s, None)), (x, packed, scale), (P(row, None), P(), P())
  else:
    body, args, specs = kernel, (x, packed, scale, offset), (P(row, None), P(), P(), P())
  return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(row, None), check_vma=False)(*args)


pallas.set_shard_wrapper(maybe_shard_map)   # the kernel dispatch gets the mesh-aware wrappers injected
pallas.set_shard_wrapper(maybe_shard_int4, "int4_matmul")
