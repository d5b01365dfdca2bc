"""The fixed-shape attention kernel (pallas/fixed_attention.py) in interpret mode on a CPU.

Its contract is bitwise: a query row's output the same alone, among T query tokens, among B rows and at other
cache slot counts (more splits), and a tree node's output the same as its token decoded along its path (a
chain, and a plain one-token step). Each check compares the kernel with itself across those layouts, so the
first test ties it to a float64 numpy reference. The last test runs the engine end to end on a tiny random
model with invariant numerics and FixedShapes(attention="pallas_interpret"): greedy chains and a small tree
give plain decoding's tokens. Shapes are small: the interpreter runs every grid program in turn.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import backend, engine, pallas, plan
from magicdec_jax import compile as compiling
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.layers.attention import PrefixTree, attend
from magicdec_jax.prompts import pad_prompts
from magicdec_jax.testing import random_tiny_model
from magicdec_jax.trees import Tree

from conftest import float64_attention, random_prompts

# key blocks of 16 slots, a tail of 2 blocks (trees of depth <= 16), splits of 32 slots: a cache of 96 slots
# is 3 splits, one of 160 five
FIXED = dataclasses.replace(backend.CPU, attention="pallas_interpret", query_tokens=4, key_block=16, tail_blocks=2,
                            split_slots=32)
H, KH, D = 4, 2, 16


@functools.partial(jax.jit, static_argnames="fixed")
def kernel(q, k, v, base, anc, fixed):
  return pallas.fixed_attention(q, k, v, base, anc, fixed=fixed)


def run(q, k, v, base, anc, fixed=FIXED):
  return np.asarray(kernel(q, k, v, base, anc, fixed), np.float32)


def random_qkv(rng, b, t, s, dtype=jnp.bfloat16):
  q = jnp.asarray(rng.normal(size=(b, t, H, D)), dtype)
  k = jnp.asarray(rng.normal(size=(b, KH, s, D)), dtype)
  v = jnp.asarray(rng.normal(size=(b, KH, s, D)), dtype)
  return q, k, v


def chain(t: int) -> jax.Array:
  return jnp.tril(jnp.ones((t, t), bool))


def ancestors(parents) -> np.ndarray:
  t = len(parents)
  anc = np.eye(t, dtype=bool)
  for j, p in enumerate(parents):
    if p >= 0:
      anc[j] |= anc[p]
  return anc


PARENTS = (-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 9, 3)     # depths 0..5, siblings between every node and its ancestors


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_matches_a_float64_reference_for_chains_and_trees(dtype):
  """Chains of 1, 6 and 9 tokens (several query tiles, prefixes across split boundaries) and a tree, rows at
  different bases, against float64 numpy: 1e-5 in float32, bfloat16's rounding of p in bfloat16."""
  rng = np.random.default_rng(0)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for t, anc, bases in ((1, chain(1), (0, 95)), (6, chain(6), (31, 64)), (9, chain(9), (5, 70)),
                        (len(PARENTS), jnp.asarray(ancestors(PARENTS)), (33, 47))):
    q, k, v = random_qkv(rng, 2, t, 96, dtype)
    base = jnp.asarray(bases, jnp.int32)
    got = run(q, k, v, base, anc)
    np.testing.assert_allclose(got, float64_attention(q, k, v, base, anc), atol=tol, rtol=tol, err_msg=f"T={t}")


def test_a_row_is_the_same_bits_alone_among_tokens_rows_and_slot_counts():
  """bfloat16: chains of 7 tokens over 3 rows and 96 slots give every (row, token) bitwise what one-token
  steps give to that row alone over 160 slots (two more splits, all masked), and what the row gives among a
  batch of 5 over 96 slots; each position's base crosses key blocks and splits."""
  rng = np.random.default_rng(1)
  t = 7
  q, k, v = random_qkv(rng, 5, t, 96)
  base = jnp.asarray([29, 57, 3, 88 - t, 40], jnp.int32)
  wide = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, 64), (0, 0)))         # noqa: E731
  three = run(q[:3], k[:3], v[:3], base[:3], chain(t))
  five = run(q, k, v, base, chain(t))
  np.testing.assert_array_equal(three, five[:3])
  for r in range(3):
    for j in range(t):
      step = run(q[r:r + 1, j:j + 1], wide(k[r:r + 1]), wide(v[r:r + 1]), base[r:r + 1] + j, chain(1))
      np.testing.assert_array_equal(step[0, 0], three[r, j], err_msg=f"row {r} token {j}")


