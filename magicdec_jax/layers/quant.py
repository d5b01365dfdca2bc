"""Weight-only quantized copies of a model's matrices, for drafts that should read fewer bytes per token.

A self-draft re-reads the target's weights for every draft token, so on a GPU at long context a draft step
costs a full weight read (issue 46). A draft may instead read a copy of those matrices in
  * "int8": symmetric, one scale per output channel (the max |w| over the contracted axis / 127);
  * "int4": asymmetric, a scale and an offset per `int4_group()` consecutive inputs of an output channel,
    mapping the group's min .. max onto 16 levels exactly (w = q * scale + offset, q in -8 .. 7; the
    "scale and min" of llama.cpp's Q4_1 / Q4_K; a smaller power-of-two group where the contracted size
    needs it). A group of 0 means one scale and offset per output channel, applied after the dot
    (x . w = scale * (x . q) + offset * sum(x)): the default on a GPU (INT4_GROUPS), where a scale
    multiplied in before the dot does not fuse into the matmul; 64 elsewhere. The values are stored as
    XLA's native 4-bit integers (`jnp.int4`, two to a byte in device memory: the HLO layout
    `s4[...]{...:E(4)}`), so the conversion is a plain convert XLA fuses into a matmul's operand. On
    XLA:CPU (jax 0.10.2) an int4 array placed on a mesh reports an unpacked layout that the engine's
    ahead-of-time executables refuse, so there the values are stored one to an int8 (`INT4_STORAGE`): the
    same numbers, a byte each.
The target still verifies with its own weights, so the output is the target's exactly; the draft's
precision moves only its acceptance.

An "int4" copy keeps the matrices named in INT4_KEEP_INT8 (the LM head / tied embedding, the MLP down
projections, the k / v projections) in int8, as llama.cpp's Q4_K_M keeps its most sensitive ones at more
bits. On SmolLM2-135M (teacher-forced on 4 x 512 held-out Shakespeare tokens, top-1 agreement with the
float32 model; bfloat16 0.99, int8 0.96) all-int4 agreed on 0.50 (groups of 64) / 0.33 (per channel); int8
for one kind of matrix at a time lifted groups of 64 most for down (0.60) and the head (0.55); head + down
0.69 / 0.60, with k / v too 0.74 / 0.68. For LLaMA-3.1-8B's shape those matrices are 36% of the matmul
weights (k / v 4%), so the copy reads ~0.68 bytes a weight instead of 0.5: on one H100 (8 x 32K, chain 3)
head + down int8 took 14.4 ms of GEMMs a round against 13.1. In the decode loop (SmolLM2 f32, 8 x 4096
held-out prose, StreamingDraft(4, 256), gamma 2) head + down int8 kept 0.97 / 0.90 (greedy; groups of 64 /
per channel) and 0.82 / 0.74 (T 0.8 top-p 0.95) of the bfloat16 copy's acceptance, where all-int4 kept
0.80 / 0.70 and 0.61 / 0.46; with k / v in int8 as well (the default) 0.95 / 0.92 greedy and 0.87 / 0.81
sampled (benchmarks/results/quantized_draft_8x4096_int4_default_*_cpu_2026-11-27_intel.json).
Those figures were taken with symmetric int4 (max |w| / 7, 15 levels, no offset). Asymmetric scales
(the layout above) lifted the same teacher-forced agreement of the default copy from 0.74 to 0.80 (groups
of 64) and 0.68 to 0.70 (per channel). In the decode loop (same setting; sampled acceptance the mean of
4 seeds, the same seeds for both forms) groups of 64 kept 0.99 / 0.92 of the bfloat16 copy's greedy /
sampled acceptance against 0.95 / 0.88 symmetric, per channel 0.96 / 0.83 against 0.92 / 0.82
(benchmarks/results/quantized_draft_8x4096_int4_{asym,sym}_*_seeds4_cpu_2026-11-27_intel.json). The offset
costs 4 more bytes a group (0.625 bytes an int4 weight at groups of 64) and, per channel, one [N] product
after the dot (its cost on a GPU not yet measured: INT4_OFFSETS = False gives the symmetric form back for
a benchmark to compare). Tried and dropped: four least-squares refits of each group's scale and offset after
the min .. max start (llama.cpp's make_qkx idea) lowered the weights' squared error by a fifth and lifted the
teacher-forced agreement (groups of 64: 0.80 to 0.82), but not the acceptance (same 4 seeds; groups of 64
0.99 / 0.91 against 0.99 / 0.92, per channel 0.94 / 0.84 against 0.96 / 0.83: within the seeds' spread).

How an int8 matrix is multiplied (`INT8_DOT`, by backend):
  * "int": the activations are quantized too, per token (max |x| / 127), and the dot runs on the integers,
    accumulating in int32, then is scaled (W8A8 with dynamic activation scales). On XLA:CPU (2-vCPU
    Sapphire Rapids, jax 0.10) this reads one byte per weight: [8, 576] x [576, 49152] took 1.46 ms
    against 2.50 for a bfloat16 dot and 7.45 for float32;
  * "dequant": the integers converted to bfloat16 inside the dot's operand, scaled per output channel
    after it. A backend that fuses the conversion into its matmul (XLA:GPU's Triton GEMMs) reads one byte
    per weight; XLA:CPU materializes the converted matrix every step (23.0 ms for the shape above).
On one H100 (LLaMA-3.1-8B shape, 8 x 32K, self-draft chain 3 at simulated acceptance 0.8, engine path,
2026-11-26) "dequant" with XLA's Triton GEMMs measured 1.44x plain decoding, "int" (cuBLAS) 1.37x, the
bfloat16 draft 1.18x; "dequant" without Triton GEMMs materializes the bfloat16 matrix (a draft step 21 ms
against 10 for bfloat16). So on a GPU int8 is "dequant" and a quantized draft asks for Triton GEMMs
(`xla_options`; the target's matmuls then use them too, as in the 1.44x run).
int4 matrices are converted and scaled group by group into a bfloat16 operand ("dequant" only; with one
scale per channel, converted only and scaled after the dot). On XLA:CPU that costs more than a bfloat16
dot. On the H100 (2026-11-26) the earlier layout, two values packed by hand into a uint8, did not fuse
(XLA concatenated the unpacked halves: 0.50x plain decoding). Native int4 with one scale per channel
(2026-11-27, same shape and method) fused: a chain-3 round's GEMMs 13.2 ms against 17.9 with int8, 1.61x
plain decoding; grouped scales cost a draft step 19.8 / 21.5 ms (groups of 64 / 128) against 8.2 for int8.

Where `int4_kernel()` is on (INT4_KERNELS by backend; off everywhere: on an H100 the kernel read its
bytes at under half XLA's per-channel rate inside the loop, 1.24x against 1.52x end to end, 2026-11-27,
docs/gpu.md run 5) a grouped int4 matrix (groups of 64 by default then) is stored packed instead, two
values a byte in pallas/int4_matmul.py's group-local layout (uint8 [K/2, N]), and multiplied by that
Pallas kernel, which reads the packed bytes and applies each group's scale and offset after the group's
dot. A product of more than KERNEL_MAX_ROWS rows (a model draft's prefill), or one under a mesh with a
model axis (sharding/kernels.py), goes through XLA's dequantized operand instead.

Every matrix is kept as the 2-D matrix its matmul reads (`dense` below): q/k/v [D, N*H], o [N*H, D],
gate/up [D, F], down [F, D], lm_head [D, V] (contracted on axis 0) and the embedding [V, D] (contracted on
axis 1 when it is a tied LM head; its rows dequantize for the lookup). `QuantizedWeight.shape` is the
parameter's own shape, so the layers' reshapes and Flax's shape check see what they always saw.
"""
from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from magicdec_jax import pallas
from magicdec_jax.pallas.int4_matmul import MAX_ROWS as KERNEL_MAX_ROWS
from magicdec_jax.pallas.int4_matmul import pack_int4, packable, unpack_int4

