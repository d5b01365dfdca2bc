"""Per-row sampling settings (`RowSampling`) against a float64 numpy reference and the static path.

Reference (independent of magicdec_jax.sampling): the sorted definition in float64, per row. top-k keeps
every logit >= the k-th largest; top-p sorts, keeps every logit >= the smallest one whose strictly-greater
mass is < top_p (ties kept); greedy rows are the one-hot of the raw argmax. The loop relies on a second
property, checked bit for bit: a row in a mixed batch is filtered exactly as `filter_logits` filters it
alone with its own static `Sampling`. Both properties hold away from top-p's knife edges (a value whose
strictly-greater mass is within 1e-6 of top_p), where float32 sums may honestly disagree; the cases here
assert that they are away from them.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax.sampling import (RowSampling, Sampling, filter_logits, filter_logits_rows, greedy_rows,
                                   probabilities, probabilities_rows)

V = 3000
ROWS = [  # (temperature, top_k, top_p, ties)
    (0.0, 0, 1.0, False),      # greedy
    (0.7, 0, 0.9, False),
    (1.0, 50, 1.0, False),     # static path: lax.top_k
    (0.8, 5, 0.95, False),
    (1.3, 0, 1.0, False),      # no cut
    (1.0, 700, 1.0, True),     # static path: the search; the k-th value is shared by ~500 logits
    (1.0, 0, 0.8, True),       # the top-p threshold is shared by ~500 logits
    (0.0, 5, 0.5, False),      # greedy with cuts set: still the raw argmax
]
SETTINGS = [Sampling(t, top_k=k, top_p=p) for t, k, p, _ in ROWS]
KNIFE_EDGE = 1e-6


def _logits(positions: int, seed: int = 0) -> np.ndarray:
  """[B, positions, V] float32; tie rows hold six distinct values."""
  rng = np.random.default_rng(seed)
  x = (3.0 * rng.standard_normal((len(ROWS), positions, V))).astype(np.float32)
  for r, row in enumerate(ROWS):
    if row[3]:
      x[r] = rng.integers(0, 6, (positions, V)).astype(np.float32)
  return x


def reference(x: np.ndarray, temperature: float, top_k: int, top_p: float):
  """x [V] -> (kept mask [V], float64 probabilities [V], distance of top_p to the nearest decisive mass)."""
  if temperature == 0.0:
    return np.arange(x.size) == np.argmax(x), np.eye(x.size)[np.argmax(x)], np.inf
  z = x.astype(np.float64) / temperature
  if 0 < top_k < z.size:
    z = np.where(z < np.sort(z)[::-1][top_k - 1], -np.inf, z)
  margin = np.inf
  if top_p < 1.0:
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-z, kind="stable")
    sz, sp = z[order], p[order]
    before = np.cumsum(sp) - sp                        # mass strictly above, at each value's first place
    first = np.concatenate([[True], sz[1:] != sz[:-1]]) & np.isfinite(sz)
    margin = np.abs(before - top_p)[first].min()
    z = np.where(z < sz[first & (before < top_p)].min(), -np.inf, z)
  keep = np.isfinite(z)
  p = np.where(keep, np.exp(z - z.max()), 0.0)
  return keep, p / p.sum(), margin


@pytest.mark.parametrize("positions", [None, 3])
def test_each_row_matches_the_sorted_float64_definition(positions):
  x = _logits(positions or 1, seed=1)
  x = x[:, 0] if positions is None else x
  got = np.asarray(jax.jit(probabilities_rows)(jnp.asarray(x), RowSampling.of(SETTINGS)), np.float64)
  assert got.shape == x.shape
  for r, (t, k, p, _) in enumerate(ROWS):
    for n in range(positions or 1):
      row, g = (x[r], got[r]) if positions is None else (x[r, n], got[r, n])
      keep, want, margin = reference(row, t, k, p)
      assert margin > KNIFE_EDGE, (r, n, margin)
      np.testing.assert_array_equal(g > 0, keep, err_msg=f"row {r} position {n}")
      np.testing.assert_allclose(g, want, rtol=0, atol=1e-6, err_msg=f"row {r} position {n}")
  kept = (got > 0).sum(-1)
  assert kept[5].min() > 700 and kept[6].min() > 300            # the tie rows keep whole tied values


@pytest.mark.parametrize("positions", [None, 3])
def test_a_row_in_a_mixed_batch_is_filtered_exactly_as_alone(positions):
  """filter_logits_rows on the batch == static filter_logits on each row with its own Sampling: the same
  -inf pattern and the same values (greedy rows: temperature 1, the documented divisor)."""
  x = _logits(positions or 1, seed=2)
  x = x[:, 0] if positions is None else x
  got = np.asarray(jax.jit(filter_logits_rows)(jnp.asarray(x), RowSampling.of(SETTINGS)))
  static = jax.jit(filter_logits, static_argnums=1)
  for r, s in enumerate(SETTINGS):
    assert all(reference(row, *ROWS[r][:3])[2] > KNIFE_EDGE for row in x[r].reshape(-1, V))
    alone = static(jnp.asarray(x[r:r + 1]), dataclasses.replace(s, temperature=s.temperature or 1.0))
    np.testing.assert_array_equal(got[r], np.asarray(alone)[0], err_msg=f"row {r}")


def test_uniform_rows_equal_the_static_filter():
  x = _logits(2, seed=3)[:, :, :1000]
  x = jnp.asarray(x)
  for s in (Sampling(0.8, top_k=40, top_p=0.95), Sampling(1.0, top_k=300), Sampling(0.6, top_p=0.9)):
    got = filter_logits_rows(x, RowSampling.uniform(s, x.shape[0]))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(filter_logits(x, s)))


def test_greedy_rows_are_the_one_hot_of_the_raw_argmax():
  x = _logits(3, seed=4)
  rs = RowSampling.of(SETTINGS)
  np.testing.assert_array_equal(np.asarray(greedy_rows(rs)), [t == 0.0 for t, *_ in ROWS])
  got = np.asarray(probabilities_rows(jnp.asarray(x), rs))
  for r in (0, 7):
    np.testing.assert_array_equal(got[r], np.eye(V, dtype=np.float32)[x[r].argmax(-1)])


def test_one_compiled_program_for_any_mix():
  traces = []

  def probs(x, rs):
    traces.append(1)
    return probabilities_rows(x, rs)

  f = jax.jit(probs)
  x = jnp.asarray(_logits(1, seed=5)[:, 0, :500])
  for rows in (ROWS, ROWS[::-1], ROWS[3:] + ROWS[:3]):
    got = np.asarray(f(x, RowSampling.of([Sampling(t, top_k=k, top_p=p) for t, k, p, _ in rows])))
    for r, (t, k, p, _) in enumerate(rows):
      keep, want, margin = reference(np.asarray(x[r]), t, k, p)
      assert margin > KNIFE_EDGE
      np.testing.assert_array_equal(got[r] > 0, keep)
      np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-6)
  assert len(traces) == 1


def test_construction_and_validation():
  rs = RowSampling.of(SETTINGS)
  assert rs.temperature.dtype == jnp.float32 and rs.top_k.dtype == jnp.int32 and rs.top_p.dtype == jnp.float32
  assert rs.top_k.shape == (len(ROWS),)
  u = RowSampling.uniform(Sampling(0.7, top_k=3), 4)
  np.testing.assert_array_equal(np.asarray(u.top_k), [3] * 4)
  with pytest.raises(ValueError):
    RowSampling.of([])
  with pytest.raises(ValueError):
    RowSampling.of([Sampling(0.7), Sampling(0.7, invariant=True)])
  bad = Sampling(0.7)
  object.__setattr__(bad, "top_p", 1.5)                          # bypasses Sampling's own check
  with pytest.raises(ValueError):
    RowSampling.of([bad])
  # built from arrays, or one field replaced: still the sorted definition
  x = _logits(1, seed=6)[1:4, 0]
  p = jnp.asarray([0.9, 0.5, 0.97], jnp.float32)
  plain = RowSampling(jnp.ones(3), jnp.zeros(3, jnp.int32), p, jnp.zeros(3))
  replaced = RowSampling.uniform(Sampling(1.0, top_k=2), 3).replace(top_k=jnp.zeros(3, jnp.int32), top_p=p)
  for rs in (plain, replaced):
    got = np.asarray(probabilities_rows(jnp.asarray(x), rs))
    for r in range(3):
      keep, want, margin = reference(x[r], 1.0, 0, float(p[r]))
      assert margin > KNIFE_EDGE
      np.testing.assert_array_equal(got[r] > 0, keep)
      np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-6)


def test_no_sort_of_the_vocabulary_in_the_compiled_filter():
  x = jnp.zeros((6, 49152), jnp.float32)
  hlo = jax.jit(probabilities_rows).lower(x, RowSampling.of(SETTINGS[:6])).compile().as_text()
  sorts = [line for line in hlo.splitlines() if " sort(" in line and "49152" in line]
  assert not sorts, sorts[:2]


def _min_p_reference(x: np.ndarray, s: Sampling) -> np.ndarray:
  """float64: the sorted definitions of top-k / top-p (reference), then min-p: keep the tokens whose
  probability is at least min_p times the most likely one's."""
  keep, p, _ = reference(x, s.temperature, s.top_k, s.top_p)
  if s.min_p > 0:
    keep = keep & (p >= s.min_p * p.max())
    p = np.where(keep, p, 0.0)
  return p / p.sum()


