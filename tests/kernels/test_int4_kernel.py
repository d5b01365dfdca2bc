"""The group-wise int4 Pallas matmul (interpret mode on CPU) against float64 numpy, and a draft's int4 copy
stored packed for it (QuantForm.kernel) decoding plain decoding's tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import compile as compiling
from magicdec_jax import pallas
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers import quant
from magicdec_jax.layers.dense import dense
from magicdec_jax.model import init_params
from magicdec_jax.pallas.int4_matmul import (MAX_ROWS, MEASURED_TILINGS, PARTIAL_SHARE, TARGET_PROGRAMS,
                                             default_tiling, pack_int4, pallas_int4_matmul, unpack_int4)
from magicdec_jax.trees import Tree
from magicdec_jax.tuning import hlo
from conftest import compiled_decode, random_prompts, tiny_model


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
  np.testing.assert_array_equal(np.asarray(unpack_int4(jnp.asarray(packed), 64)), q)


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


@pytest.mark.parametrize("k, n", [(4096, 4096), (4096, 14336), (14336, 4096), (576, 1536), (128, 48)])
def test_default_tiling_is_a_valid_split(k, n):
  """The kernel's arguments hold (block_n divides N, splits the groups, steps a split's groups), and a split
  costs its float32 partials (16 rows, written and read) at most PARTIAL_SHARE of the int4 weight bytes."""
  t = default_tiling(k, n, 64)
  groups, programs = k // 64, (n // t["block_n"]) * t["num_splits"]
  assert n % t["block_n"] == 0 and groups % t["num_splits"] == 0
  assert (groups // t["num_splits"]) % t["groups_per_step"] == 0
  assert t["num_splits"] == 1 or 2 * t["num_splits"] * 16 * n * 4 <= PARTIAL_SHARE * k * n / 2
  assert t["num_splits"] == 1 or programs <= 2 * TARGET_PROGRAMS


@pytest.mark.parametrize("m, k, n", [(8, 4096, 4096), (32, 4096, 14336), (8, 14336, 4096), (8, 576, 1536)])
def test_the_drafts_kernel_call_lowers_to_triton_for_a_gpu(m, k, n):
  """The call quantized_dense makes on a GPU (Triton, default_tiling), lowered for CUDA on this CPU through
  jax.export: Pallas Triton's lowering rules hold at LLaMA-3.1-8B's and SmolLM2's shapes (Triton's own
  compile to GPU code is not checked here)."""
  if not pallas.has_triton():
    pytest.skip("this jax has no Pallas Triton backend")
  kernel = pallas.int4_kernel(m, k, n, 64, triton=True)
  args = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k // 2, n), jnp.uint8),
          jax.ShapeDtypeStruct((k // 64, n), jnp.float32), jax.ShapeDtypeStruct((k // 64, n), jnp.float32))
  exported = compiling.export_for("cuda", kernel, *args)
  assert compiling.TRITON_CALL in exported.mlir_module()
  assert exported.out_avals[0].shape == (m, n)


@pytest.fixture
def int4_kernel_on(monkeypatch):
  """The backend's QuantForm with the kernel on (grouped int4 stored packed, multiplied by the kernel; groups
  of 64), with fresh draft copies; returns a function that sets another group."""
  def use(group):
    monkeypatch.setitem(quant.FORMS, jax.default_backend(), base.replace(kernel=True, group=group))
  base = quant.backend_form()
  use(64)
  monkeypatch.setattr(draft_weights, "_NARROW", {})
  return use


@pytest.mark.parametrize("rows", [6, 2 * 100])
def test_a_packed_copy_multiplies_like_float64(rows, int4_kernel_on):
  """With the kernel on, quantize_weight packs a grouped int4 matrix (groups of 64: the kernel's default)
  and dense() multiplies by it: the float64 product of x (rounded to bfloat16) with the matrix the packed
  bytes, scales and offsets stand for, read back by hand; that matrix is within half a step of w. Past
  MAX_ROWS rows (a prefill) XLA multiplies the dequantized bfloat16 matrix: within its rounding."""
  rng = np.random.default_rng(5)
  w = rng.normal(0, 0.05, (4, 64, 96)).astype(np.float32)           # an o projection [N, H, D]
  qw = quant.quantize_weight("o", jnp.asarray(w), "int4")
  assert qw.packed and qw.group == 64 and qw.q.shape == (128, 96)
  scale, offset = np.asarray(qw.scale, np.float64), np.asarray(qw.offset, np.float64)
  deq = grouped(unpack_by_hand(np.asarray(qw.q), 64), scale, offset, 64)
  assert np.all(np.abs(deq - w.reshape(256, 96)) <= np.repeat(scale, 64, 0) / 2 * (1 + 1e-5))
  np.testing.assert_allclose(np.asarray(qw.dequantize(jnp.float32)), deq, rtol=1e-6, atol=1e-7)
  x = rng.normal(size=(2, rows // 2, 256)).astype(np.float32)          # the heads flattened, as attention does
  product = lambda a: dense("BTK,KD->BTD", a, qw.reshape(256, 96))
  assert ("pallas_call" in str(jax.make_jaxpr(product)(jnp.asarray(x)))) == (rows <= MAX_ROWS)
  got = np.asarray(jax.jit(product)(jnp.asarray(x)))
  want = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64).reshape(rows, 256) @ deq
  tol = 1e-4 if rows <= MAX_ROWS else 2 ** -8 * np.abs(x).max() * np.abs(deq).max() * 256 / np.abs(want).max()
  assert np.abs(got.reshape(rows, 96) - want).max() < tol * np.abs(want).max()


@pytest.mark.parametrize("make, kw", [
    (lambda m: md.StreamingDraft(2, 8, weights="int4"), {"gamma": 3}),
    (lambda m: md.StreamingDraft(2, 8, weights="int4"), {"tree": Tree((-1, 0, 0, 1, 2))}),
    (lambda m: md.ModelDraft(m, 2, 8, weights="int4"), {"gamma": 2})])        # its prefill: > MAX_ROWS rows
def test_drafts_on_a_packed_int4_copy_decode_the_autoregressive_tokens(make, kw, int4_kernel_on):
  """Drafts whose int4 matrices are packed and multiplied by the kernel (groups of 32, so the tiny model's
  q / gate / up, K = 64, have two groups): plain decoding's tokens, chain and tree; a model draft's own
  prefill multiplies its copy through XLA (more rows than the kernel takes)."""
  int4_kernel_on(32)
  model = tiny_model(3, attn_scale=8.0, hidden=64)
  prompts = random_prompts([40, 23, 57], model.config.vocab_size, seed=7)
  want = md.generate(model, prompts, max_new_tokens=16).tokens
  copy = draft_weights.copy_of(model.params, "int4")
  isq = lambda x: isinstance(x, quant.QuantizedWeight)
  assert sum(x.packed for x in jax.tree.leaves(copy, is_leaf=isq) if isq(x)) == 3 * model.config.num_layers
  res = md.generate(model, prompts, max_new_tokens=16, draft=make(model), **kw)
  assert res.tokens == want
  assert res.stats["acceptance_rate"] > 0


def test_a_packed_copy_is_priced_at_its_bytes(int4_kernel_on):
  """Packed, an int4 element is half a byte and its group's float32 scale and offset, read and held as
  such (no converted matrix beside it, as XLA:CPU's hoisting keeps for the unpacked form)."""
  assert quant.backend_form().group == 64 and quant.backend_form().kernel
  assert quant.weight_bytes_per_param("int4") == pytest.approx(0.5 + 8 / 64)
  assert quant.resident_bytes_per_param("int4") == pytest.approx(0.5 + 8 / 64)


def test_the_decode_loop_reads_a_packed_copy_as_stored(int4_kernel_on):
  """What the cost model's packed count rests on (no QuantForm.hoisted matrix with the kernel): in
  loop.decode's compiled HLO (as in test_quant's hoisting test) the while loop carries the packed bytes
  (q [192, 128] as u8 [96, 128], gate / up [192, 320] as [96, 320]) and no bfloat16 matrix of their shape."""
  cfg = ModelConfig(vocab_size=160, hidden_size=192, intermediate_size=320, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=32, max_position_embeddings=512, dtype="float32")
  params = init_params(cfg, jax.random.key(0))
  draft = md.StreamingDraft(2, 8, weights="int4")
  text, _, _ = compiled_decode(params, draft_weights.copy_of(params, "int4"), cfg, draft.spec, Tree.chain(2),
                               2, 32, 8)
  carried = hlo.while_carried(text)
  assert ("u8", (96, 128)) in carried and ("u8", (96, 320)) in carried, carried
  assert not {("bf16", (192, 128)), ("bf16", (192, 320))} & carried, carried


def test_a_measured_tiling_replaces_the_guess(monkeypatch):
  """pallas.int4_matmul.MEASURED_TILINGS (filled by a benchmark from measured figures) wins over
  default_tiling's guess for its shape only, and its Triton warps / stages reach the compiler params."""
  tiling = dict(block_n=64, num_splits=4, groups_per_step=2, num_warps=2, num_stages=3)
  monkeypatch.setitem(MEASURED_TILINGS, (4096, 4096), tiling)
  assert default_tiling(4096, 4096, 64) == tiling and default_tiling(4096, 14336, 64) != tiling
  kernel = pallas.int4_kernel(8, 4096, 4096, 64, triton=False)
  assert {k: kernel.keywords[k] for k in ("block_n", "num_splits", "groups_per_step")} == \
      dict(block_n=64, num_splits=4, groups_per_step=2)
  if pallas.has_triton():
    params = pallas.int4_kernel(8, 4096, 4096, 64, triton=True).keywords["compiler_params"]
    assert (params.num_warps, params.num_stages) == (2, 3)
