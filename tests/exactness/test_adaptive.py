"""Adaptive speculation (schedule.py) is lossless under any schedule, and its thresholds are data.

Reference: plain decoding, `generate(..., draft=None)` (itself checked against a full-forward argmax loop
in test_generate.py). Schedules are forced ([(from_context, gamma), ...], gamma 0 = plain) so the rounds
switch between plain decoding and chains at chosen contexts inside the generated span, with ragged rows
(the context is the batch's mean) and a stop token some rows emit mid-run. The rejection-sampling
distribution with a switch inside the sampled span is in test_speculative_sampling.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from magicdec_jax import plan, schedule
from magicdec_jax.drafts import PromptLookupDraft, StreamingDraft
from magicdec_jax.generation import generate
from magicdec_jax.stream import generate_stream
from magicdec_jax.trees import Tree

from conftest import random_prompts, tiny_model

NEW = 48
LENGTHS = (9, 16, 12, 14, 10)
EOS = 7
# switches at contexts inside the run (prompts 9..16, +48 new): chain 2, plain, chain 3, chain 1, plain, chain 2
SCHEDULE = [(0, 2), (20, 0), (30, 3), (40, 1), (50, 0), (56, 2)]


def target():
  return tiny_model(0, attn_scale=10.0)


def _prompts(model):
  ps = random_prompts(LENGTHS, model.config.vocab_size, seed=0)
  ps[1] = (ps[1][:5] * 4)[:16]         # a repetitive prompt: prompt lookup finds matches
  return ps


DRAFTS = {"streaming": lambda: StreamingDraft(sink=2, window=4), "lookup": lambda: PromptLookupDraft(2)}


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_equals_plain_across_switches(draft):
  model = target()
  prompts = _prompts(model)
  ref = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS)
  got = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS, draft=DRAFTS[draft](), gamma="auto",
                 schedule=SCHEDULE)
  assert got.tokens == ref.tokens
  sch = got.stats["schedule"]
  assert all(sch["rounds"][s] > 0 for s in ("plain", "gamma=1", "gamma=2", "gamma=3")), sch
  assert len(sch["switches"]) >= 5
  assert sch["switches"][0]["setting"] == "gamma=2"
  first = sch["first_context"]
  assert 20 <= first["plain"] < 30 and 30 <= first["gamma=3"] < 40 and 40 <= first["gamma=1"] < 50, first


def test_stream_refills_equal_plain_across_switches():
  """Continuous batching: 5 prompts through 2 slots, refilled as rows finish; rows at different lengths
  share the batch-wide setting."""
  model = target()
  prompts = _prompts(model)
  ref = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS)
  gen = generate_stream(model, prompts, batch_size=2, refill_at=1, max_new_tokens=NEW, eos_token_id=EOS,
                        draft=StreamingDraft(sink=2, window=4), gamma="auto", schedule=SCHEDULE)
  results = list(gen)
  got = {r.index: r.tokens for r in results}
  assert [got[i] for i in range(len(prompts))] == ref.tokens
  assert sum(v > 0 for v in gen.stats["schedule"]["rounds"].values()) >= 3
  # a row's drafted tokens count its chain rounds' depths only (plain rounds draft none; datagen sums them)
  assert all(r.stats["drafted_tokens"] <= 3 * r.stats["verify_steps"] for r in results)
  assert any(r.stats["drafted_tokens"] < 2 * r.stats["verify_steps"] for r in results)
  fixed = list(generate_stream(model, prompts, batch_size=2, refill_at=1, max_new_tokens=NEW, eos_token_id=EOS,
                               draft=StreamingDraft(sink=2, window=4), gamma=2))
  assert all(r.stats["drafted_tokens"] == 2 * r.stats["verify_steps"] for r in fixed)


def test_invariant_sampling_equals_plain_under_a_schedule():
  model = target()
  prompts = _prompts(model)
  kw = dict(max_new_tokens=NEW, eos_token_id=EOS, temperature=0.8, top_p=0.95, seed=3, sampling="invariant")
  ref = generate(model, prompts, **kw)
  got = generate(model, prompts, draft=StreamingDraft(sink=2, window=4), gamma="auto", schedule=SCHEDULE, **kw)
  assert got.tokens == ref.tokens
  assert got.stats["schedule"]["rounds"]["plain"] > 0


def test_thresholds_are_data_and_long_outputs_reach_the_context_limit():
  """Another schedule over the same settings reuses the executable; max_new_tokens up to the model's
  context (512 positions) with the progress bar's segments gives plain decoding's tokens."""
  model = target()
  prompts = _prompts(model)[:2]
  new = model.config.max_position_embeddings - max(len(p) for p in prompts)
  ref = generate(model, prompts, max_new_tokens=new, eos_token_id=[])
  kw = dict(max_new_tokens=new, eos_token_id=[], draft=StreamingDraft(sink=2, window=4), gamma="auto")
  a = generate(model, prompts, schedule=[(0, 0), (100, 1), (300, 3)], progress=True, **kw)
  b = generate(model, prompts, schedule=[(0, 3), (200, 0), (400, 1)], progress=True, **kw)
  assert a.tokens == ref.tokens and b.tokens == ref.tokens
  assert all(len(t) == new for t in a.tokens)
  assert b.stats["decode_compile_s"] < 0.2 * max(a.stats["decode_compile_s"], 1e-9) or \
      b.stats["decode_compile_s"] < 0.05, (a.stats["decode_compile_s"], b.stats["decode_compile_s"])
  # (then back and forth near the end: a finished row leaves the mean, the context, of the active rows)
  assert [s["setting"] for s in b.stats["schedule"]["switches"]][:3] == ["gamma=3", "plain", "gamma=1"]
  assert b.stats["schedule"]["switches"][1]["context"] >= 200


def test_thresholds_follow_the_cost_models_choice():
  """from_cost_model turns a per-context choice into thresholds at exactly the contexts where it changes
  (a chain outside the set maps to the nearest chain)."""
  variants = schedule.variants_for((1, 2, 3), plain=True)

  def want(c):
    return 0 if c < 300 else 2 if c < 1000 else 3

  def choose(c):
    return (Tree((-1,)), Tree.chain(2), Tree.chain(5))[[0, 2, 3].index(want(c))], {"speedup": 1.0}

  (at, var), _ = schedule.from_cost_model(choose, variants, 64, 4096)
  s = schedule.with_thresholds(schedule.empty(len(variants)), at, var)
  for c in (0, 64, 298, 299, 300, 301, 777, 999, 1000, 1001, 4096, 10**6):
    assert int(schedule.pick(s, np.int32(c))) == want(c), c


def test_bad_schedules_are_refused():
  model = target()
  for bad in ([(10, 1), (5, 2)], [(0, -1)], "x", []):
    with pytest.raises(ValueError):
      generate(model, [[1, 2, 3]], max_new_tokens=4, draft=StreamingDraft(sink=1, window=2), schedule=bad)
  with pytest.raises(ValueError, match="draft"):
    generate(model, [[1, 2, 3]], max_new_tokens=4, schedule=[(0, 1)])


@pytest.mark.parametrize("mode", ["gamma", "tree"])
def test_cost_model_schedule_switches_inside_the_call(monkeypatch, mode):
  """gamma / tree = "auto" with live-range pricing (as on GPU) and a cost model that prefers plain decoding
  below context 30 and speculation above: thresholds from the engine's own pricing path, the switch inside
  the call, plain decoding's tokens."""
  small_tree = Tree.from_children_counts([2, 1, 1])

  def choose(cfg, spec, batch, context, *, want_tree, allow_autoregressive, **kw):
    if allow_autoregressive and context < 30:
      return Tree((-1,)), {"speedup": 0.9, "hardware": "fake"}
    return (small_tree if want_tree else Tree.chain(1 if context < 45 else 3)), {"speedup": 1.5, "hardware": "fake"}

  monkeypatch.setattr(plan.autotune, "choose", choose)
  monkeypatch.setattr(plan, "attention_reads_live_range", lambda impl: True)
  model = target()
  prompts = _prompts(model)
  ref = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS)
  got = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS, draft=StreamingDraft(sink=2, window=4),
                 **({"gamma": "auto"} if mode == "gamma" else {"tree": "auto"}))
  assert got.tokens == ref.tokens
  sch = got.stats["schedule"]
  assert sch["switches"][0]["setting"] == "plain" and sch["switches"][1]["context"] >= 30, sch
  want = {"plain", "gamma=1", "gamma=3"} if mode == "gamma" else {"plain", f"tree{small_tree.num_nodes}"}
  assert {k for k, v in sch["rounds"].items() if v} == want, sch


