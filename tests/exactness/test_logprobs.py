"""Log-probabilities (`logprobs=True`, `top_logprobs=k`): each emitted token's log-probability under the
distribution it was drawn from, read from the verify pass, so speculation returns plain decoding's values.

References, all independent of the loop: a float64 numpy log_softmax of the full forward's logits
(`md.logits` over prompt + generated tokens, teacher-forced), for sampling the top-p nucleus cut in float64
with a sort and renormalised; plain decoding's values (speculation must equal them to 1e-5). HF
transformers' float32 forward: test_hf_parity.py. Also: the alternatives are the reference's k most likely
tokens, generate_stream and a shrinking batch return generate's values, bad settings are refused.
"""
from __future__ import annotations

import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax.settings import DecodeSettings
from magicdec_jax.testing import random_tiny_model

from conftest import random_prompts

NEW = 12
LENGTHS = (9, 14, 11)
TOP = 3
REF_TOL = 1e-4        # against the float64 teacher-forced reference
PLAIN_TOL = 1e-5      # speculation against plain decoding
CHAIN = dict(draft=md.StreamingDraft(sink=1, window=4), gamma=3)
TREE = dict(draft=md.StreamingDraft(sink=1, window=4), tree=md.Tree.kary([2, 2]))
SAMPLED = dict(temperature=0.8, top_p=0.9, sampling="invariant", seed=5)


@pytest.fixture(scope="module")
def model():
  return random_tiny_model(0)


@pytest.fixture(scope="module")
def prompts():
  return random_prompts(LENGTHS, 256, seed=2)


@pytest.fixture(scope="module")
def eos(model, prompts):
  """A stop id row 0 emits early (greedy), so rows finish at different rounds: refills and shrinks happen."""
  return md.generate(model, prompts[:1], max_new_tokens=4).tokens[0][3]


def reference(model, prompt, tokens, temperature=0.0, top_p=1.0) -> list[np.ndarray]:
  """Per new token, the float64 log-distribution it was drawn from: log_softmax of the teacher-forced
  full-forward logits, with temperature > 0 scaled and cut to the top-p nucleus (sorted), renormalised."""
  logits = md.logits(model, [prompt + tokens])[0].astype(np.float64)        # [T, V]
  out = []
  for j in range(len(tokens)):
    x = logits[len(prompt) - 1 + j]
    if temperature > 0:
      x = x / temperature
      order = np.argsort(-x, kind="stable")
      p = np.exp(x[order] - x.max())
      p /= p.sum()
      before = np.cumsum(p) - p                                   # mass strictly above each token
      cut = np.full_like(x, -np.inf)
      keep = order[before < top_p]
      cut[keep] = x[keep]
      x = cut
    out.append(x - np.logaddexp.reduce(x[np.isfinite(x)]))
  return out


def check_against_reference(model, prompts, res, top=TOP, **sampling):
  """Every token's log-prob and top alternatives against `reference`; returns the number of tokens."""
  count = 0
  for i, prompt in enumerate(prompts):
    toks, lps = res.tokens[i], res.logprobs[i]
    assert len(lps) == len(toks) > 0
    ref = reference(model, prompt, toks, **sampling)
    for j, t in enumerate(toks):
      assert abs(lps[j] - ref[j][t]) < REF_TOL, (i, j, lps[j], ref[j][t])
      if res.top_logprobs is not None:
        alts = res.top_logprobs[i][j]
        finite = np.flatnonzero(np.isfinite(ref[j]))
        want = finite[np.argsort(-ref[j][finite], kind="stable")][:top]
        assert [a for a, _ in alts] == want.tolist(), (i, j)
        np.testing.assert_allclose([v for _, v in alts], ref[j][want], atol=REF_TOL, rtol=0)
        if t in want:                 # the chosen token's entry is its own log-prob
          assert dict(alts)[t] == lps[j]
      count += 1
  return count


def test_greedy_speculation_matches_plain_and_reference(model, prompts):
  kw = dict(max_new_tokens=NEW, logprobs=True, top_logprobs=TOP)
  plain = md.generate(model, prompts, **kw)
  assert plain.tokens == md.generate(model, prompts, max_new_tokens=NEW).tokens   # logprobs change no token
  assert check_against_reference(model, prompts, plain) == sum(map(len, plain.tokens))
  for name, spec in (("chain", CHAIN), ("tree", TREE)):
    res = md.generate(model, prompts, **kw, **spec)
    assert res.tokens == plain.tokens, name
    assert 0 < res.stats["acceptance_rate"] < 1, (name, res.stats["acceptance_rate"])   # rejections happen
    for got, want in zip(res.logprobs, plain.logprobs):
      np.testing.assert_allclose(got, want, atol=PLAIN_TOL, rtol=0, err_msg=name)
    for got_row, want_row in zip(res.top_logprobs, plain.top_logprobs):
      for got, want in zip(got_row, want_row):
        assert [a for a, _ in got] == [a for a, _ in want], name
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], atol=PLAIN_TOL, rtol=0)
    check_against_reference(model, prompts, res)
    for i, toks in enumerate(res.tokens):    # greedy: the chosen token is the most likely alternative
      assert [alts[0][0] for alts in res.top_logprobs[i]] == toks


