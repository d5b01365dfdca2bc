"""Quantized draft weights (layers/quant.py): the quantizers against float64 numpy, int4 storage, the
quantized matmul against float64 numpy of the dequantized operands, and a StreamingDraft on int8 / int4
copies decoding exactly a plain autoregressive run's tokens (the target verifies with its own weights)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import compile as compiling
from magicdec_jax import sharding
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers import quant
from magicdec_jax.layers.dense import dense
from magicdec_jax.model import init_params
from magicdec_jax.trees import Tree
from magicdec_jax.tuning import costmodel, hlo
from conftest import compiled_decode, random_prompts, tiny_model


def ref_int8(w: np.ndarray):
  """float64 reference: per output channel (column) scale max|w| / 127, q = round(w / scale)."""
  w = w.astype(np.float64)
  amax = np.abs(w).max(axis=0)
  scale = np.where(amax > 0, amax / 127, 1.0)
  return np.clip(np.round(w / scale), -127, 127), scale


def ref_int4(w: np.ndarray, group: int):
  """float64 reference: each group's min .. max on 16 levels, q = round((w - min) / scale) - 8 in -8 .. 7,
  scale = (max - min) / 15, offset = min + 8 scale (w = q scale + offset)."""
  w = w.astype(np.float64)
  k, n = w.shape
  wg = w.reshape(k // group, group, n)
  lo, hi = wg.min(axis=1), wg.max(axis=1)
  scale = np.where(hi > lo, (hi - lo) / 15, 1.0)
  q = np.clip(np.round((wg - lo[:, None]) / scale[:, None]), 0, 15) - 8
  return q.reshape(k, n), scale, lo + 8 * scale


def test_int8_matches_float64_numpy():
  w = np.random.default_rng(0).standard_normal((96, 40)).astype(np.float32)
  w[:, 3] = 0                                                          # an all-zero channel
  q, s, o = quant.quantize_matrix(jnp.asarray(w), "int8")
  rq, rs = ref_int8(w)
  assert o is None
  assert q.dtype == jnp.int8 and q.shape == w.shape and s.shape == (40,)
  np.testing.assert_allclose(np.asarray(s), rs, rtol=1e-6)
  assert np.abs(np.asarray(q, np.float64) - rq).max() <= 1 and (np.asarray(q) == rq).mean() > 0.999
  deq = np.asarray(quant.QuantizedWeight(q, s, kind="int8", shape=w.shape, axis=0, dtype="float32")
                   .dequantize(jnp.float32), np.float64)
  assert np.all(np.abs(deq - w) <= rs / 2 * (1 + 1e-5))               # round to nearest: half a step
  assert np.all(deq[:, 3] == 0)


@pytest.mark.parametrize("group", [64, 16, 0])
def test_int4_matches_float64_numpy(group):
  w = np.random.default_rng(1).standard_normal((128, 24)).astype(np.float32)
  p, s, o = quant.quantize_matrix(jnp.asarray(w), "int4", group=group)
  group = group or 128                                                  # 0: one group per output channel
  rq, rs, ro = ref_int4(w, group)
  assert p.dtype == quant.backend_form().storage_dtype
  assert p.shape == (128, 24) and s.shape == o.shape == (128 // group, 24)
  np.testing.assert_allclose(np.asarray(s), rs, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(o), ro, rtol=1e-5, atol=1e-6)
  q = np.asarray(p, np.float64)
  assert q.min() >= -8 and q.max() <= 7
  assert np.abs(q - rq).max() <= 1 and (q == rq).mean() > 0.999
  deq = np.asarray(quant.QuantizedWeight(p, s, kind="int4", shape=w.shape, axis=0, dtype="float32", offset=o)
                   .dequantize(jnp.float32), np.float64)
  step = np.repeat(rs, group, axis=0)
  assert np.all(np.abs(deq - w) <= step / 2 * (1 + 1e-5) + 1e-6)
  # every group's min and max are levels: reproduced to float32 rounding
  wg, dg = w.reshape(-1, group, 24), deq.reshape(-1, group, 24)
  np.testing.assert_allclose(dg.min(1), wg.min(1), atol=1e-5)
  np.testing.assert_allclose(dg.max(1), wg.max(1), atol=1e-5)


def test_symmetric_int4_matches_float64_numpy():
  """QuantForm(offsets=False) (benchmarks compare the two forms): max |w| / 7 per group, q in -7 .. 7, no
  offset; the matmul of that copy matches float64 numpy of its dequantized matrix."""
  form = quant.backend_form().replace(offsets=False)
  w = np.random.default_rng(4).standard_normal((128, 24)).astype(np.float64)
  p, s, o = quant.quantize_matrix(jnp.asarray(w, jnp.float32), "int4", group=32, form=form)
  wg = w.reshape(4, 32, 24)
  rs = np.abs(wg).max(axis=1) / 7
  rq = np.clip(np.round(wg / rs[:, None]), -7, 7).reshape(128, 24)
  assert o is None and quant.int4_bytes_per_value(group=32, form=form) == 0.5 + 4 / 32
  np.testing.assert_allclose(np.asarray(s), rs, rtol=1e-6)
  assert (np.asarray(p, np.float64) == rq).mean() > 0.999
  qw = quant.quantize_weight("gate", jnp.asarray(w, jnp.float32), "int4", group=0, form=form)
  assert qw.offset is None and qw.per_channel
  x = np.random.default_rng(5).standard_normal((3, 128))
  got = np.asarray(dense("TD,DF->TF", jnp.asarray(x, jnp.float32), qw), np.float64)
  want = x @ np.asarray(qw.dequantize(jnp.float32), np.float64)
  assert np.abs(got - want).max() < 2 ** -8 * np.abs(x).max() * np.abs(w).max() * 128


def test_int4_beats_symmetric_scales_on_skewed_groups():
  """The offset is what asymmetric scales buy: a group whose values all lie in 0.5 .. 1.5 spreads its 16
  levels over that range (a symmetric scale, max |w| / 7, would leave 10 of its 15 levels unused): its
  largest error is half of (max - min) / 15."""
  w = np.random.default_rng(7).uniform(0.5, 1.5, (64, 8)).astype(np.float32)
  qw = quant.quantize_weight("gate", jnp.asarray(w), "int4", group=64)
  err = np.abs(np.asarray(qw.dequantize(jnp.float32), np.float64) - w).max()
  sym_step = np.abs(w).max() / 7
  assert err <= (w.max() - w.min()) / 15 / 2 * (1 + 1e-5) + 1e-6 and err < sym_step / 4


def test_int4_group_shrinks_to_divide_the_contracted_size():
  w = jnp.asarray(np.random.default_rng(2).standard_normal((96, 8)), jnp.float32)   # 96 = 3 x 32
  _, s, o = quant.quantize_matrix(w, "int4", group=64)
  assert s.shape == o.shape == (3, 8)


@pytest.mark.parametrize("backend,groups", [("gpu", 1), ("cpu", 2)])
def test_int4_groups_by_backend(backend, groups, monkeypatch):
  """On a GPU one scale per output channel (a grouped scale does not fuse into the matmul there:
  docs/decisions.md#quantized-weights); elsewhere groups of 64 inputs. The default backend's form is the
  one a copy gets without a form."""
  form = quant.backend_form(backend)
  monkeypatch.setattr(quant.backend, "name", lambda: backend)
  assert quant.backend_form() == form
  w = jnp.asarray(np.random.default_rng(5).standard_normal((128, 8)), jnp.float32)
  qw = quant.quantize_weight("gate", w, "int4", form=form)
  assert qw.scale.shape == qw.offset.shape == (groups, 8) and qw.per_channel == (groups == 1)
  assert quant.int4_bytes_per_value(form=form) == (0.5 if groups == 1 else 0.5 + 8 / 64)   # float32 scale + offset
  # what a decode loop reads: the stored bytes on a GPU; on CPU the bfloat16 matrix XLA converts it into first
  assert quant.weight_bytes_per_param("int4", form=form) == (0.5 if backend == "gpu" else 2.0)


def test_int4_is_stored_as_native_four_bit_integers(monkeypatch):
  """Every int4 value survives the storage; XLA lays the matrix out at 4 bits an element (E(4)), which is
  what a GPU matmul can read with the conversion fused into its operand (the CPU's int8 container set
  aside here: it is checked by every other test)."""
  native = quant.backend_form().replace(storage="int4")
  vals = np.arange(-8, 8, dtype=np.float32)
  w = np.stack([vals, vals[::-1]], axis=1)                                 # [16, 2]: one group each
  q, s, o = quant.quantize_matrix(jnp.asarray(w), "int4", group=0, form=native)
  np.testing.assert_array_equal(np.asarray(q, np.int8), w.astype(np.int8))
  np.testing.assert_allclose(np.asarray(s), [[1.0, 1.0]])
  np.testing.assert_allclose(np.asarray(o), [[0.0, 0.0]])
  hlo = jax.jit(lambda a: a.astype(jnp.float32)).lower(q).compile().as_text()
  assert "s4[16,2]{1,0:E(4)}" in hlo


@pytest.mark.parametrize("kind", quant.QUANT_KINDS + ("int4/channel",))
@pytest.mark.parametrize("mode", quant.INT8_DOTS)
@pytest.mark.parametrize("eq,xshape,name,wshape", [
    ("BTD,DF->BTF", (2, 3, 128), "gate", (128, 48)),
    ("BTD,DF->BTF", (1, 1, 128), "down", (128, 48)),                     # one row: padded to two on CPU
    ("BTD,VD->BTV", (2, 2, 128), "embed", (40, 128))])                     # a tied LM head [V, D]
def test_quantized_dense_matches_float64(kind, mode, eq, xshape, name, wshape):
  """The quantized matmul equals float64 numpy of x and the dequantized matrix, up to the rounding of the
  operands it multiplies: bfloat16 x ("dequant", int4) or per-token int8 x ("int")."""
  form = quant.backend_form().replace(int8_dot=mode)
  rng = np.random.default_rng(3)
  x = rng.standard_normal(xshape).astype(np.float32)
  w = rng.standard_normal(wshape).astype(np.float32)
  kind, _, per = kind.partition("/")
  qw = quant.quantize_weight(name, jnp.asarray(w), kind, group=0 if per else None, form=form)
  assert qw.dot == mode and qw.per_channel == (kind == "int8" or bool(per))
  deq = np.asarray(qw.dequantize(jnp.float32), np.float64)
  got = np.asarray(jax.jit(lambda a: dense(eq, a, qw))(jnp.asarray(x)))
  want = np.einsum(eq.lower(), x.astype(np.float64), deq)
  assert got.shape == want.shape
  scale = np.abs(x).max() * np.abs(deq).max() * x.shape[-1]
  tol = (1 / 127 if kind == "int8" and mode == "int" else 2 ** -8) * scale
  assert np.abs(got - want).max() < tol, (np.abs(got - want).max(), tol)


def test_embedding_rows_dequantize_like_the_matrix():
  w = jnp.asarray(np.random.default_rng(4).standard_normal((40, 64)), jnp.float32)
  for kind in quant.QUANT_KINDS:
    qw = quant.quantize_weight("embed", w, kind)
    ids = jnp.asarray([[3, 0, 39]])
    np.testing.assert_array_equal(np.asarray(qw.rows(ids, jnp.float32)),
                                  np.asarray(qw.dequantize(jnp.float32))[np.asarray(ids)])


def test_quantize_params_covers_every_matrix_and_refuses_unknown_ones():
  model = tiny_model(0)
  qp = quant.quantize_params(model.params, "int8")
  isq = lambda x: isinstance(x, quant.QuantizedWeight)
  leaves = jax.tree.leaves(qp, is_leaf=isq)
  assert sum(map(isq, leaves)) == sum(x.ndim >= 2 for x in jax.tree.leaves(model.params))
  assert all(isq(x) or x.ndim < 2 for x in leaves)
  with pytest.raises(ValueError, match="'mystery'"):
    quant.quantize_params({"mystery": jnp.zeros((4, 4))}, "int8")


@pytest.mark.parametrize("weights", quant.QUANT_KINDS)
@pytest.mark.parametrize("kw", [{"gamma": 3}, {"tree": Tree((-1, 0, 0, 1, 2))}])
def test_quantized_self_draft_decodes_the_autoregressive_tokens(weights, kw):
  model = tiny_model(3, attn_scale=8.0, hidden=64)
  prompts = random_prompts([40, 23, 57], model.config.vocab_size, seed=7)
  want = md.generate(model, prompts, max_new_tokens=16).tokens
  res = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8, weights=weights), **kw)
  assert res.tokens == want
  full = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8), **kw)
  assert res.stats["acceptance_rate"] >= 0.5 * full.stats["acceptance_rate"] > 0     # drafts about as well


@pytest.mark.parametrize("mode", quant.INT8_DOTS)
def test_int8_self_draft_at_batch_one_either_matmul(mode, monkeypatch):
  """Either int8 matmul through the engine: the backend's form swapped for this test (the copy carries its
  dot, so a fresh copy and fresh executables)."""
  monkeypatch.setitem(quant.FORMS, jax.default_backend(), quant.backend_form().replace(int8_dot=mode))
  monkeypatch.setattr(draft_weights, "_NARROW", {})
  compiling.clear()
  try:
    model = tiny_model(3, attn_scale=8.0, hidden=64)
    prompts = random_prompts([45], model.config.vocab_size, seed=8)
    want = md.generate(model, prompts, max_new_tokens=16).tokens
    res = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8, weights="int8"), gamma=3)
  finally:
    compiling.clear()
  full = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8), gamma=3)
  assert res.tokens == want
  assert res.stats["acceptance_rate"] >= 0.5 * full.stats["acceptance_rate"] > 0


def test_quantized_copies_are_priced_at_their_bytes():
  cfg = tiny_model(0).config
  full = costmodel.step_bytes(cfg, 1, 16, 1, "float32")
  b16 = costmodel.step_bytes(cfg, 1, 16, 1, "float32", weights_dtype="bfloat16")
  i8 = costmodel.step_bytes(cfg, 1, 16, 1, "float32", weights_dtype="int8")
  i4 = costmodel.step_bytes(cfg, 1, 16, 1, "float32", weights_dtype="int4")
  mat = costmodel.matmul_params(cfg) + (0 if cfg.tie_embeddings else cfg.hidden_size)   # + the gathered row
  assert full - b16 == pytest.approx(2 * mat) and b16 - i8 == pytest.approx(mat)
  share = int8_share_by_hand(cfg)
  # on CPU the loop reads an int4 copy's int4 matrices as the bfloat16 ones XLA hoists them into (2 bytes),
  # its int8-kept ones at a byte: one byte more than int8 on the int4 share
  assert jax.default_backend() == "cpu"
  assert i4 - i8 == pytest.approx(mat * (1 - share)) and b16 - i4 == pytest.approx(mat * share)


def int8_share_by_hand(cfg) -> float:
  """The share of the matmul weights an int4 copy keeps in int8 (QuantForm.keep_int8: the LM head, the
  down projections and k / v), counted from the config."""
  d, f, n, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
  q_o, k_v = 2 * n * d * cfg.num_heads * cfg.head_dim, 2 * n * d * cfg.num_kv_heads * cfg.head_dim
  return (n * f * d + v * d + k_v) / (q_o + k_v + 3 * n * d * f + v * d)


def test_an_int4_copy_keeps_the_head_down_and_kv_projections_in_int8():
  params = tiny_model(0).params
  kinds = lambda qp: {p[-1].key: x.kind for p, x in jax.tree_util.tree_flatten_with_path(
      qp, is_leaf=lambda x: isinstance(x, quant.QuantizedWeight))[0] if isinstance(x, quant.QuantizedWeight)}
  got = kinds(quant.quantize_params(params, "int4"))
  assert set(got.pop(k) for k in ("embed", "lm_head", "down", "k", "v") if k in got) == {"int8"}, got
  assert "k" not in got and "down" not in got
  assert set(got.values()) == {"int4"}, got
  all4 = quant.backend_form().replace(keep_int8=())
  assert set(kinds(quant.quantize_params(params, "int4", all4)).values()) == {"int4"}


def test_a_quantized_draft_asks_for_its_xla_options_only_on_a_gpu():
  assert md.StreamingDraft(2, 8).xla_options() == {}
  want = dict(quant.backend_form().xla_options)
  assert md.StreamingDraft(2, 8, weights="int8").xla_options() == want
  assert quant.xla_options("int8", quant.backend_form("gpu")) == {"xla_gpu_enable_triton_gemm": True}


def test_quantized_weights_are_split_as_their_parameters():
  """On a data:1 x model:1 mesh nothing is split; the specs for a model axis follow the parameter's: column-
  parallel q splits N, row-parallel o splits K, int4 scales follow both, a vocab-split embedding its rows."""
  from jax.sharding import PartitionSpec as P
  from magicdec_jax.sharding import rules
  w = lambda name, shape, kind: quant.quantize_weight(name, jnp.ones(shape, jnp.float32), kind, group=8)
  q8, o4, e8 = w("q", (16, 4, 8), "int8"), w("o", (4, 8, 16), "int4"), w("embed", (40, 16), "int8")
  assert (q8.leading_contracted, o4.leading_contracted) == (1, 2)
  assert rules.quantized_specs(P(None, "model", None), q8) == (P(None, "model"), P("model"))
  assert rules.quantized_specs(P("model", None, None), o4) == (P("model", None), P("model", None))
  assert rules.quantized_specs(P("model", None), e8) == (P("model", None), P("model"))
  model = tiny_model(0)
  qp = quant.quantize_params(model.params, "int4")
  mesh = sharding.make_mesh("data:1,model:1", jax.devices()[:1])
  placed = jax.device_put(qp, rules.param_shardings(qp, model.config, mesh))
  isq = lambda x: isinstance(x, quant.QuantizedWeight)
  assert jax.tree.structure(placed, is_leaf=isq) == jax.tree.structure(qp, is_leaf=isq)


@pytest.mark.parametrize("weights", quant.QUANT_KINDS)
def test_snapkv_and_model_drafts_on_quantized_copies_decode_the_autoregressive_tokens(weights):
  """SnapKVDraft (the target's weights) and ModelDraft (a small model's) with int8 / int4 copies: plain
  decoding's tokens, drafting about as well as on their own weights."""
  model = tiny_model(3, attn_scale=8.0, hidden=64)
  small = model                     # a draft model may be the target itself (--draft=model's default)
  prompts = random_prompts([40, 33, 57], model.config.vocab_size, seed=9)
  want = md.generate(model, prompts, max_new_tokens=16).tokens
  for make in (lambda w: md.SnapKVDraft(budget=8, window=8, observation_window=4, pool_kernel=3, weights=w),
               lambda w: md.ModelDraft(small, 2, 8, weights=w)):
    res = md.generate(model, prompts, max_new_tokens=16, draft=make(weights), gamma=2)
    assert res.tokens == want
    own = md.generate(model, prompts, max_new_tokens=16, draft=make(None), gamma=2)
    assert res.stats["acceptance_rate"] >= 0.5 * own.stats["acceptance_rate"] > 0
  assert md.ModelDraft(small, 2, 8, weights=weights).spec.cost().weights_dtype == weights


