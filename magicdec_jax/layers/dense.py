"""A matmul against a weight as it lies, in the weight's own precision.

Activations are float32 in a float32 model. A weight stored in a narrower dtype than the activations (the
bfloat16 copy a `StreamingDraft(weights="bfloat16")` drafts with) is multiplied as a bfloat16 x bfloat16
dot accumulating in float32: casting the weight up instead would materialize a float32 copy of it every
step (on XLA:CPU that measured 4x slower than the float32 matmul itself), while the narrow dot reads half
the bytes. On XLA:CPU that narrow dot is fast only with two or more rows: a single row (batch 1, one token)
takes a matrix-vector path that measured 12x slower than the float32 one (SmolLM2's LM head: 39 ms against
3.5), so a single row is padded to two there (3.2 ms).
"""
import functools
import math

import jax
import jax.numpy as jnp


def matmul_precision(dtype):
  """float32 models compute in float32 on every backend (GPUs would otherwise run float32 matmuls in
  TF32, and a verify pass could then disagree with an autoregressive step); bfloat16 uses the default."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def dense(eq: str, x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
  """jnp.einsum(eq, x, w) at matmul_precision(w.dtype), returned in `out_dtype` (default: the einsum's);
  a weight narrower than x is multiplied with x cast to it, accumulated and returned in out_dtype or
  x's dtype."""
  if jnp.dtype(w.dtype).itemsize < jnp.dtype(x.dtype).itemsize:
    out_dtype = out_dtype or x.dtype
    lhs, out = eq.split("->")
    xs, ws = lhs.split(",")
    rows = [i for i, c in enumerate(xs) if c not in ws]          # x's axes that are not contracted
    if rows and math.prod(x.shape[i] for i in rows) == 1 and jax.default_backend() == "cpu":
      axis = rows[0]                                          # one row: pad it to two (see the docstring)
      y = jnp.einsum(eq, jnp.concatenate([x, jnp.zeros_like(x)], axis).astype(w.dtype), w,
                     preferred_element_type=out_dtype)
      return jax.lax.slice_in_dim(y, 0, 1, axis=out.index(xs[axis]))
    return jnp.einsum(eq, x.astype(w.dtype), w, preferred_element_type=out_dtype)
  return jnp.einsum(eq, x, w, precision=matmul_precision(w.dtype), preferred_element_type=out_dtype)


@functools.partial(jax.jit, static_argnums=1)
def narrow_weights(params, dtype: str):
  """A copy of a params tree with every matrix (ndim >= 2: projections, MLP, embedding / LM head) cast to
  `dtype`, as one compiled cast; vectors (norm scales) are kept, the model still computes in its own dtype
  (dense above)."""
  return jax.tree.map(lambda x: x.astype(dtype) if x.ndim >= 2 else x, params)
