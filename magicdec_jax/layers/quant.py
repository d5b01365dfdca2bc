"""Weight-only quantized copies of a model's matrices, for drafts that should read fewer bytes per token.

Contract: `quantize_params(params, kind, form)` returns the params tree with every matrix (ndim >= 2) replaced
by a `QuantizedWeight` ("int8": symmetric, one scale per output channel; "int4": a scale and an offset per
`form.group` consecutive inputs of an output channel, w = q * scale + offset, q in -8 .. 7, 0 meaning one
per output channel; the matrices named in `form.keep_int8` stay int8) and vectors kept as they are.
`quantized_dense` multiplies by such a weight reading only what the weight itself carries (its integers,
scales, offsets and its static `dot`), so layers never ask the backend. A `QuantForm` is every backend-keyed
choice of a copy in one frozen value: `backend_form()` gives the default backend's, resolved once where a
copy is made or priced, and benchmarks pass a varied one. The target still verifies with its own weights,
so the output is the target's exactly; the draft's precision moves only its acceptance.

Why a copy at all: a self-draft re-reads the target's weights for every draft token, so at long context a
draft step costs a full weight read. What each form measured, and the forms tried and dropped:
docs/decisions.md#quantized-weights.

Every matrix is kept as the 2-D matrix its matmul reads (`dense`): q/k/v [D, N*H], o [N*H, D], gate/up
[D, F], down [F, D], lm_head [D, V] (contracted on axis 0) and the embedding [V, D] (contracted on axis 1
when it is a tied LM head; its rows dequantize for the lookup). `QuantizedWeight.shape` is the parameter's
own shape, so the layers' reshapes and Flax's shape check see what they always saw.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import flax.struct
import jax
import jax.numpy as jnp

from magicdec_jax import backend, pallas
from magicdec_jax.config import WEIGHTS
from magicdec_jax.pallas.int4_matmul import MAX_ROWS as KERNEL_MAX_ROWS
from magicdec_jax.pallas.int4_matmul import pack_int4, packable, unpack_int4

QUANT_KINDS = ("int8", "int4")
DEFAULT_INT4_GROUP = 64
INT8_MAX = 127
INT4_MIN, INT4_LEVELS = -8, 16        # int4 values -8 .. 7
INT4_SYMMETRIC_MAX = 7                # symmetric int4 (QuantForm.offsets False): -7 .. 7
INT8_DOTS = ("int", "dequant")
# the matrices whose 4-bit error moved SmolLM2's predictions most for their bytes (docs/decisions.md#quantized-weights)
KEEP_INT8 = ("embed", "lm_head", "down", "k", "v")
# parameter name -> number of leading axes contracted (-1: the last axis is contracted): the model's
# matrices as config.WEIGHTS declares them, and the feature head's (feature_head.py: [nD, D], [2D, D], [Vd, D])
CONTRACTED = {**{name: w.contracted for name, w in WEIGHTS.items() if w.contracted is not None},
              "fuse": 1, "fc": 1, "vocab_head": -1}


@dataclasses.dataclass(frozen=True)
class QuantForm:
  """How a quantized copy is stored, multiplied and priced on one backend (hashable, frozen).

  group: int4 elements per scale along the contracted axis (0: one scale and offset per output channel,
  applied after the dot). offsets: asymmetric int4 (scale + offset, 16 levels); False: symmetric, max |w| / 7.
  keep_int8: parameter names an "int4" copy keeps in int8. kernel: grouped int4 stored packed (uint8
  [K/2, N], pallas/int4_matmul.py's layout) and multiplied by that Pallas kernel. int8_dot: "int" (the
  activations quantized per token too, the dot on the integers) or "dequant" (the integers converted in the
  dot's operand). storage: the container of int4 values ("int4": XLA's native 4-bit, two a byte; "int8": a
  byte each). hoisted: the dtype into which XLA converts an int4 copy's matrices once, before the decode
  loop, and holds while it runs (None: the conversion stays in the loop's matmuls). xla_options: what the
  executables of a draft on such a copy need."""
  group: int = DEFAULT_INT4_GROUP
  offsets: bool = True
  keep_int8: tuple[str, ...] = KEEP_INT8
  kernel: bool = False
  int8_dot: str = "int"
  storage: str = "int4"
  hoisted: str | None = None
  xla_options: tuple[tuple[str, object], ...] = ()

  def __post_init__(self):
    if self.int8_dot not in INT8_DOTS or self.storage not in ("int4", "int8") or self.group < 0:
      raise ValueError(f"QuantForm needs int8_dot in {INT8_DOTS}, storage 'int4' or 'int8' and group >= 0, got "
                       f"{self.int8_dot!r}, {self.storage!r}, {self.group}")
    object.__setattr__(self, "keep_int8", tuple(self.keep_int8))

  def replace(self, **changes) -> "QuantForm":
    return dataclasses.replace(self, **changes)

  @property
  def storage_dtype(self):
    return jnp.int4 if self.storage == "int4" else jnp.int8

  def group_bytes(self, group: int | None = None) -> float:
    """Scale (and offset) bytes per int4 element: float32 per group (0: per channel, after the dot)."""
    group = self.group if group is None else group
    return ((8.0 if self.offsets else 4.0) / group) if group > 0 else 0.0

  @property
  def hoisted_bytes(self) -> float:
    """Bytes of the matrix an int4 copy is converted into before the loop (0: none; never with the kernel)."""
    return 0.0 if self.hoisted is None or self.kernel else float(jnp.dtype(self.hoisted).itemsize)


# Per backend (docs/decisions.md#quantized-weights). XLA:CPU: W8A8 int8 dots; an int4 array on a mesh reports an
# unpacked layout the engine's AOT executables refuse, so int4 values sit in int8 containers, and XLA hoists
# their conversion out of the decode loop (tests/model/test_quant.py checks the HLO). GPU: a grouped scale does not
# fuse into XLA's GEMMs, so one scale per channel; int8 converted inside Triton GEMMs, which the draft asks for.
FORMS = {"cpu": QuantForm(group=DEFAULT_INT4_GROUP, int8_dot="int", storage="int8", hoisted="bfloat16"),
         "gpu": QuantForm(group=0, int8_dot="dequant", xla_options=(("xla_gpu_enable_triton_gemm", True),))}


def backend_form(platform: str | None = None) -> QuantForm:
  """The QuantForm of `platform` (default: the default backend's; elsewhere QuantForm())."""
  return FORMS.get(platform or backend.name(), QuantForm())


def _form(form: QuantForm | None) -> QuantForm:
  return backend_form() if form is None else form


@flax.struct.dataclass
class QuantizedWeight:
  """A matrix stored as integers + float32 scales (and, for int4, offsets): w = q * scale (+ offset). q: int8
  ("int8") or int4 ("int4"; QuantForm.storage) [K, N], with K the contracted size; scale: [N] ("int8") or
  [K/group, N] ("int4"), offset: None (int8, symmetric int4) or scale's shape (int4); all transposed ([N, K...]) when
  `axis` is 1 (the embedding). dot: how an int8 matrix is multiplied (QuantForm.int8_dot), fixed when the
  copy is made, so `quantized_dense` reads it here."""
  q: jax.Array
  scale: jax.Array
  kind: str = flax.struct.field(pytree_node=False)
  shape: tuple = flax.struct.field(pytree_node=False)       # the parameter's own (logical) shape
  axis: int = flax.struct.field(pytree_node=False)          # the contracted axis of the stored 2-D matrix
  dtype: str = flax.struct.field(pytree_node=False)         # the dtype it stands in for
  offset: jax.Array | None = None                           # int4: the value of q = 0 in each group
  dot: str = flax.struct.field(pytree_node=False, default="int")   # int8: QuantForm.int8_dot

  ndim = property(lambda self: len(self.shape))

  def reshape(self, *shape):
    """The same matrix under another logical shape (the stored 2-D form does not move)."""
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    total = math.prod(self.shape)
    if -1 in shape:
      known = math.prod(s for s in shape if s != -1)
      shape = tuple(total // known if s == -1 else s for s in shape)
    if math.prod(shape) != total:
      raise ValueError(f"cannot reshape a quantized {self.shape} weight to {shape}")
    return self.replace(shape=shape)

  @property
  def matrix_shape(self) -> tuple[int, int]:
    n = self.scale.shape[-1] if self.axis == 0 else self.scale.shape[0]
    k = math.prod(self.shape) // n
    return (k, n) if self.axis == 0 else (n, k)

  @property
  def per_channel(self) -> bool:
    """One scale per output channel (int8; int4 with one group): the scale multiplies the dot's output."""
    return self.kind == "int8" or self.scale.ndim == 1 or self.scale.shape[self.axis] == 1

  @property
  def packed(self) -> bool:
    """Two int4 values a byte in pallas/int4_matmul.py's layout (uint8 [K/2, N]), for the Pallas kernel."""
    return self.q.dtype == jnp.uint8

  @property
  def group(self) -> int:
    """Contracted elements per scale (int8: the whole contracted axis)."""
    k = self.matrix_shape[self.axis]
    return k if self.scale.ndim == 1 else k // self.scale.shape[self.axis]

  @property
  def leading_contracted(self) -> int:
    """How many leading axes of the logical shape the stored matrix contracts (axis 0: q / k / v 1, o 2)."""
    k = self.matrix_shape[0]
    for i in range(1, self.ndim + 1):
      if math.prod(self.shape[:i]) == k:
        return i
    raise ValueError(f"no leading axes of {self.shape} make the contracted size {k}")

  def dequantize(self, dtype) -> jax.Array:
    """The stored 2-D matrix in `dtype` (integers times their scales)."""
    if self.axis == 1:                       # stored [N, K]: dequantize its transpose (.T of int8's [N]: itself)
      offset = None if self.offset is None else self.offset.T
      return _dequantize_k_major(self.q.T, self.scale.T, offset, self.kind, dtype).T
    q = unpack_int4(self.q, self.group) if self.packed else self.q
    return _dequantize_k_major(q, self.scale, self.offset, self.kind, dtype)

  def rows(self, ids: jax.Array, dtype) -> jax.Array:
    """Rows `ids` of an embedding stored with axis 1 ([V, D]), dequantized: [..., D]."""
    if self.axis != 1:
      raise ValueError("rows() is for an embedding quantized along its feature axis")
    q = jnp.take(self.q, ids, axis=0)
    s = jnp.take(self.scale, ids, axis=0)
    if self.kind == "int8":
      return (q.astype(jnp.float32) * s[..., None]).astype(dtype)
    vals = q.astype(jnp.float32)
    g = vals.shape[-1] // s.shape[-1]
    vals = vals.reshape(*vals.shape[:-1], s.shape[-1], g) * s[..., None]
    if self.offset is not None:
      vals = vals + jnp.take(self.offset, ids, axis=0)[..., None]
    return vals.reshape(*vals.shape[:-2], -1).astype(dtype)


def _dequantize_k_major(q, scale, offset, kind, dtype):
  if kind == "int8":
    return (q.astype(jnp.float32) * scale).astype(dtype)
  vals = q.astype(jnp.float32)                                          # [K, N]
  k, n = vals.shape
  g = k // scale.shape[0]
  vals = vals.reshape(scale.shape[0], g, n) * scale[:, None]
  if offset is not None:
    vals = vals + offset[:, None]
  return vals.reshape(k, n).astype(dtype)


def quantize_matrix(w: jax.Array, kind: str, axis: int = 0, group: int | None = None,
                    form: QuantForm | None = None):
  """A 2-D matrix contracted along `axis` -> (q, scale, offset) as QuantizedWeight stores them (offset None
  for int8 and symmetric int4). group: int4's group size (None: form.group; 0: the whole contracted axis,
  one scale and offset per output channel); form: None for backend_form(). Where form.kernel is on, grouped
  int4 along axis 0 comes packed (uint8 [K/2, N]) where the kernel takes its shape."""
  if kind not in QUANT_KINDS:
    raise ValueError(f"quantized weights must be one of {QUANT_KINDS}, got {kind!r}")
  return _quantize_matrix(jnp.asarray(w, jnp.float32), kind, axis, group, _form(form))


@functools.partial(jax.jit, static_argnames=("kind", "axis", "group", "form"))
def _quantize_matrix(w, kind, axis, group, form: QuantForm):
  """quantize_matrix as one executable per matrix shape (not one per op: a model's matrices share a few)."""
  if axis == 1:
    q, s, o = _quantize_k_major(w.T, kind, group, form)
    return q.T, s.T, (None if o is None else o.T)             # (.T of int8's [N] scales: themselves)
  q, s, o = _quantize_k_major(w, kind, group, form)
  k, n = w.shape
  if kind == "int4" and s.shape[0] > 1 and form.kernel and packable(k, n, k // s.shape[0]):
    q = pack_int4(q, k // s.shape[0])
  return q, s, o


def _quantize_k_major(w, kind, group, form: QuantForm):
  """quantize_matrix along axis 0, values unpacked."""
  if kind == "int8":
    amax = jnp.max(jnp.abs(w), axis=0)
    scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
    return jnp.clip(jnp.round(w / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale, None
  k, n = w.shape
  group = form.group if group is None else group
  group = k if group <= 0 else min(group, k)
  while k % group:                      # the largest power of two <= group dividing the contracted size
    group //= 2
  wg = w.reshape(k // group, group, n)
  storage = form.storage_dtype
  if not form.offsets:                  # symmetric: 15 levels around 0, no offset
    amax = jnp.max(jnp.abs(wg), axis=1)
    scale = jnp.where(amax > 0, amax / INT4_SYMMETRIC_MAX, 1.0)
    q = jnp.clip(jnp.round(wg / scale[:, None]), -INT4_SYMMETRIC_MAX, INT4_SYMMETRIC_MAX)
    return q.reshape(k, n).astype(storage), scale, None
  lo, hi = jnp.min(wg, axis=1), jnp.max(wg, axis=1)                     # [K/g, N]
  scale = jnp.where(hi > lo, (hi - lo) / (INT4_LEVELS - 1), 1.0)
  offset = lo - INT4_MIN * scale                                         # the value of q = 0
  q = jnp.clip(jnp.round((wg - lo[:, None]) / scale[:, None]), 0, INT4_LEVELS - 1) + INT4_MIN
  return q.reshape(k, n).astype(storage), scale, offset


def quantize_weight(name: str, w: jax.Array, kind: str, group: int | None = None,
                    form: QuantForm | None = None) -> QuantizedWeight:
  """One named parameter (see CONTRACTED) -> its QuantizedWeight (form: None for backend_form())."""
  if name not in CONTRACTED:
    raise ValueError(f"quantized draft weights: no rule for the {w.ndim}-D parameter {name!r} "
                     f"(known: {sorted(CONTRACTED)})")
  form = _form(form)
  lead = CONTRACTED[name]
  if lead == -1:
    mat, axis = w.reshape(-1, w.shape[-1]), 1
  else:
    mat, axis = w.reshape(math.prod(w.shape[:lead]), -1), 0
  q, s, o = quantize_matrix(mat, kind, axis, group, form)
  return QuantizedWeight(q, s, kind=kind, shape=tuple(w.shape), axis=axis, dtype=str(jnp.dtype(w.dtype)),
                         offset=o, dot=form.int8_dot)


def quantize_params(params, kind: str, form: QuantForm | None = None):
  """A copy of a params tree with every matrix (ndim >= 2) quantized; vectors (norm scales, biases) kept.
  An "int4" copy keeps the matrices named in form.keep_int8 in int8. form: None for backend_form()."""
  form = _form(form)

  def one(path, x):
    if x.ndim < 2:
      return x
    name = str(next((p.key for p in reversed(path) if isinstance(p, jax.tree_util.DictKey)), None))
    return quantize_weight(name, x, "int8" if kind == "int4" and name in form.keep_int8 else kind, None, form)
  return jax.tree_util.tree_map_with_path(one, params)


def quantized_dense(eq: str, x: jax.Array, w: QuantizedWeight, out_dtype, compute_dtype) -> jax.Array:
  """einsum(eq, x, w) with w quantized: a weight with one scale per output channel (int8, per-channel int4)
  as a dot against the integers (exact in bfloat16) scaled afterwards, plus the offset times the sum of x
  (int4); group-wise int4 against the dequantized matrix. Accumulates in float32."""
  lhs, out = eq.split("->")
  ws = lhs.split(",")[1]
  if len(ws) != 2 or tuple(w.shape) != w.matrix_shape:
    raise ValueError(f"a quantized weight is used as its stored 2-D matrix {w.matrix_shape}; got logical "
                     f"shape {w.shape} in {eq!r}")
  xs = lhs.split(",")[0]
  # the output channel (the weight's uncontracted axis) is the output's last; x is contracted on its last
  if out[-1] != ws[1 - w.axis] or xs[-1] != ws[w.axis] or out[:-1] != xs[:-1]:
    raise ValueError(f"quantized dense expects 'X...K,(KN|NK)->X...N', got {eq!r}")
  xc = x.astype(compute_dtype)
  if w.packed:                               # grouped int4 on packed bytes: the Pallas kernel (decode rows)
    k, n = w.matrix_shape
    x2 = xc.reshape(-1, k)
    unpacked = lambda a: jnp.dot(a, w.dequantize(compute_dtype), preferred_element_type=jnp.float32)
    if x2.shape[0] > KERNEL_MAX_ROWS:        # a prefill's many rows: XLA's dequantized operand
      y = unpacked(x2)
    else:
      y = pallas.int4_matmul(x2, w.q, w.scale, w.offset, group=w.group, fallback=unpacked)
    return y.reshape(*x.shape[:-1], n).astype(out_dtype)
  if w.kind == "int8" or w.per_channel:
    if w.kind == "int8" and w.dot == "int":
      amax = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True)
      sx = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
      xq = jnp.round(x.astype(jnp.float32) / sx).astype(jnp.int8)
      y = jnp.einsum(eq, xq, w.q, preferred_element_type=jnp.int32).astype(jnp.float32) * sx
    else:
      y = jnp.einsum(eq, xc, w.q.astype(compute_dtype), preferred_element_type=jnp.float32)
    y = y * w.scale.reshape(-1)
    if w.offset is not None:                 # per-channel int4: + offset * sum over the contracted axis of x
      y = y + jnp.sum(xc.astype(jnp.float32), axis=-1, keepdims=True) * w.offset.reshape(-1)
    return y.astype(out_dtype)
  return jnp.einsum(eq, xc, w.dequantize(compute_dtype), preferred_element_type=jnp.float32).astype(out_dtype)


def xla_options(kind: str | None, form: QuantForm | None = None) -> dict:
  """XLA options for executables in which a draft multiplies `kind` weights (none for float copies)."""
  return dict(_form(form).xla_options) if kind in QUANT_KINDS else {}


def int4_bytes_per_value(group: int | None = None, form: QuantForm | None = None) -> float:
  """Bytes an int4 element costs where it is read as stored: half a byte and its share of the group's
  float32 scale (and offset)."""
  return 0.5 + _form(form).group_bytes(group)


def weight_bytes_per_param(kind: str, group: int | None = None, kept_int8: float = 0.0,
                           form: QuantForm | None = None) -> float:
  """Bytes a decode loop reads per matrix element of a copy, scales and offsets included; kept_int8: the
  share of an "int4" copy's elements kept in int8 (kept_int8_share). Where the form hoists the int4
  conversion out of the loop (QuantForm.hoisted) an int4 element is read as the converted matrix's."""
  if kind == "int8":
    return 1.0
  form = _form(form)
  value = form.hoisted_bytes or int4_bytes_per_value(group, form)
  return (1.0 - kept_int8) * value + kept_int8


def resident_bytes_per_param(kind: str, group: int | None = None, kept_int8: float = 0.0,
                             form: QuantForm | None = None) -> float:
  """Bytes per matrix element a copy occupies while a decode runs (what the memory planner counts): an int4
  value in its storage container (half a byte natively, a byte in an int8), its scales and offsets, and,
  where the form hoists the conversion out of the loop, the converted matrix too."""
  if kind == "int8":
    return 1.0
  form = _form(form)
  value = 0.5 if form.storage == "int4" or form.kernel else float(jnp.dtype(form.storage_dtype).itemsize)
  return (1.0 - kept_int8) * (value + form.group_bytes(group) + form.hoisted_bytes) + kept_int8


def kept_int8_share(matrix_elements: dict, kind: str, form: QuantForm | None = None) -> float:
  """The share of a copy's matrix elements an "int4" copy keeps in int8: matrix_elements maps parameter
  names to element counts (every matrix the share is over); 0 for other kinds."""
  if kind != "int4":
    return 0.0
  keep = _form(form).keep_int8
  total = sum(matrix_elements.values())
  return sum(n for name, n in matrix_elements.items() if name in keep) / total if total else 0.0