def _price_by_alpha(monkeypatch):
  """A cost model whose choice is gamma 1 below an acceptance of 0.6 and gamma 3 above, and which always
  separates the settings (a band of one)."""
  def choose(cfg, spec, batch, context, *, want_tree, allow_autoregressive, alpha=None, acceptance_vector=None,
             **kw):
    a = acceptance_vector[0] if alpha is None else alpha
    return Tree.chain(1 if a < 0.6 else 3), {"speedup": 1.5, "hardware": "fake", "alpha": a}

  monkeypatch.setattr(plan.autotune, "choose", choose)
  monkeypatch.setattr(plan.autotune, "chain_band", lambda cfg, spec, b, c, *, alpha, **kw:
                      [1 if alpha < 0.6 else 3])


def test_chain_evidence_counts_the_maximum_likelihood_trials():
  """ChainEvidence, fed the loop's per-depth counters between calls, counts what a round-by-round count
  gives: a chain round of gamma that accepted a leading draft tokens tried a + (a < gamma) positions and
  accepted a (the truncated-geometric likelihood of i.i.d. positions). Simulated rounds of known alpha, mixed
  gammas, plain calls (no evidence) and a row replaced between readings (skipped)."""
  rng = np.random.default_rng(0)
  alpha, b, d = 0.83, 6, 3
  ev = schedule.ChainEvidence(0.5, prior_trials=0)
  rounds, acc_at = np.zeros(b, np.int64), np.zeros((b, d), np.int64)
  want_tried = want_acc = 0
  for call in range(60):
    g = [0, 1, 2, 3][call % 4]
    before = (rounds.copy(), acc_at.copy())
    for _ in range(int(rng.integers(1, 9))):
      for row in range(b):
        rounds[row] += 1
        if g == 0:
          continue
        a = 0
        while a < g and rng.random() < alpha:
          a += 1
        acc_at[row, :a] += 1
        want_tried += a + (a < g)
        want_acc += a
    ev.observe(Tree((-1,)) if g == 0 else Tree.chain(g), before, (rounds.copy(), acc_at.copy()))
  assert (ev.tried, ev.accepted) == (want_tried, want_acc)
  assert abs(ev.alpha - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / want_tried)
  replaced = (rounds.copy(), acc_at.copy())
  rounds[0], acc_at[0] = 3, 0                                  # row 0 refilled: its counters restart
  ev.observe(Tree.chain(3), replaced, (rounds.copy(), acc_at.copy()))
  assert (ev.tried, ev.accepted) == (want_tried, want_acc)
  prior = schedule.ChainEvidence(0.4, prior_trials=64)
  assert prior.alpha == 0.4