def test_bad_draft_weights_are_refused_by_name():
  with pytest.raises(ValueError, match="SnapKVDraft weights .* 'int2'"):
    md.SnapKVDraft(weights="int2")
  with pytest.raises(ValueError, match="ModelDraft weights .* 'int2'"):
    md.ModelDraft(tiny_model(5), weights="int2")
  with pytest.raises(ValueError, match="not narrower"):
    md.ModelDraft(md.model.Model(tiny_model(5).config.replace(dtype="bfloat16"), tiny_model(5).params),
                  weights="bfloat16")


def test_the_planner_counts_a_drafts_weight_copy():
  """A self-draft's copy adds its bytes (the target's params at the copy's bytes per element: float32 -> a
  half for bfloat16, a quarter for int8, on CPU an int4 copy's storage and the bfloat16 matrices it is
  converted into); a model draft's copy comes on top of its own weights."""
  model = tiny_model(0)
  cfg = model.config
  plan = lambda draft: sharding.plan_memory(cfg, None, batch=2, max_context=64, draft=draft, tree_nodes=3)
  own = sharding.planner.param_bytes(cfg)
  assert plan(md.StreamingDraft(2, 8)).draft_params == 0
  assert plan(md.StreamingDraft(2, 8, weights="bfloat16")).draft_params == own // 2
  assert plan(md.StreamingDraft(2, 8, weights="int8")).draft_params == own // 4
  share = int8_share_by_hand(cfg)
  # an int4 value in an int8 byte, a float32 scale and offset per 64 values, and the bfloat16 matrix XLA:CPU
  # converts it into before the decode loop (test_xla_cpu_hoists_an_int4_copys_conversion_out_of_the_decode_loop)
  assert jax.default_backend() == "cpu"
  int4 = (1 - share) * (1 + 8 / 64 + 2) + share
  assert plan(md.SnapKVDraft(8, 8, weights="int4")).draft_params == pytest.approx(own * int4 / 4, abs=1)
  assert plan(md.ModelDraft(model, 2, 8, weights="int8")).draft_params == own + own // 4