QUANT_KINDS = ("int8", "int4")
INT4_GROUPS = {"gpu": 0}              # backend -> int4 group size (0: per output channel); else DEFAULT_INT4_GROUP
DEFAULT_INT4_GROUP = 64
INT4_GROUP: int | None = None         # an override of the backend's group for this process (benchmarks)
INT4_KERNELS: dict = {}               # backend -> grouped int4 stored packed for the Pallas kernel (see above)
INT4_KERNEL: bool | None = None       # an override of the backend's INT4_KERNELS for this process (benchmarks)
# parameter names an "int4" copy keeps in int8: the LM head (tied: the embedding), the MLP down projections
# and the k / v projections, the matrices whose 4-bit error moved SmolLM2's predictions most for their
# bytes (see the module docstring)
INT4_KEEP_INT8: tuple[str, ...] = ("embed", "lm_head", "down", "k", "v")
INT8_MAX = 127
INT4_MIN, INT4_LEVELS = -8, 16        # int4 values -8 .. 7
INT4_SYMMETRIC_MAX = 7                # symmetric int4 (INT4_OFFSETS False): -7 .. 7
INT4_OFFSETS = True                   # asymmetric int4 (scale + offset); False: symmetric, max |w| / 7 (benchmarks)
INT8_DOTS = ("int", "dequant")
INT8_DOT = {"cpu": "int", "gpu": "dequant"}   # backend -> one of INT8_DOTS (see above); else DEFAULT_INT8_DOT
DEFAULT_INT8_DOT = "int"
INT4_STORAGE = {"cpu": jnp.int8}      # backend -> container of int4 values (default: native jnp.int4; see above)
XLA_OPTIONS = {"gpu": {"xla_gpu_enable_triton_gemm": True}}   # what a quantized draft's executables need
# backend -> the dtype into which XLA converts an int4 copy's matrices once per decode call, before the decode's
# while_loop, and holds while it runs (loop-invariant code motion: XLA:CPU, jax 0.10.2, seen in loop.decode's
# compiled HLO: tests/model/test_quant.py). On an H100 the conversion stayed fused in the loop's GEMMs (run 3).
# The cost model reads such an int4 element at the hoisted dtype's bytes, the memory planner counts both.
INT4_HOISTED = {"cpu": jnp.bfloat16}
# parameter name -> number of leading axes contracted (-1: the last axis is contracted)
CONTRACTED = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1, "lm_head": 1, "embed": -1,
              "fuse": 1, "fc": 1, "vocab_head": -1}   # the feature head's (feature_head.py): [nD, D], [2D, D], [Vd, D]


