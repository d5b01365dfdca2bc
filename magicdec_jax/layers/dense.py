"""A matmul against a weight as it lies, in the weight's own precision.

Activations are float32 in a float32 model. A weight stored in a narrower dtype than the activations (the
bfloat16 copy a `StreamingDraft(weights="bfloat16")` drafts with) is multiplied as a bfloat16 x bfloat16
dot accumulating in float32: casting the weight up instead would materialize a float32 copy of it every
step (on XLA:CPU that measured 4x slower than the float32 matmul itself), while the narrow dot reads half
the bytes. On XLA:CPU that narrow dot is fast only with two or more rows: a single row (batch 1, one token)
takes a matrix-vector path that measured 12x slower than the float32 one (SmolLM2's LM head: 39 ms against
3.5), so a single row is padded to two there (3.2 ms).

On a GPU every single-row matmul is padded to two rows (what that gains is a prediction, not yet measured;
issue 44). Profiled on one
H100 at 1 x 4K (LLaMA-3.1-8B shape, bf16, 2026-11-26), the one-token step took 11.0 ms against a 5.5 ms
floor. XLA lowered the M = 1 LM head as a float32 conversion of its 1 GB weight plus a cuBLAS float32
GEMV: 1.75 ms a step for a 0.35 ms read. A per-layer scatter fusion took 2.6 ms a step, most likely the
k / v projections strength-reduced to reductions and fused into the cache write. With two rows these are
ordinary GEMMs.
"""
import functools
import math

import jax
import jax.numpy as jnp

from magicdec_jax.layers.quant import (QUANT_KINDS, QuantizedWeight, quantize_params, quantized_dense,
                                      resident_bytes_per_param, weight_bytes_per_param)


def matmul_precision(dtype):
  """float32 models compute in float32 on every backend (GPUs would otherwise run float32 matmuls in
  TF32, and a verify pass could then disagree with an autoregressive step); bfloat16 uses the default."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def dense(eq: str, x: jax.Array, w, out_dtype=None) -> jax.Array:
  """jnp.einsum(eq, x, w) at matmul_precision(w.dtype), returned in `out_dtype` (default: the einsum's);
  a weight narrower than x, or quantized (layers/quant.py), is multiplied with x cast to the narrow
  dtype, accumulated in float32 and returned in out_dtype or x's dtype."""
  quantized = isinstance(w, QuantizedWeight)
  narrow = quantized or jnp.dtype(w.dtype).itemsize < jnp.dtype(x.dtype).itemsize
  if quantized:
    out_dtype = out_dtype or x.dtype
    compute = jnp.bfloat16 if jnp.dtype(x.dtype) == jnp.float32 else x.dtype
    matmul = lambda xx: quantized_dense(eq, xx, w, out_dtype, compute)
  elif narrow:
    out_dtype = out_dtype or x.dtype
    matmul = lambda xx: jnp.einsum(eq, xx.astype(w.dtype), w, preferred_element_type=out_dtype)
  else:
    matmul = lambda xx: jnp.einsum(eq, xx, w, precision=matmul_precision(w.dtype), preferred_element_type=out_dtype)
  lhs, out = eq.split("->")
  xs, ws = lhs.split(",")
  labels = xs.replace("...", "")                            # x's named axes are its last len(labels)
  contracted = math.prod(x.shape[x.ndim - len(labels) + i] for i, c in enumerate(labels) if c in ws)
  first_free = xs.startswith("...") or xs[0] not in ws
  if x.ndim and first_free and x.size == contracted and pads_single_row(narrow):
    y = matmul(jnp.concatenate([x, jnp.zeros_like(x)], 0))    # one row: pad it to two (see the docstring)
    return jax.lax.slice_in_dim(y, 0, 1, axis=0 if out.startswith("...") else out.index(xs[0]))
  return matmul(x)


def pads_single_row(narrow: bool) -> bool:
  """Whether a one-row matmul runs as two rows on the default backend: on a GPU always, on CPU for a
  narrow or quantized weight (see the module docstring)."""
  backend = jax.default_backend()
  return backend == "gpu" or (backend == "cpu" and narrow)


def weight_param(module, name: str, init, shape: tuple, dtype):
  """module.param(name, init, shape, dtype), except that a QuantizedWeight stored under `name` (a draft's
  quantized copy) is returned as it is, once its logical shape is checked."""
  if module.has_variable("params", name):
    v = module.get_variable("params", name)
    if isinstance(v, QuantizedWeight):
      if tuple(v.shape) != tuple(shape):
        raise ValueError(f"quantized parameter {name!r} has shape {v.shape}, the layer expects {tuple(shape)}")
      return v
  return module.param(name, init, shape, dtype)


@functools.partial(jax.jit, static_argnums=1)
def narrow_weights(params, dtype: str):
  """A copy of a params tree with every matrix (ndim >= 2: projections, MLP, embedding / LM head) cast to
  `dtype`, as one compiled cast; vectors (norm scales) are kept, the model still computes in its own dtype
  (dense above)."""
  return jax.tree.map(lambda x: x.astype(dtype) if x.ndim >= 2 else x, params)


def copy_bytes_per_param(kind: str, kept_int8: float = 0.0) -> float:
  """Bytes per matrix element of a weight_copy of this kind (scales included; kept_int8: the share of an
  "int4" copy kept in int8, quant.kept_int8_share)."""
  return weight_bytes_per_param(kind, kept_int8=kept_int8) if kind in QUANT_KINDS else float(jnp.dtype(kind).itemsize)


def copy_resident_bytes_per_param(kind: str, kept_int8: float = 0.0) -> float:
  """Bytes per matrix element a weight_copy of this kind occupies while decoding (quant.resident_bytes_per_param:
  on XLA:CPU an int4 copy also holds the bfloat16 matrix its conversion is hoisted into)."""
  return resident_bytes_per_param(kind, kept_int8=kept_int8) if kind in QUANT_KINDS else float(jnp.dtype(kind).itemsize)


def weight_copy(params, kind: str):
  """A draft's copy of a params tree: matrices cast to a narrower float dtype (narrow_weights) or quantized
  to "int8" / "int4" (layers/quant.py)."""
  return quantize_params(params, kind) if kind in QUANT_KINDS else narrow_weights(params, kind)
