"""Attention kernels for verification: prefix + tree attention over a linear KV cache.

`tree_attention` dispatches between the XLA path (reference, CPU default) and the split-K Pallas
kernel (Triton lowering on GPU, interpreter on CPU). A Mosaic GPU variant is not written: "auto"
picks Triton on GPU when the installed jax can still lower it (checked once per shape signature by
compiling the kernel alone) and XLA otherwise.

`fixed_attention` is the same rule at fixed shapes (pallas/fixed_attention.py): a query position's output the
same bits in any batch, query tile or slot count, for fixed-shape numerics; `backend.FixedShapes.attention`
names its lowering (Triton or the interpreter), decided once in the config.

`int4_matmul` multiplies by a group-wise int4 matrix on packed bytes (pallas/int4_matmul.py): the Triton
kernel on a GPU, the interpreter elsewhere. A quantized draft calls it where its QuantForm.kernel is on (off
by default: it lost to XLA's per-channel form, docs/decisions.md#int4-kernel).
"""
from __future__ import annotations

import functools
import warnings

import jax

from magicdec_jax import backend
from magicdec_jax.backend import FixedShapes
from magicdec_jax.pallas.fixed_attention import pallas_fixed_attention
from magicdec_jax.pallas.int4_matmul import MIN_DOT, default_tiling, pallas_int4_matmul
from magicdec_jax.pallas.tree_attention import pallas_tree_attention
from magicdec_jax.pallas.xla_attention import dot_operands, visibility_mask, xla_tree_attention

IMPLS = ("auto", "xla", "pallas_interpret", "pallas_triton", "pallas_mosaic")
_warned: set[str] = set()
KERNELS = ("tree_attention", "int4_matmul")
# kernel -> wrapper running it per shard under a mesh; set by magicdec_jax.sharding.kernels
_shard_wrappers: dict = {}


def set_shard_wrapper(wrapper, kernel: str = "tree_attention") -> None:
  """Install `wrapper` around every call of `kernel` (None: call the kernel directly): for tree_attention
  wrapper(kernel, q, k, v, base, anc), for int4_matmul wrapper(kernel, fallback, x, packed, scale, offset).
  The sharded runtime injects its shard_map wrappers here; pallas never imports it."""
  if kernel not in KERNELS:
    raise ValueError(f"set_shard_wrapper: kernel must be one of {KERNELS}, got {kernel!r}")
  _shard_wrappers[kernel] = wrapper


def _triton_params(num_warps: int | None, num_stages: int | None):
  """Triton CompilerParams (forces the Triton lowering), or None if this jax has no Triton backend."""
  try:
    from jax.experimental.pallas import triton as pltriton
  except ImportError:
    return None
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def has_triton() -> bool:
  """Whether this jax has Pallas's Triton backend (the GPU kernels' lowering)."""
  return _triton_params(None, None) is not None


def _kernel_kwargs(block_k, block_q, num_splits, num_warps, num_stages, impl):
  kw = dict(block_k=block_k, block_q=block_q, num_splits=num_splits)
  if impl == "pallas_interpret":
    return dict(kw, interpret=True)
  params = _triton_params(num_warps, num_stages)
  if params is None:
    raise NotImplementedError("this jax has no Pallas Triton backend; use impl='xla'")
  return dict(kw, compiler_params=params)


@functools.lru_cache(maxsize=256)
def triton_compiles(signature, scale, kw_items) -> bool:
  """Lower and compile the Triton tree-attention kernel alone for `signature` ((shape, dtype) of q, k, v,
  base, anc) and the kernel options `kw_items`; False on any failure, with one RuntimeWarning per kind of
  failure. Memoised: "auto" probes each shape once."""
  kw = dict(kw_items)
  structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in signature]
  fn = functools.partial(pallas_tree_attention, scale=scale,
                         **_kernel_kwargs(impl="pallas_triton", **kw))
  try:
    jax.jit(fn).lower(*structs).compile()
    return True
  except Exception as e:  # noqa: BLE001 - any lowering/compile failure means "use XLA"
    key = f"{type(e).__name__}"
    if key not in _warned:
      _warned.add(key)
      warnings.warn(f"tree_attention: Pallas Triton kernel does not lower here ({e!r:.300}); "
                    "falling back to XLA", RuntimeWarning, stacklevel=3)
    return False


def resolve_impl(q, k, v, base, anc, *, scale=None, block_k=None, block_q=None, num_splits=None,
                 num_warps=None, num_stages=None) -> str:
  """The concrete impl "auto" would use for these (possibly abstract) arrays."""
  if backend.name() != "gpu" or not has_triton():
    return "xla"
  signature = tuple((tuple(x.shape), jax.numpy.dtype(x.dtype)) for x in (q, k, v, base, anc))
  kw = (("block_k", block_k), ("block_q", block_q), ("num_splits", num_splits),
        ("num_warps", num_warps), ("num_stages", num_stages))
  return "pallas_triton" if triton_compiles(signature, scale, kw) else "xla"