@pytest.mark.parametrize("learn", [True, False])
def test_learned_acceptance_reprices_the_rest_of_the_call(monkeypatch, learn):
  """gamma="auto" priced with a low prior acceptance (0.3: gamma 1) while the draft accepts nearly every
  token (its window holds the whole context): after 32 rounds the learned acceptance re-prices the call
  and the rounds go on with gamma 3; without learning they stay at gamma 1. Plain decoding's tokens."""
  _price_by_alpha(monkeypatch)
  model = target()
  prompts = _prompts(model)
  new = 160
  ref = generate(model, prompts, max_new_tokens=new, eos_token_id=[])
  got = generate(model, prompts, max_new_tokens=new, eos_token_id=[], draft=StreamingDraft(sink=2, window=256),
                 gamma="auto", acceptance=[0.3], learn_acceptance=learn)
  assert got.tokens == ref.tokens
  sch = got.stats["schedule"]
  if not learn:
    assert {k for k, v in sch["rounds"].items() if v} == {"gamma=1"} and "learning" not in sch
    return
  learned = sch["learning"]
  first = learned["replans"][0]
  assert first["round"] == schedule.FIRST_CHECK and first["alpha"] > 0.6, learned
  assert first["setting_from_here"] == "gamma=3" and "band" not in first
  assert learned["tried"] > 0 and learned["accepted"] / learned["tried"] > 0.9, learned
  assert sch["rounds"]["gamma=1"] == schedule.FIRST_CHECK and sch["rounds"]["gamma=3"] > 0, sch
  assert [s["setting"] for s in sch["switches"]] == ["gamma=1", "gamma=3"], sch