def test_min_p_static_and_per_row_against_float64():
  """min-p after top-k / top-p, statically and per row in one mixed batch, against float64 numpy; a row
  without min-p is unchanged by its neighbours' cut."""
  rng = np.random.default_rng(5)
  x = (3.0 * rng.standard_normal((5, V))).astype(np.float32)
  rows = [Sampling(0.7, min_p=0.1), Sampling(1.0, top_k=50, min_p=0.05), Sampling(1.2, top_p=0.9, min_p=0.2),
          Sampling(0.9), Sampling(0.0, min_p=0.5)]
  got_rows = np.asarray(jax.jit(probabilities_rows)(jnp.asarray(x), RowSampling.of(rows)), np.float64)
  for r, s in enumerate(rows):
    want = _min_p_reference(x[r], s)
    got = np.asarray(probabilities(jnp.asarray(x[r:r + 1]), s), np.float64)[0]
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_array_equal(got_rows[r] > 0, want > 0)
    np.testing.assert_allclose(got_rows[r], want, atol=1e-6)
  for bad in (-0.1, 1.5):
    with pytest.raises(ValueError, match="min_p must be in"):
      Sampling(1.0, min_p=bad)



def test_a_tiny_temperature_samples_the_argmax():
  """At temperature 1e-9 the filtered distribution is the one-hot of the argmax (float64: every other
  token's probability underflows), so sampling (plain, or through a draft's chain) gives greedy decoding's
  tokens with log-probabilities 0. Divided before the max was subtracted, XLA rounded the compiled-in
  quotients apart in the loop: NaN or 0 probabilities, token 0 drawn. Below 1e-30 (1 / T overflows) and
  non-finite values are refused."""
  import magicdec_jax as md
  from conftest import random_prompts, tiny_model
  model, prompts = tiny_model(0, vocab=300, attn_scale=10.0), random_prompts([5, 9], 300, seed=1)
  kw = dict(max_new_tokens=8, eos_token_id=[])
  greedy = md.generate(model, prompts, **kw).tokens
  for extra in ({}, dict(draft=md.StreamingDraft(2, 4), gamma=2)):
    got = md.generate(model, prompts, temperature=1e-9, seed=3, logprobs=True, **kw, **extra)
    assert got.tokens == greedy
    assert max(abs(x) for row in got.logprobs for x in row) < 1e-6
  for bad in (1e-31, float("inf"), float("nan")):
    with pytest.raises(ValueError, match=r"temperature must be in \[1e-30, 1e\+30\] or 0 \(greedy\)"):
      Sampling(bad)
