"""A batch that shrinks as rows finish (magicdec_jax/shrink.py) decodes the tokens of a fixed batch.

Greedy references are plain autoregressive `generate` (itself checked against a full-forward argmax loop in
test_generate.py); prompts finish at different rounds (ragged lengths, a stop token some rows emit mid-run,
5 prompts in an 8-row bucket), and each case asserts that the batch really shrank. With sampling there is
no token-level independent reference for a speculative run; there a shrinking run must give the fixed
batch's samples (a row's PRNG stream depends only on its own rounds), and its AR counterpart the
autoregressive fixed batch's.
"""
from __future__ import annotations


import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import prefilled, shrink, slots
from magicdec_jax.trees import Tree

from conftest import random_prompts, tiny_model
from speculative_cases import DRAFTS, NEW, prompts_and_eos, target


def _stage_batches(res):
  return [b for b, *_ in res.stats["batch_stages"]]


@pytest.mark.parametrize("draft,kw", [(None, {}), ("streaming-s0-w4", {"gamma": 2}),
                                      ("model-trunc-s2-w5", {"gamma": 3}),
                                      ("streaming-s2-w64", {"tree": Tree((-1, 0, 0, 1))})],
                         ids=["ar", "streaming-chain", "model-chain", "streaming-tree"])
def test_shrinking_batch_gives_the_autoregressive_tokens(draft, kw):
  prompts, eos = prompts_and_eos()                      # 5 ragged prompts: an 8-row bucket
  ref = md.generate(target(), prompts, max_new_tokens=NEW, eos_token_id=eos)
  res = md.generate(target(), prompts, max_new_tokens=NEW, eos_token_id=eos, shrink_batch=True,
                    draft=None if draft is None else DRAFTS[draft](), **kw)
  assert res.tokens == ref.tokens and res.finish_reasons == ref.finish_reasons
  batches = _stage_batches(res)
  assert batches[0] == 8 and len(batches) > 1 and batches == sorted(batches, reverse=True)
  assert res.stats["loop_rounds"] == sum(r for _, r, _ in res.stats["batch_stages"])
  assert len(res.stats["shrink_gather_s"]) == len(batches) - 1
  assert res.stats["loop_rounds"] >= max(r["verify_steps"] for r in res.row_stats)
  # without shrinking: one stage of the whole batch, its rounds and its seconds (the decode's)
  assert ref.stats["batch_stages"] == [[8, ref.stats["loop_rounds"], ref.stats["decode_s"]]]
  assert all(isinstance(t, float) and t >= 0 for _, _, t in res.stats["batch_stages"])


def test_the_progress_bar_of_a_shrinking_batch_only_rises(monkeypatch):
  """Segments of 2 rounds over shrinking stages: the bar rises to the tokens plain decoding makes (it fell
  back to the shrunk batch's own count)."""
  import tqdm
  from magicdec_jax import engine
  seen = []

  class Bar(tqdm.tqdm):
    def update(self, n=1):
      super().update(n)
      seen.append(self.n)
  prompts, eos = prompts_and_eos()
  ref = md.generate(target(), prompts, max_new_tokens=NEW, eos_token_id=eos)
  monkeypatch.setattr(engine, "SEGMENT_ROUNDS", 2)
  monkeypatch.setattr(tqdm, "tqdm", Bar)
  res = md.generate(target(), prompts, max_new_tokens=NEW, eos_token_id=eos, shrink_batch=True, progress=True)
  assert res.tokens == ref.tokens and len(_stage_batches(res)) > 1
  assert seen == sorted(seen) and seen[-1] == sum(map(len, ref.tokens))


@pytest.mark.heavy
def test_shrinking_batch_keeps_every_rows_samples():
  prompts, eos = prompts_and_eos()
  kw = dict(max_new_tokens=NEW, eos_token_id=eos, temperature=0.9, top_k=20, seed=1)   # rows end apart
  for draft in (None, DRAFTS["streaming-s0-w4"]()):
    gamma = None if draft is None else 2
    fixed = md.generate(target(), prompts, draft=draft, gamma=gamma, **kw)
    shrunk = md.generate(target(), prompts, draft=draft, gamma=gamma, shrink_batch=True, **kw)
    assert shrunk.tokens == fixed.tokens and len(_stage_batches(shrunk)) > 1
    assert [r["verify_steps"] for r in shrunk.row_stats] == [r["verify_steps"] for r in fixed.row_stats]


def test_prefilled_decode_shrinks_to_min_batch_one():
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([70, 41, 96, 33], model.config.vocab_size, seed=5)
  want = md.generate(model, prompts, max_new_tokens=12).tokens
  pre = prefilled.prefill(model, prompts, max_new_tokens=12, chunk=32, progress=False)
  res = prefilled.decode(model, pre, draft=md.StreamingDraft(2, 8), gamma=3, shrink_batch=True)
  assert res.tokens == want
  assert _stage_batches(res)[0] == 4


def test_take_rows_gathers_every_row_leaf_and_keeps_the_rest():
  model = tiny_model(0)
  state = slots.empty_state(jnp.asarray([5, -1], jnp.int32), cfg=model.config, spec=md.StreamingDraft(1, 4),
                            tree=Tree.chain(2), batch=4, num_slots=128, out_len=8)
  state = state.replace(n_out=jnp.arange(4, dtype=jnp.int32) * 10,
                        target=state.target.replace(k=tuple(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)
                                                            for x in state.target.k)))
  rows = jnp.asarray([2, 0], jnp.int32)
  got = shrink.take_rows(state, rows)
  assert got.n_out.tolist() == [20, 0]
  np.testing.assert_array_equal(np.asarray(got.target.k[0]), np.asarray(state.target.k[0])[[2, 0]])
  assert got.ring.pos.shape[0] == 2 and got.keys.shape == (2,)
  assert got.eos.tolist() == [5, -1] and int(got.refill_at) == int(state.refill_at)


def test_bad_shrink_settings_are_refused_before_compiling():
  model = tiny_model(0)
  with pytest.raises(ValueError, match="shrink_batch must be True or False"):
    md.generate(model, [[1, 2, 3]], max_new_tokens=4, shrink_batch="yes")
  with pytest.raises(ValueError, match="mesh must be"):
    md.generate(model, [[1, 2, 3]], max_new_tokens=4, shrink_batch=True, mesh=object())
  pre = prefilled.prefill(model, [[1, 2, 3]], max_new_tokens=4, chunk=16, progress=False)
  with pytest.raises(ValueError, match="shrink_batch must be True or False"):
    prefilled.decode(model, pre, shrink_batch=1)
  with pytest.raises(ValueError, match="min_batch"):
    shrink.decode(None, None, None, None, min_batch=0)