def test_xla_cpu_hoists_an_int4_copys_conversion_out_of_the_decode_loop():
  """What the planner's CPU count rests on (QuantForm.hoisted): in loop.decode's compiled HLO with an int4
  self-draft copy of a float32 model, a while loop carries bfloat16 matrices shaped like the copy's int4
  matrices (q / o [D, H*hd], gate / up [D, F]: converted once, before the loop), while the matrices kept in
  int8 (down [F, D]) are carried as int8. If XLA stops hoisting, this fails and the planner's rule goes."""
  cfg = ModelConfig(vocab_size=160, hidden_size=192, intermediate_size=320, num_layers=1, num_heads=4,
                       num_kv_heads=2, head_dim=32, max_position_embeddings=512, dtype="float32")
  params = init_params(cfg, jax.random.key(0))
  draft, tree = md.StreamingDraft(2, 8, weights="int4"), Tree.chain(2)
  text, _, _ = compiled_decode(params, draft_weights.copy_of(params, "int4"), cfg, draft.spec, tree, 2, 32, 8)
  carried = hlo.while_carried(text)
  assert ("bf16", (192, 128)) in carried and ("bf16", (192, 320)) in carried, carried   # q / o, gate / up
  assert ("s8", (320, 192)) in carried and ("bf16", (320, 192)) not in carried, carried  # down: int8, as stored
  assert quant.backend_form("cpu").hoisted == "bfloat16"
