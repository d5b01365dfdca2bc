"""Prefix + tree attention (XLA path and the Pallas kernel in interpret mode) against float64 numpy.

Cases cover random BFS-ordered trees, chains and causal prefill chunks; ragged prefix lengths
(including 0, lengths not a multiple of block_k, and a row that fills the cache to its last slot);
GQA ratios 1, 3, 8; D 64 and 32; float32 and bfloat16. Cache slots past base + T are poisoned so any
leak of invisible slots shows up as NaN or a huge error.
"""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from magicdec_jax import pallas as P
from magicdec_jax.pallas.tree_attention import pallas_tree_attention
from magicdec_jax.pallas.xla_attention import xla_tree_attention

from conftest import float64_attention

F32_TOL = 1e-5
BF16_TOL = 2e-2


def random_tree_anc(rng, t):
  """Ancestor-or-self mask [T, T] of a random tree whose nodes are in BFS order."""
  parent = [-1] + [0] * (t - 1)
  for i in range(2, t):
    parent[i] = int(rng.integers(parent[i - 1], i))
  anc = np.zeros((t, t), bool)
  for i in range(t):
    if parent[i] >= 0:
      anc[i] = anc[parent[i]]
    anc[i, i] = True
  return anc


def make_anc(rng, kind, t):
  if kind == "tree":
    return random_tree_anc(rng, t)
  return np.tril(np.ones((t, t), bool))  # chain and causal prefill chunk have the same mask


def make_case(seed, *, b, t, kh, g, d, s, base, kind, dtype=jnp.float32, poison_v=np.nan):
  rng = np.random.default_rng(seed)
  base = np.asarray(base, np.int32)
  assert base.shape == (b,) and (base + t <= s).all()
  q = rng.standard_normal((b, t, kh * g, d)).astype(np.float32)
  k = rng.standard_normal((b, kh, s, d)).astype(np.float32)   # cache layout [B, K, S, D]
  v = rng.standard_normal((b, kh, s, d)).astype(np.float32)
  q, k, v = (np.array(jnp.asarray(x, dtype).astype(jnp.float32)) for x in (q, k, v))
  anc = make_anc(rng, kind, t)
  ref = float64_attention(q, k, v, base, anc)
  for r in range(b):  # poison never-visible slots after computing the reference
    k[r, :, base[r] + t:] = np.nan
    v[r, :, base[r] + t:] = poison_v
  args = tuple(jnp.asarray(x, dtype) for x in (q, k, v)) + (jnp.asarray(base), jnp.asarray(anc))
  return args, ref


def rel_err(out, ref):
  out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
  assert np.isfinite(out).all(), "invisible slots leaked NaN/inf"
  return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


XLA_CASES = [  # (kind, b, t, kh, g, d, s, base)
    ("tree", 3, 16, 2, 1, 64, 200, [0, 37, 184]),
    ("tree", 2, 7, 2, 3, 64, 150, [143, 64]),
    ("tree", 2, 31, 1, 8, 64, 96, [65, 0]),
    ("chain", 4, 4, 2, 3, 64, 128, [0, 1, 63, 124]),
    ("chain", 2, 1, 4, 8, 64, 300, [299, 17]),
    ("prefill", 2, 32, 2, 3, 32, 160, [0, 128]),
    ("prefill", 1, 64, 1, 1, 64, 64, [0]),
]


@pytest.mark.parametrize("i", range(len(XLA_CASES)))
def test_xla_float32(i):
  kind, b, t, kh, g, d, s, base = XLA_CASES[i]
  args, ref = make_case(i, b=b, t=t, kh=kh, g=g, d=d, s=s, base=base, kind=kind, poison_v=1e30)
  err = rel_err(jax.jit(xla_tree_attention)(*args), ref)
  assert err <= F32_TOL, err


def test_xla_bfloat16():
  args, ref = make_case(11, b=2, t=16, kh=2, g=3, d=64, s=200, base=[5, 170], kind="tree",
                        dtype=jnp.bfloat16, poison_v=1e30)
  out = xla_tree_attention(*args)
  assert out.dtype == jnp.bfloat16
  assert rel_err(out, ref) <= BF16_TOL