def test_a_tree_node_is_the_chain_along_its_path_and_the_plain_step():
  """A tree's nodes sit at slots base + index, with siblings between a node and its ancestors; each node's
  output is bitwise the output of its token at the end of a chain holding its path at base .. base + depth,
  and of a plain one-token step there; for rows whose tails start at different key blocks. (The chains and
  steps of all nodes run as the rows of one batch per length: rows are independent, tested above.)"""
  rng = np.random.default_rng(2)
  anc = ancestors(PARENTS)
  t, s = len(PARENTS), 96
  depth = anc.sum(1) - 1
  for bases in ((14, 33), (47, 60)):
    base = jnp.asarray(bases, jnp.int32)
    q, k, v = random_qkv(rng, 2, t, s)
    tree = run(q, k, v, base, jnp.asarray(anc))
    pairs = [(r, j) for r in range(2) for j in range(t)]

    def path_cache(r, j, x):                     # row r's cache with node j's path at base .. base + depth
      b0, path = int(base[r]), np.flatnonzero(anc[j])
      return x[r].at[:, b0:b0 + len(path)].set(x[r][:, b0 + path])

    kc = jnp.stack([path_cache(r, j, k) for r, j in pairs])
    vc = jnp.stack([path_cache(r, j, v) for r, j in pairs])
    steps = run(jnp.stack([q[r, j:j + 1] for r, j in pairs]), kc, vc,
                jnp.asarray([int(base[r] + depth[j]) for r, j in pairs], jnp.int32), chain(1))
    for n, (r, j) in enumerate(pairs):
      np.testing.assert_array_equal(steps[n, 0], tree[r, j], err_msg=f"node {j} row {r} (plain step)")
    for d in sorted(set(depth.tolist())):
      at = [n for n, (r, j) in enumerate(pairs) if depth[j] == d]
      qs = jnp.stack([q[pairs[n][0], np.flatnonzero(anc[pairs[n][1]])] for n in at])
      along = run(qs, kc[np.asarray(at)], vc[np.asarray(at)], base[np.asarray([pairs[n][0] for n in at])],
                  chain(d + 1))
      for i, n in enumerate(at):
        np.testing.assert_array_equal(along[i, -1], tree[pairs[n]], err_msg=f"node {pairs[n][1]} row {pairs[n][0]} (chain)")


def test_slots_past_the_round_are_never_read_and_deep_trees_are_refused():
  """NaN in every slot past a row's round leaves the outputs unchanged (a split past the live range adds
  exact zeros, and no block past the tile's prefix is read); a tree deeper than the tail is refused, a
  chain (a prefill chunk) of any length is not."""
  rng = np.random.default_rng(3)
  t = 5
  q, k, v = random_qkv(rng, 2, t, 128)
  base = jnp.asarray([20, 61], jnp.int32)
  clean = run(q, k, v, base, chain(t))
  dead = jnp.arange(128)[None, None, :, None] >= (base + t)[:, None, None, None]
  nan_k, nan_v = jnp.where(dead, jnp.nan, k), jnp.where(dead, jnp.nan, v)
  np.testing.assert_array_equal(run(q, nan_k, nan_v, base, chain(t)), clean)
  deep = jnp.asarray(ancestors((-1,) + tuple(range(17)) + (0,)))      # depth 17 > 16 slots of tail
  with pytest.raises(ValueError, match="exceeds"):
    run(*random_qkv(rng, 1, 19, 128), jnp.asarray([3], jnp.int32), deep)
  q, k, v = random_qkv(rng, 1, 40, 128, jnp.float32)                  # a chain of 40: prefill-like
  got = pallas.pallas_fixed_attention(q, k, v, jnp.asarray([24], jnp.int32), chain(40), query_tokens=4,
                                      key_block=16, tail_blocks=2, split_slots=32, chain=True, interpret=True)
  np.testing.assert_allclose(np.asarray(got), float64_attention(q, k, v, [24], chain(40)), atol=1e-5, rtol=1e-5)


def test_the_attention_choice_is_the_configs():
  """FixedShapes.attention routes a prefix + tree rule to the kernel (a pallas_call in the program), "xla"
  to XLA's tiles; the CPU's default is XLA, an accelerator's the Triton kernel; bad values are refused."""
  rng = np.random.default_rng(4)
  q, k, v = random_qkv(rng, 1, 3, 64)
  spec = PrefixTree(jnp.asarray([9], jnp.int32), chain(3))
  kernel = str(jax.make_jaxpr(lambda *a: attend(*a, spec, fixed=FIXED))(q, k, v))
  tiles = str(jax.make_jaxpr(lambda *a: attend(*a, spec, fixed=dataclasses.replace(FIXED, attention="xla")))(q, k, v))
  assert "pallas_call" in kernel and "pallas_call" not in tiles
  assert backend.CPU.attention == "xla" and backend.ACCELERATOR.attention == "pallas_triton"
  assert backend.ACCELERATOR.split_slots % backend.ACCELERATOR.key_block == 0
  with pytest.raises(ValueError, match="attention"):
    dataclasses.replace(FIXED, attention="cuda")
  with pytest.raises(ValueError, match="split_slots"):
    dataclasses.replace(FIXED, split_slots=40)