@flax.struct.dataclass
class QuantizedWeight:
  """A matrix stored as integers + float32 scales (and, for int4, offsets): w = q * scale (+ offset). q: int8
  ("int8") or int4 ("int4"; INT4_STORAGE) [K, N], with K the contracted size; scale: [N] ("int8") or
  [K/group, N] ("int4"), offset: None (int8, symmetric int4) or scale's shape (int4); all transposed ([N, K...]) when
  `axis` is 1 (the embedding)."""
  q: jax.Array
  scale: jax.Array
  kind: str = flax.struct.field(pytree_node=False)
  shape: tuple = flax.struct.field(pytree_node=False)       # the parameter's own (logical) shape
  axis: int = flax.struct.field(pytree_node=False)          # the contracted axis of the stored 2-D matrix
  dtype: str = flax.struct.field(pytree_node=False)         # the dtype it stands in for
  offset: jax.Array | None = None                           # int4: the value of q = 0 in each group

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


def quantize_matrix(w: jax.Array, kind: str, axis: int = 0, group: int | None = None):
  """A 2-D matrix contracted along `axis` -> (q, scale, offset) as QuantizedWeight stores them (offset None
  for int8). group: int4's group size (None: int4_group(); 0: the whole contracted axis, one scale and
  offset per output channel). Where int4_kernel() is on, grouped int4 along axis 0 comes packed (uint8
  [K/2, N]) where the kernel takes its shape."""
  if kind not in QUANT_KINDS:
    raise ValueError(f"quantized weights must be one of {QUANT_KINDS}, got {kind!r}")
  w = jnp.asarray(w, jnp.float32)
  if axis == 1:
    q, s, o = _quantize_k_major(w.T, kind, group)
    return q.T, s.T, (None if o is None else o.T)             # (.T of int8's [N] scales: themselves)
  q, s, o = _quantize_k_major(w, kind, group)
  k, n = w.shape
  if kind == "int4" and s.shape[0] > 1 and int4_kernel() and packable(k, n, k // s.shape[0]):
    q = pack_int4(q, k // s.shape[0])
  return q, s, o


def _quantize_k_major(w, kind, group):
  """quantize_matrix along axis 0, values unpacked."""
  if kind == "int8":
    amax = jnp.max(jnp.abs(w), axis=0)
    scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
    return jnp.clip(jnp.round(w / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale, None
  k, n = w.shape
  group = int4_group() if group is None else group
  group = k if group <= 0 else min(group, k)
  while k % group:                      # the largest power of two <= group dividing the contracted size
    group //= 2
  wg = w.reshape(k // group, group, n)
  storage = INT4_STORAGE.get(jax.default_backend(), jnp.int4)
  if not INT4_OFFSETS:                  # symmetric: 15 levels around 0, no offset
    amax = jnp.max(jnp.abs(wg), axis=1)
    scale = jnp.where(amax > 0, amax / INT4_SYMMETRIC_MAX, 1.0)
    q = jnp.clip(jnp.round(wg / scale[:, None]), -INT4_SYMMETRIC_MAX, INT4_SYMMETRIC_MAX)
    return q.reshape(k, n).astype(storage), scale, None
  lo, hi = jnp.min(wg, axis=1), jnp.max(wg, axis=1)                     # [K/g, N]
  scale = jnp.where(hi > lo, (hi - lo) / (INT4_LEVELS - 1), 1.0)
  offset = lo - INT4_MIN * scale                                         # the value of q = 0
  q = jnp.clip(jnp.round((wg - lo[:, None]) / scale[:, None]), 0, INT4_LEVELS - 1) + INT4_MIN
  return q.reshape(k, n).astype(storage), scale, offset


def quantize_weight(name: str, w: jax.Array, kind: str, group: int | None = None) -> QuantizedWeight:
  """One named parameter (see CONTRACTED) -> its QuantizedWeight."""
  if name not in CONTRACTED:
    raise ValueError(f"quantized draft weights: no rule for the {w.ndim}-D parameter {name!r} "
                     f"(known: {sorted(CONTRACTED)})")
  lead = CONTRACTED[name]
  if lead == -1:
    mat, axis = w.reshape(-1, w.shape[-1]), 1
  else:
    mat, axis = w.reshape(math.prod(w.shape[:lead]), -1), 0
  q, s, o = quantize_matrix(mat, kind, axis, group)
  return QuantizedWeight(q, s, kind=kind, shape=tuple(w.shape), axis=axis, dtype=str(jnp.dtype(w.dtype)),
                         offset=o)


def quantize_params(params, kind: str, group: int | None = None):
  """A copy of a params tree with every matrix (ndim >= 2) quantized; vectors (norm scales, biases) kept.
  An "int4" copy keeps the matrices named in INT4_KEEP_INT8 in int8 (as llama.cpp's Q4_K_M keeps its most
  sensitive matrices at more bits)."""
  def one(path, x):
    if x.ndim < 2:
      return x
    name = str(next((p.key for p in reversed(path) if isinstance(p, jax.tree_util.DictKey)), None))
    return quantize_weight(name, x, "int8" if kind == "int4" and name in INT4_KEEP_INT8 else kind, group)
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
    if w.kind == "int8" and int8_dot() == "int":
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


def int8_dot() -> str:
  """How int8 matrices are multiplied on the default backend (INT8_DOT)."""
  return INT8_DOT.get(jax.default_backend(), DEFAULT_INT8_DOT)


def int4_group() -> int:
  """The int4 group size on the default backend: INT4_GROUP if set, else DEFAULT_INT4_GROUP where the int4
  kernel is on (it exists to make groups cheap), else INT4_GROUPS (0: per channel)."""
  if INT4_GROUP is not None:
    return INT4_GROUP
  return DEFAULT_INT4_GROUP if int4_kernel() else INT4_GROUPS.get(jax.default_backend(), DEFAULT_INT4_GROUP)


def int4_kernel() -> bool:
  """Whether grouped int4 matrices are stored packed and multiplied by the Pallas kernel on the default
  backend: INT4_KERNEL if set, else INT4_KERNELS (off where unset)."""
  return INT4_KERNEL if INT4_KERNEL is not None else INT4_KERNELS.get(jax.default_backend(), False)


def xla_options(kind: str | None) -> dict:
  """XLA options for executables in which a draft multiplies `kind` weights (none for float copies)."""
  return dict(XLA_OPTIONS.get(jax.default_backend(), {})) if kind in QUANT_KINDS else {}


def _int4_group_bytes(group: int | None) -> float:
  """Scale (and offset) bytes per int4 element: float32 per group (int4_group() for None; 0: per channel)."""
  group = int4_group() if group is None else group
  return ((8.0 if INT4_OFFSETS else 4.0) / group) if group > 0 else 0.0


def _hoisted_bytes() -> float:
  """Bytes of the matrix the default backend converts an int4 copy into before the loop (INT4_HOISTED); 0:
  none (the conversion stays in the loop's matmuls)."""
  dtype = None if int4_kernel() else INT4_HOISTED.get(jax.default_backend())
  return 0.0 if dtype is None else float(jnp.dtype(dtype).itemsize)


def int4_bytes_per_value(group: int | None = None) -> float:
  """Bytes an int4 element costs where it is read as stored: half a byte and its share of the group's
  float32 scale (and offset)."""
  return 0.5 + _int4_group_bytes(group)


def weight_bytes_per_param(kind: str, group: int | None = None, kept_int8: float = 0.0) -> float:
  """Bytes a decode loop reads per matrix element of a copy, scales and offsets included; kept_int8: the
  share of an "int4" copy's elements kept in int8 (INT4_KEEP_INT8; kept_int8_share). Where the backend
  hoists the int4 conversion out of the loop (INT4_HOISTED: XLA:CPU) an int4 element is read as the
  converted matrix's, a bfloat16."""
  if kind == "int8":
    return 1.0
  value = _hoisted_bytes() or int4_bytes_per_value(group)
  return (1.0 - kept_int8) * value + kept_int8


def resident_bytes_per_param(kind: str, group: int | None = None, kept_int8: float = 0.0) -> float:
  """Bytes per matrix element a copy occupies while a decode runs (what the memory planner counts): an int4
  value in its INT4_STORAGE container (half a byte natively, a byte in an int8), its scales and offsets,
  and, where the backend hoists the conversion out of the loop (INT4_HOISTED), the converted matrix too."""
  if kind == "int8":
    return 1.0
  storage = INT4_STORAGE.get(jax.default_backend(), jnp.int4)
  value = 0.5 if storage == jnp.int4 or int4_kernel() else float(jnp.dtype(storage).itemsize)
  return (1.0 - kept_int8) * (value + _int4_group_bytes(group) + _hoisted_bytes()) + kept_int8


def kept_int8_share(matrix_elements: dict, kind: str) -> float:
  """The share of a copy's matrix elements an "int4" copy keeps in int8: matrix_elements maps parameter
  names to element counts (every matrix the share is over); 0 for other kinds."""
  if kind != "int4":
    return 0.0
  total = sum(matrix_elements.values())
  return sum(n for name, n in matrix_elements.items() if name in INT4_KEEP_INT8) / total if total else 0.0