def test_learned_acceptance_through_continuous_batching(monkeypatch):
  """generate_stream (2 slots refilled from 5 prompts): the evidence carries across refills and decode
  calls, the re-plan switches to gamma 3, and every row is plain decoding's."""
  _price_by_alpha(monkeypatch)
  model = target()
  prompts = _prompts(model)
  ref = generate(model, prompts, max_new_tokens=NEW, eos_token_id=EOS)
  gen = generate_stream(model, prompts, batch_size=2, refill_at=1, max_new_tokens=NEW, eos_token_id=EOS,
                        draft=StreamingDraft(sink=2, window=256), gamma="auto", acceptance=[0.3])
  got = {r.index: r.tokens for r in gen}
  assert [got[i] for i in range(len(prompts))] == ref.tokens
  learned = gen.stats["schedule"]["learning"]
  assert learned["replans"] and learned["replans"][0]["setting_from_here"] == "gamma=3", learned
  assert gen.stats["schedule"]["rounds"]["gamma=3"] > 0


def test_settings_the_cost_model_cannot_separate_are_measured(monkeypatch):
  """Where the cost model's band holds two settings (gamma 1 chosen, gamma 3 within its tie), the learning
  runs the other for one interval (rounds 32..96), then keeps the one measured fastest: the re-plan
  records say so, the rounds follow them, and the tokens are plain decoding's."""
  monkeypatch.setattr(plan.autotune, "choose", lambda cfg, spec, batch, context, **kw: (
      Tree.chain(1), {"speedup": 1.5, "hardware": "fake"}))
  monkeypatch.setattr(plan.autotune, "chain_band", lambda *a, **kw: [1, 3])
  model = target()
  prompts = _prompts(model)
  new = 300                          # rounds past 96 whatever the acceptance (at most 32 * 2 + 64 * 4 tokens)
  ref = generate(model, prompts, max_new_tokens=new, eos_token_id=[])
  got = generate(model, prompts, max_new_tokens=new, eos_token_id=[], draft=StreamingDraft(sink=2, window=8),
                 gamma="auto")
  assert got.tokens == ref.tokens
  sch = got.stats["schedule"]
  first, second = sch["learning"]["replans"][:2]
  assert (first["round"], first["why"], first["setting_from_here"]) == (32, "explore", "gamma=3"), first
  rates = second["measured_tokens_per_s"]
  assert second["round"] == 96 and second["why"] == "measured fastest" and set(rates) == {"gamma=1", "gamma=3"}
  assert second["setting_from_here"] == max(rates, key=rates.get), second
  assert sch["switches"][:2] == [{"round": 0, "context": sch["switches"][0]["context"], "setting": "gamma=1"},
                                 {"round": 32, "context": sch["switches"][1]["context"], "setting": "gamma=3"}]
  assert sch["rounds"]["gamma=1"] >= 32 and sch["rounds"]["gamma=3"] >= 64, sch
