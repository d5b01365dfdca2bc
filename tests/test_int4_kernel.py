"""The group-wise int4 Pallas matmul (interpret mode on CPU) against float64 numpy."""
import numpy as np
import jax.numpy as jnp
import pytest

from magicdec_jax.layers import quant
from magicdec_jax.pallas.int4_matmul import pack_int4, pallas_int4_matmul


def unpack_by_hand(packed: np.ndarray, group: int) -> np.ndarray:
  """The documented layout read back in numpy: within each group of `group` rows, byte j holds row j
  (low nibble) and row j + group/2 (high nibble), each as q + 8."""
  half = group // 2
  k = packed.shape[0] * 2
  q = np.empty((k, packed.shape[1]), np.int64)
  for r in range(packed.shape[0]):
    g, j = divmod(r, half)
    q[g * group + j] = (packed[r] & 15).astype(np.int64) - 8
    q[g * group + half + j] = (packed[r] >> 4).astype(np.int64) - 8
  return q


def grouped(q, scale, offset, group):
  """float64 w = q * scale + offset, group by group along K."""
  k, n = q.shape
  w = q.reshape(k // group, group, n) * scale[:, None]
  if offset is not None:
    w = w + offset[:, None]
  return w.reshape(k, n)


def test_packing_is_the_documented_layout():
  rng = np.random.default_rng(0)
  q = rng.integers(-8, 8, (128, 48))
  packed = np.asarray(pack_int4(jnp.asarray(q, jnp.int8), 64))
  assert packed.dtype == np.uint8 and packed.shape == (64, 48)
  np.testing.assert_array_equal(unpack_by_hand(packed, 64), q)


@pytest.mark.parametrize("m, k, n, group, splits, per_step, block_n, offsets", [
    (3, 256, 64, 64, 2, 2, 32, True),     # rows padded to 16, two splits of two groups, one step each
    (8, 192, 48, 64, 3, 1, 16, False),    # symmetric (no offset), three groups in three splits
    (17, 128, 32, 32, 1, 4, None, True),  # rows past one 16-row tile, four groups a step
])
def test_kernel_matches_float64(m, k, n, group, splits, per_step, block_n, offsets):
  rng = np.random.default_rng(m)
  q = rng.integers(-8, 8, (k, n))
  scale = rng.uniform(0.01, 0.1, (k // group, n))
  offset = rng.normal(0, 0.1, (k // group, n)) if offsets else None
  x = rng.normal(size=(m, k))
  want = x @ grouped(q, scale, offset, group)
  got = pallas_int4_matmul(jnp.asarray(x, jnp.float32), pack_int4(jnp.asarray(q, jnp.int8), group),
                           jnp.asarray(scale, jnp.float32),
                           None if offset is None else jnp.asarray(offset, jnp.float32),
                           group=group, num_splits=splits, groups_per_step=per_step, block_n=block_n,
                           interpret=True)
  assert got.shape == (m, n) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4 * np.abs(want).max())


def test_kernel_reads_a_quantized_copy_in_bfloat16():
  """quant.quantize_matrix's grouped int4 (the CPU form) through the kernel with bfloat16 activations:
  within bfloat16 rounding of x of the float64 product with the dequantized matrix."""
  rng = np.random.default_rng(1)
  w = rng.normal(0, 0.05, (256, 64)) + 0.02
  q, scale, offset = quant.quantize_matrix(jnp.asarray(w, jnp.float32), "int4", 0, group=64)
  x = jnp.asarray(rng.normal(size=(8, 256)), jnp.bfloat16)
  deq = grouped(np.asarray(q, np.int64), np.asarray(scale, np.float64), np.asarray(offset, np.float64), 64)
  want = np.asarray(x, np.float64) @ deq
  got = pallas_int4_matmul(x, pack_int4(q, 64), scale, offset, group=64, num_splits=2, interpret=True)
  assert np.abs(np.asarray(got) - want).max() < 1e-4 * np.abs(want).max() + 1e-5


@pytest.mark.parametrize("kw, match", [
    (dict(group=48), "group=48"),
    (dict(group=64, num_splits=3), "num_splits=3"),
    (dict(group=64, num_splits=2, groups_per_step=3), "groups_per_step=3"),
    (dict(group=64, block_n=24), "block_n=24"),
])
def test_bad_kernel_arguments_are_refused_by_name(kw, match):
  x = jnp.zeros((8, 256), jnp.bfloat16)
  packed = jnp.zeros((128, 64), jnp.uint8)
  scale = jnp.ones((256 // kw["group"] if 256 % kw["group"] == 0 else 4, 64), jnp.float32)
  with pytest.raises(ValueError, match=match):
    pallas_int4_matmul(x, packed, scale, None, interpret=True, **kw)
