"""Per-request sampling as data: a batch mixing greedy and sampled requests, each with its own
temperature / top-k / top-p, compiles one loop, and every request's tokens equal those of the same request
run alone with its settings as the run's (plain decoding and speculation; the reference is the uniform
loop, which compiles the one setting in). A sampled row's first-token distribution in a mixed batch is
checked against float64 numpy of the model's logits (chi-square)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy import stats

import magicdec_jax as md
from magicdec_jax import compile as compiling
from magicdec_jax import testing
from magicdec_jax.model import full_forward
from magicdec_jax.request import Request
from magicdec_jax.stream import generate_stream

PROMPTS = ["Hello there, friend", "To be or not", "abc", "The quick brown fox", "Once upon"]
MIX = [dict(), dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=50),
       dict(temperature=0.0, top_k=3), dict(temperature=1.3, min_p=0.05)]
MAX_NEW = [12, 9, 12, 7, 12]


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)


def _alone(i: int, **kw):
  """Request i run by itself: its sampling as the run's (a uniform loop), its stream id as in the mix."""
  req = Request(PROMPTS[i], stream_ids=[i], max_new_tokens=MAX_NEW[i])
  return next(iter(generate_stream(tiny(), [req], batch_size=1, max_new_tokens=12, seed=3, **MIX[i], **kw)))


@pytest.mark.heavy
@pytest.mark.parametrize("draft", [None, "chain", "tree"])
def test_mixed_batch_equals_each_request_alone(draft):
  kw = {}
  if draft == "chain":
    kw = dict(draft=md.StreamingDraft(sink=2, window=8), gamma=3)
  elif draft == "tree":
    kw = dict(draft=md.StreamingDraft(sink=2, window=8), tree=md.Tree((-1, 0, 0, 1)))
  reqs = [Request(p, max_new_tokens=m, **s) for p, m, s in zip(PROMPTS, MAX_NEW, MIX)]
  gen = generate_stream(tiny(), reqs, batch_size=3, max_new_tokens=12, seed=3, **kw)
  assert gen.plan.sampling.per_row                                   # the list asked for it by itself
  got = {r.index: r for r in gen}
  for i in range(len(PROMPTS)):
    want = _alone(i, **kw)
    assert got[i].tokens == want.tokens, (i, MIX[i])
    assert got[i].finish_reason == want.finish_reason
  assert got[0].tokens == md.generate(tiny(), [PROMPTS[0]], max_new_tokens=12, **kw).tokens[0]   # greedy


def test_one_executable_serves_every_mix():
  """A second, different mix runs on the executables the first compiled (settings are data)."""
  kw = dict(draft=md.StreamingDraft(sink=2, window=8), gamma=2, max_new_tokens=6, batch_size=2)
  st = md.DecodeSettings(max_new_tokens=6, draft=kw["draft"], gamma=2, per_row_sampling=True)
  list(generate_stream(tiny(), [Request(PROMPTS[0]), Request(PROMPTS[1], temperature=0.8)], batch_size=2,
                       settings=st))
  before = compiling.stats()["compiles"]
  list(generate_stream(tiny(), [Request(PROMPTS[2], temperature=1.1, top_k=7), Request(PROMPTS[3], top_p=0.5,
                                                                                       temperature=0.6)],
                       batch_size=2, settings=st))
  assert compiling.stats()["compiles"] == before


def test_a_lazy_stream_refuses_a_request_with_its_own_sampling_unless_planned_per_row():
  reqs = iter([Request(PROMPTS[0]), Request(PROMPTS[1], temperature=0.5)])
  with pytest.raises(ValueError, match="request 1: .*per_row_sampling=True"):
    list(generate_stream(tiny(), reqs, batch_size=2, max_new_tokens=4, max_prompt_tokens=16))
  with pytest.raises(ValueError, match="request 0: temperature must be a finite number"):
    list(generate_stream(tiny(), [Request(PROMPTS[0], temperature="hot")], batch_size=1, max_new_tokens=4))
  with pytest.raises(ValueError, match="top_p must be in"):
    list(generate_stream(tiny(), [Request(PROMPTS[0], top_p=1.5)], batch_size=1, max_new_tokens=4))
  with pytest.raises(ValueError, match="request 0: min_p must be in"):
    list(generate_stream(tiny(), [Request(PROMPTS[0], min_p=2.0)], batch_size=1, max_new_tokens=4))
  with pytest.raises(ValueError, match="min_p must be in"):
    md.DecodeSettings(max_new_tokens=4, min_p=-0.5)


def test_a_sampled_row_among_greedy_rows_draws_from_the_filtered_distribution():
  """First tokens of 240 samples of one T 1.0 top-k 6 request, in batches shared with greedy requests and
  speculating (chain 2), against float64 numpy of the model's last-position logits."""
  model = tiny()
  prompt = PROMPTS[1]
  ids = model.tokenizer.encode(prompt).ids
  logits = np.asarray(full_forward(model.params, model.config, np.asarray([ids]))[0, -1], np.float64)
  keep = np.argsort(-logits)[:6]
  p = np.zeros_like(logits)
  p[keep] = np.exp(logits[keep] - logits[keep].max())
  p /= p.sum()
  n = 240
  reqs = [Request(PROMPTS[0]), Request(prompt, temperature=1.0, top_k=6, num_samples=n, max_new_tokens=2),
          Request(PROMPTS[2])]
  got = [r for r in generate_stream(model, reqs, batch_size=8, max_new_tokens=4, seed=11,
                                    draft=md.StreamingDraft(sink=2, window=8), gamma=2) if r.index == 1]
  assert len(got) == n
  counts = np.bincount([r.tokens[0] for r in got], minlength=len(p))
  assert counts[p == 0].sum() == 0
  stat = float(((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])).sum())
  assert stats.chi2.sf(stat, len(keep) - 1) > 1e-3, (counts[keep], n * p[keep])


def test_generate_takes_one_sampling_dict_per_prompt():
  """generation.generate(row_sampling=[...]): each row equals `generate` of its prompt alone with its settings
  (same stream id), greedy rows equal plain greedy decoding."""
  kw = dict(max_new_tokens=10, seed=4, draft=md.StreamingDraft(sink=2, window=8), gamma=2)
  rows = [{}, {"temperature": 0.9, "top_p": 0.8}, {"temperature": 1.0, "top_k": 20}]
  got = md.generate(tiny(), PROMPTS[:3], row_sampling=rows, **kw)
  for i, r in enumerate(rows):
    want = md.generate(tiny(), [PROMPTS[i]], stream_ids=[i], **r, **kw)
    assert got.tokens[i] == want.tokens[0], (i, r)
  with pytest.raises(ValueError, match="row_sampling has 1 entries for 3 prompts"):
    md.generate(tiny(), PROMPTS[:3], row_sampling=[{}], **kw)
  with pytest.raises(ValueError, match=r"row_sampling\[1\]: top_p must be in"):
    md.generate(tiny(), PROMPTS[:2], row_sampling=[{}, {"top_p": 0.0}], **kw)
  with pytest.raises(ValueError, match=r"row_sampling\[0\] must be a dict of"):
    md.generate(tiny(), PROMPTS[:1], row_sampling=[{"temp": 1.0}], **kw)