def tree_attention(q: jax.Array, k: jax.Array, v: jax.Array, base: jax.Array, anc: jax.Array, *,
                   scale: float | None = None, impl: str = "auto", block_k: int | None = None,
                   block_q: int | None = None, num_splits: int | None = None,
                   num_warps: int | None = None, num_stages: int | None = None) -> jax.Array:
  """Prefix + tree attention. q [B,T,H,D], k/v [B,K,S,D], base [B] int32, anc [T,T] bool -> [B,T,H,D].

  Query t of row b sees cache slots [0, base[b]) and tree slots base[b] + j with anc[t, j]; the
  new tokens' K/V must already be written there. Math in float32, output in q.dtype.
  impl: "auto" (Pallas Triton on GPU if it compiles, else XLA), "xla", "pallas_interpret" (CPU-able),
  "pallas_triton", "pallas_mosaic" (not implemented). Kernel knobs are ignored by "xla".
  """
  if impl not in IMPLS:
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
  knobs = dict(block_k=block_k, block_q=block_q, num_splits=num_splits, num_warps=num_warps,
               num_stages=num_stages)
  if impl == "auto":
    impl = resolve_impl(q, k, v, base, anc, scale=scale, **knobs)
  if impl == "xla":
    return xla_tree_attention(q, k, v, base, anc, scale=scale)
  if impl == "pallas_mosaic":
    raise NotImplementedError("no Mosaic GPU variant of tree_attention; use 'pallas_triton' or 'xla'")
  kernel = functools.partial(pallas_tree_attention, scale=scale, **_kernel_kwargs(impl=impl, **knobs))
  wrapper = _shard_wrappers.get("tree_attention")
  if wrapper is None:
    return kernel(q, k, v, base, anc)
  return wrapper(kernel, q, k, v, base, anc)   # per shard (shard_map) under a ("data", "model") mesh


FIXED_WARPS, FIXED_STAGES = 4, 2   # one Triton configuration for every shape (untuned)


def fixed_attention(q: jax.Array, k: jax.Array, v: jax.Array, base: jax.Array, anc: jax.Array, *,
                    fixed: FixedShapes, scale: float | None = None, chain: bool = False) -> jax.Array:
  """Prefix + tree attention at fixed shapes (pallas/fixed_attention.py), lowered as fixed.attention says
  ("pallas_triton" or "pallas_interpret"), per shard under a mesh (the tree_attention wrapper: rows and KV
  heads are independent). q [B,T,H,D], k/v [B,K,S,D], base [B], anc [T,T] -> [B,T,H,D] in q.dtype."""
  if fixed.attention == "pallas_interpret":
    lowering = dict(interpret=True)
  elif fixed.attention == "pallas_triton":
    params = _triton_params(FIXED_WARPS, FIXED_STAGES)
    if params is None:
      raise NotImplementedError("FixedShapes.attention='pallas_triton' but this jax has no Pallas Triton backend")
    lowering = dict(compiler_params=params)
  else:
    raise ValueError(f"fixed_attention runs a Pallas lowering, not FixedShapes.attention={fixed.attention!r}")
  out_dtype = q.dtype
  q, k, v = dot_operands(q, k, v)
  kernel = functools.partial(pallas_fixed_attention, query_tokens=fixed.query_tokens, key_block=fixed.key_block,
                             tail_blocks=fixed.tail_blocks, split_slots=fixed.split_slots, scale=scale, chain=chain,
                             **lowering)
  wrapper = _shard_wrappers.get("tree_attention")
  out = kernel(q, k, v, base, anc) if wrapper is None else wrapper(kernel, q, k, v, base, anc)
  return out.astype(out_dtype)


def int4_kernel(m: int, k: int, n: int, group: int, *, triton: bool):
  """pallas_int4_matmul for [M, K] x [K, N] at default_tiling, lowered by Triton (triton; with the tiling's
  num_warps / num_stages where it names them) or interpreted."""
  rows = max(MIN_DOT, -(-m // MIN_DOT) * MIN_DOT)                 # as the kernel pads them
  tiling = default_tiling(k, n, group, rows)
  warps, stages = tiling.pop("num_warps", None), tiling.pop("num_stages", None)
  if triton:
    params = _triton_params(warps, stages)
    if params is None:
      raise NotImplementedError("int4_matmul: this jax has no Pallas Triton backend (QuantForm.kernel off)")
    lowering = dict(compiler_params=params)
  else:
    lowering = dict(interpret=True)
  return functools.partial(pallas_int4_matmul, group=group, **lowering, **tiling)


def int4_matmul(x: jax.Array, packed: jax.Array, scale: jax.Array, offset: jax.Array | None, *, group: int,
                fallback) -> jax.Array:
  """x [M, K] @ a packed group-wise int4 matrix (pallas/int4_matmul.py) -> [M, N] float32: the Triton kernel
  on a GPU, the interpreter elsewhere, at default_tiling. Under a mesh the injected wrapper runs it per shard,
  or calls fallback(x) (an XLA form of the same product) where it cannot."""
  kernel = int4_kernel(*x.shape, packed.shape[1], group, triton=backend.name() == "gpu")
  wrapper = _shard_wrappers.get("int4_matmul")
  if wrapper is None:
    return kernel(x, packed, scale, offset)
  return wrapper(kernel, fallback, x, packed, scale, offset)


__all__ = ["IMPLS", "KERNELS", "fixed_attention", "has_triton", "int4_kernel", "int4_matmul", "pallas_fixed_attention",
           "pallas_tree_attention", "resolve_impl", "set_shard_wrapper", "tree_attention", "triton_compiles",
           "visibility_mask", "xla_tree_attention"]