def test_sampled_speculation_matches_plain_and_reference(model, prompts):
  kw = dict(max_new_tokens=NEW, logprobs=True, top_logprobs=TOP, **SAMPLED)
  plain = md.generate(model, prompts, **kw)
  assert check_against_reference(model, prompts, plain, temperature=0.8, top_p=0.9) == sum(map(len, plain.tokens))
  res = md.generate(model, prompts, **kw, **CHAIN)
  assert res.tokens == plain.tokens
  for got, want in zip(res.logprobs, plain.logprobs):
    np.testing.assert_allclose(got, want, atol=PLAIN_TOL, rtol=0)
  check_against_reference(model, prompts, res, temperature=0.8, top_p=0.9)
  # a position whose nucleus holds fewer than TOP tokens lists only those (check_against_reference)
  assert all(1 <= len(alts) <= TOP for row in res.top_logprobs for alts in row)
  # rejection sampling (other tokens): a rejected position's token is drawn from the residual, its log-prob
  # is still the one under p
  rej = md.generate(model, prompts, **dict(kw, sampling="rejection"), **CHAIN)
  assert 0 < rej.stats["acceptance_rate"] < 1
  check_against_reference(model, prompts, rej, temperature=0.8, top_p=0.9)


def test_stream_returns_generate_logprobs(model, prompts, eos):
  kw = dict(max_new_tokens=NEW, logprobs=True, eos_token_id=eos, **CHAIN)
  static = md.generate(model, prompts, **kw)
  assert static.top_logprobs is None and len(static.tokens[0]) < NEW and static.finish_reasons[0] == "eos"
  got = {r.index: r for r in md.generate_stream(model, prompts, batch_size=2, refill_at=1, **kw)}
  for i in range(len(prompts)):
    assert got[i].tokens == static.tokens[i]
    assert got[i].top_logprobs is None
    np.testing.assert_allclose(got[i].logprobs, static.logprobs[i], atol=PLAIN_TOL, rtol=0)
  off = next(iter(md.generate_stream(model, prompts[:1], batch_size=1, max_new_tokens=4)))
  assert off.logprobs is None and off.top_logprobs is None


def test_shrinking_batch_keeps_logprobs(model, prompts, eos):
  kw = dict(max_new_tokens=NEW, logprobs=True, top_logprobs=2, eos_token_id=eos)
  fixed = md.generate(model, prompts, **kw)
  shrunk = md.generate(model, prompts, shrink_batch=True, **kw)
  assert len(shrunk.stats["batch_stages"]) > 1
  assert shrunk.tokens == fixed.tokens
  for i in range(len(prompts)):       # the same logits; log_softmax of another batch shape: to rounding
    np.testing.assert_allclose(shrunk.logprobs[i], fixed.logprobs[i], atol=PLAIN_TOL, rtol=0)
    assert [[a for a, _ in alts] for alts in shrunk.top_logprobs[i]] == \
        [[a for a, _ in alts] for alts in fixed.top_logprobs[i]]
  check_against_reference(model, prompts, shrunk, top=2)


def test_prompt_logprobs(model, prompts):
  got = md.prompt_logprobs(model, prompts)
  for prompt, lps in zip(prompts, got):
    ref = reference(model, prompt[:1], prompt[1:])
    assert len(lps) == len(prompt) - 1
    np.testing.assert_allclose(lps, [r[t] for r, t in zip(ref, prompt[1:])], atol=REF_TOL, rtol=0)


@pytest.mark.parametrize("kw, match", [
    (dict(logprobs=True, top_logprobs=-1), "top_logprobs must be an integer in \\[0, 20\\], got -1"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs must be an integer in \\[0, 20\\], got 21"),
    (dict(logprobs=True, top_logprobs=True), "top_logprobs must be an integer"),
    (dict(top_logprobs=3), "top_logprobs=3 needs logprobs=True"),
    (dict(logprobs=1), "logprobs must be True or False, got 1"),
])
def test_bad_settings_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    DecodeSettings(max_new_tokens=4, **kw)


def test_off_is_not_fingerprinted():
  """Settings without log-probabilities fingerprint as before them (datagen resumes older outputs)."""
  assert "logprobs" not in DecodeSettings(max_new_tokens=4).fingerprint()
  fp = DecodeSettings(max_new_tokens=4, logprobs=True, top_logprobs=2).fingerprint()
  assert fp["logprobs"] is True and fp["top_logprobs"] == 2

