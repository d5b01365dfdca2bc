"""x @ W for a group-wise int4 matrix, as a split-K Pallas kernel that reads the packed bytes.

Why: XLA's GEMMs fuse a plain int4 -> bfloat16 conversion into their operand but not a per-group scale,
and grouped int4 keeps more of a draft's acceptance than one scale per channel
(docs/decisions.md#int4-kernel). This kernel multiplies
by a grouped int4 matrix reading half a byte a weight plus the group's scale and offset: each group's dot
is taken against the integers (exact in bfloat16) and scaled after it, so nothing is dequantized in memory.

Layout (`pack_int4`). The contracted axis K is cut in groups of g rows; inside a group, byte j (j < g/2)
holds row j in its low nibble and row j + g/2 in its high nibble, both as q + 8 in 0 .. 15. Packing never
crosses a group, so a shard of whole groups along K is a shard of the packed matrix. The activations are
split to match (`split_activations`): x_lo holds each group's first g/2 inputs, x_hi its last g/2, and
x_sum its sum (for the offset term: x . (q * s + o) = s * (x . q) + o * sum(x)).

Grid (N / block_n, splits). A program owns block_n output channels and K / splits of the contracted axis,
walks its groups `groups_per_step` at a time, and writes a float32 partial; XLA sums the splits. With a
batch of 8 decode rows (padded to 16, the Triton dot's minimum) the kernel is bound by reading the weight
bytes, and the splits exist to give a ~132-SM GPU enough programs.

An int4 copy is stored in this layout and multiplied here where its QuantForm.kernel says so: off on every
backend, because on a GPU it lost to XLA's per-channel form inside the decode loop
(docs/decisions.md#int4-kernel). `default_tiling` is a first guess; MEASURED_TILINGS takes measured ones.
Tested in interpret mode on CPU and lowered to Triton for CUDA there (jax.export).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

INT4_BIAS = 8              # stored nibble = q + 8, q in -8 .. 7
MIN_DOT = 16               # the Triton dot's smallest dimension
TARGET_PROGRAMS = 256      # default_tiling aims at about two waves of programs on a ~132-SM GPU (untuned)
MIN_BLOCK_N = 32
# a decode kernel: every program holds all rows of x; more rows than this (a model draft's chunked prefill)
# go through XLA instead (quant.quantized_dense), where the product is compute-bound anyway
MAX_ROWS = 128
PARTIAL_SHARE = 1 / 8      # default_tiling keeps the splits' float32 partials within this share of the weight bytes
# (K, N) -> a tiling measured best for that matrix shape (block_n, num_splits, groups_per_step, and for Triton
# num_warps / num_stages), which default_tiling returns instead of its guess; empty unless a benchmark fills
# it from measured figures (docs/decisions.md#int4-kernel)
MEASURED_TILINGS: dict = {}


def pack_int4(q: jax.Array, group: int) -> jax.Array:
  """Int4 values q [K, N] (-8 .. 7, any integer dtype) -> uint8 [K/2, N] in the group-local layout above."""
  k, n = q.shape
  _check_group(k, group)
  nib = (q.astype(jnp.int32) + INT4_BIAS).reshape(k // group, 2, group // 2, n)
  return (nib[:, 0] | (nib[:, 1] << 4)).reshape(k // 2, n).astype(jnp.uint8)


def unpack_int4(packed: jax.Array, group: int) -> jax.Array:
  """pack_int4's bytes [K/2, N] -> the int4 values [K, N] as int8."""
  half, n = packed.shape
  _check_group(2 * half, group)
  p = packed.astype(jnp.int32).reshape(2 * half // group, 1, group // 2, n)
  q = jnp.concatenate([p & 15, p >> 4], axis=1) - INT4_BIAS
  return q.reshape(2 * half, n).astype(jnp.int8)


def packable(k: int, n: int, group: int) -> bool:
  """Whether a [K, N] matrix in groups of `group` fits the kernel (see _check_group and default_block_n)."""
  return group >= 2 * MIN_DOT and not group & (group - 1) and k % group == 0 and n % MIN_DOT == 0


def split_activations(x: jax.Array, group: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """x [M, K] -> (x_lo [M, K/2], x_hi [M, K/2], x_sum [M, K/g] float32) matching pack_int4's layout."""
  m, k = x.shape
  xg = x.reshape(m, k // group, 2, group // 2)
  x_sum = jnp.sum(xg.astype(jnp.float32), axis=(2, 3))
  return xg[:, :, 0].reshape(m, k // 2), xg[:, :, 1].reshape(m, k // 2), x_sum


def _check_group(k: int, group: int):
  if group < 2 * MIN_DOT or group & (group - 1) or k % group:
    raise ValueError(f"int4 kernel: group={group} must be a power of two >= {2 * MIN_DOT} dividing the "
                     f"contracted size {k}")


def _kernel(xlo_ref, xhi_ref, xsum_ref, w_ref, s_ref, o_ref, out_ref, *, half: int, groups_per_split: int,
            groups_per_step: int, precision):
  """One (output block, split) program. xlo/xhi [Mp, K/2]; xsum [Mp, G]; w [K/2, Bn] uint8;
  s/o [G, Bn] float32; out [Mp, Bn] float32 (this split's partial)."""
  first = pl.program_id(1) * groups_per_split

  def body(i, acc):
    for u in range(groups_per_step):                          # static unroll: several groups a step
      gi = first + i * groups_per_step + u
      rows = pl.ds(gi * half, half)
      p = w_ref[rows, :].astype(jnp.int32)                    # [g/2, Bn]
      lo = ((p & 15) - INT4_BIAS).astype(xlo_ref.dtype)
      hi = ((p >> 4) - INT4_BIAS).astype(xhi_ref.dtype)
      d = (jnp.dot(xlo_ref[:, rows], lo, preferred_element_type=jnp.float32, precision=precision)
           + jnp.dot(xhi_ref[:, rows], hi, preferred_element_type=jnp.float32, precision=precision))
      one = pl.ds(gi, 1)
      acc = acc + d * s_ref[one, :] + xsum_ref[:, one] * o_ref[one, :]
    return acc

  acc = jnp.zeros(out_ref.shape, jnp.float32)
  out_ref[...] = lax.fori_loop(0, groups_per_split // groups_per_step, body, acc)


def default_block_n(n: int) -> int:
  """The widest of 128, 64, 32, 16 output channels dividing n."""
  for b in (128, 64, 32, MIN_DOT):
    if n % b == 0:
      return b
  raise ValueError(f"int4 kernel: the output size {n} must be a multiple of {MIN_DOT}")


def default_tiling(k: int, n: int, group: int, rows: int = MIN_DOT) -> dict:
  """block_n, num_splits and groups_per_step for a [K, N] matrix and `rows` (padded) rows of x: output
  blocks narrowed (down to MIN_BLOCK_N) until there are TARGET_PROGRAMS of them, then K-splits (a power of
  two dividing the groups) added while short of that and while their float32 partials, written and read
  back, stay within PARTIAL_SHARE of the weight bytes; two groups a step where a split has an even number.
  A first guess (untuned on a GPU; docs/decisions.md#int4-kernel); MEASURED_TILINGS wins."""
  if (k, n) in MEASURED_TILINGS:
    return dict(MEASURED_TILINGS[k, n])
  block_n = default_block_n(n)
  while n // block_n < TARGET_PROGRAMS and block_n > MIN_BLOCK_N and n % (block_n // 2) == 0:
    block_n //= 2
  groups, splits = k // group, 1
  partial_bytes = lambda s: 2 * s * rows * n * 4
  while (groups % (2 * splits) == 0 and (n // block_n) * splits < TARGET_PROGRAMS
         and partial_bytes(2 * splits) <= PARTIAL_SHARE * k * n / 2):
    splits *= 2
  per_split = groups // splits
  return dict(block_n=block_n, num_splits=splits, groups_per_step=2 if per_split % 2 == 0 else 1)


def pallas_int4_matmul(x: jax.Array, packed: jax.Array, scale: jax.Array, offset: jax.Array | None, *,
                       group: int, block_n: int | None = None, num_splits: int = 1, groups_per_step: int = 1,
                       interpret: bool = False, compiler_params=None) -> jax.Array:
  """x [M, K] @ W -> [M, N] float32, W [K, N] = q * scale + offset group-wise (q from pack_int4's `packed`
  [K/2, N]; scale, offset [K/g, N]; offset None: symmetric). num_splits must divide the K/g groups and
  groups_per_step the groups of a split."""
  m, k = x.shape
  n = packed.shape[1]
  _check_group(k, group)
  groups = k // group
  if packed.shape != (k // 2, n) or packed.dtype != jnp.uint8:
    raise ValueError(f"int4 kernel: packed must be uint8 [{k // 2}, {n}], got {packed.dtype} {packed.shape}")
  if scale.shape != (groups, n) or (offset is not None and offset.shape != (groups, n)):
    raise ValueError(f"int4 kernel: scale / offset must be [{groups}, {n}], got {scale.shape} / "
                     f"{None if offset is None else offset.shape}")
  if num_splits < 1 or groups % num_splits:
    raise ValueError(f"int4 kernel: num_splits={num_splits} must divide the {groups} groups")
  per_split = groups // num_splits
  if groups_per_step < 1 or per_split % groups_per_step:
    raise ValueError(f"int4 kernel: groups_per_step={groups_per_step} must divide the {per_split} groups "
                     f"of a split")
  block_n = default_block_n(n) if block_n is None else block_n
  if block_n < MIN_DOT or block_n & (block_n - 1) or n % block_n:
    raise ValueError(f"int4 kernel: block_n={block_n} must be a power of two >= {MIN_DOT} dividing {n}")
  if offset is None:
    offset = jnp.zeros_like(scale)

  mp = max(MIN_DOT, -(-m // MIN_DOT) * MIN_DOT)
  x_lo, x_hi, x_sum = split_activations(jnp.pad(x, ((0, mp - m), (0, 0))), group)
  kernel = functools.partial(_kernel, half=group // 2, groups_per_split=per_split,
                             groups_per_step=groups_per_step,
                             precision=lax.Precision.HIGHEST if x.dtype == jnp.float32 else None)
  whole = lambda j, s: (0, 0)
  columns = lambda j, s: (0, j)
  partial = pl.pallas_call(
      kernel,
      grid=(n // block_n, num_splits),
      in_specs=[
          pl.BlockSpec((mp, k // 2), whole),                  # x_lo
          pl.BlockSpec((mp, k // 2), whole),                  # x_hi
          pl.BlockSpec((mp, groups), whole),                  # x_sum
          pl.BlockSpec((k // 2, block_n), columns),           # packed weight
          pl.BlockSpec((groups, block_n), columns),           # scale
          pl.BlockSpec((groups, block_n), columns),           # offset
      ],
      out_specs=pl.BlockSpec((None, mp, block_n), lambda j, s: (s, 0, j)),
      out_shape=jax.ShapeDtypeStruct((num_splits, mp, n), jnp.float32),
      interpret=interpret,
      compiler_params=compiler_params,
      name="int4_matmul",
  )(x_lo, x_hi, x_sum, packed, scale.astype(jnp.float32), offset.astype(jnp.float32))
  return jnp.sum(partial, axis=0)[:m]


__all__ = ["MAX_ROWS", "MEASURED_TILINGS", "pack_int4", "unpack_int4", "packable", "split_activations",
           "pallas_int4_matmul", "default_block_n", "default_tiling"]