PALLAS_CASES = [  # (kind, b, t, kh, g, d, s, base, knobs)
    # ragged rows, empty splits, a row ending at the last cache slot (S % block_k != 0)
    ("tree", 3, 7, 2, 3, 64, 150, [0, 77, 143], dict(block_k=32, num_splits=3)),
    # G = 8, multiple query-row blocks (rows 64 in blocks of 16), prefix not a block multiple
    ("tree", 2, 8, 1, 8, 64, 100, [41, 92], dict(block_k=16, block_q=16, num_splits=2)),
    # chain, G = 1, row count padded from 4 to 16
    ("chain", 2, 4, 2, 1, 64, 64, [60, 13], dict(block_k=16, num_splits=1)),
    # causal prefill chunk, D = 32, default knobs
    ("prefill", 2, 16, 2, 1, 32, 96, [0, 50], {}),
]


@pytest.mark.parametrize("i", range(len(PALLAS_CASES)))
def test_pallas_interpret_float32(i):
  kind, b, t, kh, g, d, s, base, knobs = PALLAS_CASES[i]
  args, ref = make_case(100 + i, b=b, t=t, kh=kh, g=g, d=d, s=s, base=base, kind=kind)
  err = rel_err(pallas_tree_attention(*args, interpret=True, **knobs), ref)
  assert err <= F32_TOL, err


def test_pallas_interpret_bfloat16_jit_dispatch():
  args, ref = make_case(200, b=2, t=16, kh=2, g=3, d=64, s=120, base=[3, 104], kind="tree",
                        dtype=jnp.bfloat16)
  fn = jax.jit(lambda *a: P.tree_attention(*a, impl="pallas_interpret", block_k=32, num_splits=2))
  out = fn(*args)
  assert out.dtype == jnp.bfloat16 and out.shape == args[0].shape
  assert rel_err(out, ref) <= BF16_TOL


def test_pallas_matches_xla_with_poisoned_buffers():
  """Uninitialised kernel buffers filled with NaN (pl.enable_poison_buffers) must not matter."""
  from jax.experimental import pallas as pl
  args, ref = make_case(300, b=1, t=5, kh=1, g=3, d=64, s=40, base=[35], kind="tree",
                        poison_v=1e30)
  poison = getattr(pl, "enable_poison_buffers", None)
  ctx = poison(True) if poison is not None else jax.default_matmul_precision("highest")
  with ctx:
    out = pallas_tree_attention(*args, interpret=True, block_k=16, num_splits=4)
  xla = xla_tree_attention(*args)
  assert rel_err(out, ref) <= F32_TOL and rel_err(xla, ref) <= F32_TOL


def test_dispatch():
  args, ref = make_case(400, b=1, t=3, kh=1, g=1, d=32, s=20, base=[4], kind="chain", poison_v=0.0)
  if jax.default_backend() == "cpu":
    assert P.resolve_impl(*args) == "xla"
  assert rel_err(P.tree_attention(*args), ref) <= F32_TOL
  with pytest.raises(ValueError):
    P.tree_attention(*args, impl="cuda")
  with pytest.raises(NotImplementedError):
    P.tree_attention(*args, impl="pallas_mosaic")


def test_auto_falls_back_when_triton_does_not_compile():
  """The probe used by "auto" reports False (with a warning) where Triton cannot lower, e.g. on CPU."""
  if jax.default_backend() == "gpu":
    pytest.skip("Triton may lower here")
  P.triton_compiles.cache_clear()
  sig = (((1, 2, 2, 32), jnp.dtype("float32")), ((1, 16, 1, 32), jnp.dtype("float32")),
         ((1, 16, 1, 32), jnp.dtype("float32")), ((1,), jnp.dtype("int32")), ((2, 2), jnp.dtype(bool)))
  kw = (("block_k", None), ("block_q", None), ("num_splits", None), ("num_warps", None),
        ("num_stages", None))
  with pytest.warns(RuntimeWarning, match="falling back to XLA"):
    assert P.triton_compiles(sig, None, kw) is False