def test_speculative_decoding_through_the_kernel_gives_plain_decodings_tokens():
  """A tiny random bfloat16 model, invariant numerics with the kernel interpreted: greedy chains (gamma 3)
  and a small tree of StreamingLLM self-drafts give plain decoding's tokens, for 3 rows of different
  lengths."""
  model = random_tiny_model(0, max_pos=512)
  cfg = dataclasses.replace(model.config, dtype="bfloat16")
  model = md.Model(cfg, jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.params), name="tiny-bf16")
  fixed = dataclasses.replace(backend.CPU, attention="pallas_interpret", split_slots=64)
  prompts = random_prompts((9, 14, 11), 250, seed=5)
  kw = dict(max_new_tokens=10, numerics="invariant", fixed_shapes=fixed, progress=False)
  ref = md.generate(model, prompts, **kw).tokens
  draft = StreamingDraft(sink=2, window=4)
  assert md.generate(model, prompts, draft=draft, gamma=3, **kw).tokens == ref
  assert md.generate(model, prompts, draft=draft, tree=Tree.from_children_counts([2, 2, 1]), **kw).tokens == ref


def test_the_accelerators_fixed_shapes_give_plain_decodings_tokens():
  """The accelerator's FixedShapes (token-wise tiles of one row count, 64-slot key blocks, 2048-slot splits)
  with the kernel interpreted: greedy chains give plain decoding's tokens, for rows whose prompts fill
  several prefill tiles."""
  model = random_tiny_model(1, max_pos=1024)
  cfg = dataclasses.replace(model.config, dtype="bfloat16")
  model = md.Model(cfg, jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.params), name="tiny-bf16")
  fixed = dataclasses.replace(backend.ACCELERATOR, attention="pallas_interpret", xla_options=())
  prompts = random_prompts((300, 9), 250, seed=6)
  kw = dict(max_new_tokens=8, numerics="invariant", fixed_shapes=fixed, progress=False)
  ref = md.generate(model, prompts, **kw).tokens
  assert md.generate(model, prompts, draft=StreamingDraft(sink=2, window=64), gamma=3, **kw).tokens == ref


@pytest.mark.parametrize("t", [1, 4, 16])
def test_the_kernel_lowers_to_triton_for_a_gpu(t):
  """The kernel as the accelerator profile calls it (Triton), lowered for CUDA on this CPU through
  jax.export at LLaMA-3.1-8B's attention shapes for a plain step, a chain of 4 and a 16-node round: Pallas
  Triton's lowering rules hold (Triton's own compile to GPU code is not checked here)."""
  if not pallas.has_triton():
    pytest.skip("this jax has no Pallas Triton backend")
  fixed = backend.ACCELERATOR
  b, h, kh, d, s = 2, 32, 8, 128, 32768 + 128
  anc = np.tril(np.ones((t, t), bool))
  args = (jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16), jax.ShapeDtypeStruct((b, kh, s, d), jnp.bfloat16),
          jax.ShapeDtypeStruct((b, kh, s, d), jnp.bfloat16), jax.ShapeDtypeStruct((b,), jnp.int32))
  exported = compiling.export_for("cuda", lambda q, k, v, base: pallas.fixed_attention(q, k, v, base, anc, fixed=fixed),
                                  *args)
  assert compiling.TRITON_CALL in exported.mlir_module()
  assert exported.out_avals[0].shape == (b, t, h, d)


@pytest.mark.parametrize("shape", [dict(gamma=3), dict(tree=Tree.from_children_counts([2, 2, 1]))])
def test_the_accelerators_invariant_prefill_and_decode_lower_for_a_gpu(shape):
  """The engine's prefill and decode loop with invariant numerics at the accelerator's FixedShapes (the
  Triton kernel), a self-draft chain or tree, lowered for CUDA on this CPU (Engine.exported): every
  lowering rule on the GPU's path holds, the kernel in the verify pass included."""
  if not pallas.has_triton():
    pytest.skip("this jax has no Pallas Triton backend")
  model = random_tiny_model(2, max_pos=512)
  model = md.Model(dataclasses.replace(model.config, dtype="bfloat16"),
                   jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.params), name="tiny-bf16")
  b, p = 2, 40

  def engine_for(attention):
    fixed = dataclasses.replace(backend.ACCELERATOR, attention=attention, xla_options=())
    st = md.DecodeSettings(max_new_tokens=8, draft=StreamingDraft(sink=2, window=8), numerics="invariant",
                           fixed_shapes=fixed, **shape)
    return engine.Engine(model, plan.make_plan(model, st, batch=b, shortest=p, longest=p))

  gpu, cpu = engine_for("pallas_triton"), engine_for("pallas_interpret")
  tokens, lengths = pad_prompts([[1] * p] * b, b, gpu.plan.prompt_bucket(p))
  slots = gpu.plan.num_slots(gpu.plan.prompt_bucket(p))
  gpu.exported("prefill", tokens, lengths, slots)             # the fixed-shape prefill (XLA's tiles) lowers
  target, ring = cpu.prefill(tokens, lengths, slots)            # a state of the decode's shapes
  state = cpu.initial_state(tokens, lengths, jnp.full((b,), 8, jnp.int32), jax.random.split(jax.random.key(0), b),
                            target, ring)
  assert compiling.TRITON_CALL in gpu.exported("decode", state).mlir_module()
