"""StreamingDraft(weights="bfloat16"): the self-draft runs on a bfloat16 copy of the target's weight
matrices. Output must stay exactly the target's (greedy: a plain autoregressive run's tokens), the copy
must really draft differently (not silently the float32 weights), and the narrow matmul must compute what
float64 numpy computes from the bfloat16-rounded operands."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers.dense import dense, narrow_weights
from magicdec_jax.trees import Tree
from conftest import random_prompts, tiny_model


def test_narrow_dense_matches_float64_of_the_rounded_operands():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 3, 16)).astype(np.float32)
  w = rng.standard_normal((16, 24)).astype(np.float32)
  xb, wb = (np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64) for a in (x, w))
  got = dense("BTD,DF->BTF", jnp.asarray(x), jnp.asarray(w, jnp.bfloat16))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), np.einsum("btd,df->btf", xb, wb), rtol=1e-5, atol=1e-5)
  full = dense("BTD,DF->BTF", jnp.asarray(x), jnp.asarray(w))           # float32 stays float32-exact
  np.testing.assert_allclose(np.asarray(full), np.einsum("btd,df->btf", x.astype(np.float64), w), rtol=1e-6,
                             atol=1e-5)


@pytest.mark.parametrize("eq,xshape,wshape", [("BTD,DF->BTF", (1, 1, 16), (16, 24)),
                                              ("BTD,VD->BTV", (1, 1, 16), (40, 16)),        # a tied LM head
                                              ("BTNH,NHD->BTD", (1, 1, 2, 8), (2, 8, 16))])  # attention out
def test_a_single_row_narrow_dense_matches_float64(eq, xshape, wshape):
  """One row (batch 1, one token) is padded to two on CPU (XLA's one-row bfloat16 path is slow): the
  result is still the one row's product, shaped as the einsum says."""
  rng = np.random.default_rng(1)
  x = rng.standard_normal(xshape).astype(np.float32)
  w = rng.standard_normal(wshape).astype(np.float32)
  xb, wb = (np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64) for a in (x, w))
  got = jax.jit(lambda a, b: dense(eq, a, b))(jnp.asarray(x), jnp.asarray(w, jnp.bfloat16))
  want = np.einsum(eq.lower(), xb, wb)
  assert got.shape == want.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [{"gamma": 3}, {"tree": Tree((-1, 0, 0, 1, 2))}])
def test_bf16_self_draft_decodes_the_autoregressive_tokens(kw):
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([40, 23, 57], model.config.vocab_size, seed=7)
  want = md.generate(model, prompts, max_new_tokens=16).tokens
  res = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8, weights="bfloat16"), **kw)
  assert res.tokens == want
  full = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8), **kw)
  assert res.stats["acceptance_rate"] >= 0.5 * full.stats["acceptance_rate"] > 0     # drafts about as well


def test_bf16_self_draft_at_batch_one():
  """Batch 1 (the draft's one-row steps take dense's padded path on CPU): AR's tokens, drafting well."""
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([45], model.config.vocab_size, seed=8)
  want = md.generate(model, prompts, max_new_tokens=16).tokens
  res = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8, weights="bfloat16"), gamma=3)
  assert res.tokens == want
  full = md.generate(model, prompts, max_new_tokens=16, draft=md.StreamingDraft(2, 8), gamma=3)
  assert res.stats["acceptance_rate"] >= 0.5 * full.stats["acceptance_rate"] > 0


def test_the_draft_really_reads_the_narrow_copy():
  """Drafting with a copy whose weights are zeroed (cast the same way) accepts nothing: the loop drafts
  with the draft params it is given, not the target's."""
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([40, 23], model.config.vocab_size, seed=8)
  draft = md.StreamingDraft(2, 8, weights="bfloat16")
  params = draft.params(model)
  leaves = jax.tree.leaves(params)
  assert any(x.dtype == jnp.bfloat16 for x in leaves) and any(x.dtype == jnp.float32 for x in leaves)
  assert draft.params(model) is params          # cast once per model
  zeroed = narrow_weights(
      jax.tree.map(jnp.zeros_like, model.params), "bfloat16")
  draft_weights.drop_copies()
  assert draft_weights.cached_copy((model.params,), "bfloat16", lambda: zeroed) is zeroed
  try:
    res = md.generate(model, prompts, max_new_tokens=12, draft=draft, gamma=2)
  finally:
    draft_weights.drop_copies()
  assert res.tokens == md.generate(model, prompts, max_new_tokens=12).tokens
  good = md.generate(model, prompts, max_new_tokens=12, draft=draft, gamma=2)
  assert res.stats["acceptance_rate"] < good.stats["acceptance_rate"]


def test_bad_weights_are_refused():
  with pytest.raises(ValueError, match="float8"):
    md.StreamingDraft(4, 64, weights="float8")


def test_a_draft_no_narrower_than_the_target_is_refused():
  model = tiny_model(3)
  bf16 = md.model.Model(model.config.replace(dtype="bfloat16"), narrow_weights(model.params, "bfloat16"))
  with pytest.raises(ValueError, match="not narrower"):
    md.generate(bf16, [[1, 2, 3]], max_new_tokens=2, draft=md.StreamingDraft(2, 8, weights="bfloat16"))
