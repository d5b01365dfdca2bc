"""A matmul against a weight as it lies, in the weight's own precision.

Contract: `dense(eq, x, w)` is `jnp.einsum(eq, x, w)` accumulated in float32 where the weight is float32; a
weight stored narrower than the activations (a draft's bfloat16 copy) is multiplied as a narrow x narrow dot
accumulating in float32, and a quantized one through layers/quant.py. Why: casting the weight up instead
would materialize a wide copy of it every step, while the narrow dot reads fewer bytes.

A single-row matmul runs as two rows where the backend's one-row path is slow (`pads_single_row`: on a
GPU always, on XLA:CPU for a narrow or quantized weight); what that measured: docs/decisions.md#one-row-padding.
"""
import functools
import math

import jax
import jax.numpy as jnp

from magicdec_jax import backend
from magicdec_jax.layers.quant import (QUANT_KINDS, QuantForm, QuantizedWeight, quantize_params, quantized_dense,
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
  platform = backend.name()
  return platform == "gpu" or (platform == "cpu" and narrow)


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


def copy_bytes_per_param(kind: str, kept_int8: float = 0.0, form: QuantForm | None = None) -> float:
  """Bytes per matrix element of a weight_copy of this kind (scales included; kept_int8: the share of an
  "int4" copy kept in int8, quant.kept_int8_share; form: quant.backend_form() for None)."""
  if kind in QUANT_KINDS:
    return weight_bytes_per_param(kind, kept_int8=kept_int8, form=form)
  return float(jnp.dtype(kind).itemsize)


def copy_resident_bytes_per_param(kind: str, kept_int8: float = 0.0, form: QuantForm | None = None) -> float:
  """Bytes per matrix element a weight_copy of this kind occupies while decoding (quant.resident_bytes_per_param:
  a form that hoists the int4 conversion out of the loop also holds the converted matrix)."""
  if kind in QUANT_KINDS:
    return resident_bytes_per_param(kind, kept_int8=kept_int8, form=form)
  return float(jnp.dtype(kind).itemsize)


def weight_copy(params, kind: str, form: QuantForm | None = None):
  """A draft's copy of a params tree: matrices cast to a narrower float dtype (narrow_weights) or quantized
  to "int8" / "int4" (layers/quant.py, in `form`: quant.backend_form() for None)."""
  return quantize_params(params, kind, form) if kind in QUANT_KINDS else narrow_weights(params, kind)
