"""The sort-free top-k / top-p filter and the inverse-CDF sampler against float64 numpy references.

Reference (independent of magicdec_jax.sampling): the sorted definition in float64. top-k keeps every logit
>= the k-th largest; top-p sorts the probabilities, keeps the prefix whose mass before each token is <
top_p, and then every logit >= the smallest kept one (ties at the threshold kept). Where the mass before a
distinct value (the mass strictly above it) lies within 1e-6 of top_p, float32 and float64 may honestly
disagree (the old float32 sort + cumsum did too): such knife-edge rows are left out, and each case asserts
that most of its rows are compared.
"""
from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from magicdec_jax import sampling
from magicdec_jax.sampling import Sampling, probabilities

KNIFE_EDGE = 1e-6


def kept64(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
  """float64 sorted definition -> (kept mask [R, V], probabilities [R, V], top-p margin [R])."""
  z = logits.astype(np.float64) / temperature
  v = z.shape[-1]
  if top_k and top_k < v:
    kth = -np.sort(-z, axis=-1)[:, top_k - 1:top_k]
    z = np.where(z < kth, -np.inf, z)
  margin = np.full(z.shape[0], np.inf)
  if top_p < 1.0:
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    order = np.argsort(-z, axis=-1, kind="stable")
    sz, sp = np.take_along_axis(z, order, -1), np.take_along_axis(p, order, -1)
    before = np.cumsum(sp, -1) - sp
    # what decides is the mass strictly above each distinct value (its first place in sorted order)
    first = np.concatenate([np.zeros_like(sz[:, :1], bool), sz[:, 1:] != sz[:, :-1]], axis=1)
    margin = np.where(first & np.isfinite(sz), np.abs(before - top_p), np.inf).min(-1)
    threshold = np.where(before < top_p, sz, np.inf).min(-1, keepdims=True)
    z = np.where(z < threshold, -np.inf, z)
  keep = np.isfinite(z)
  p = np.where(keep, np.exp(z - z.max(-1, keepdims=True)), 0.0)
  return keep, p / p.sum(-1, keepdims=True), margin


def _logits(kind: str, rows: int, v: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if kind == "normal":
    return (3.0 * rng.standard_normal((rows, v))).astype(np.float32)
  if kind == "lm-like":        # a heavy upper tail, like a language model's logits
    return (4.0 * rng.gumbel(size=(rows, v))).astype(np.float32)
  if kind == "ties":           # six distinct values: hundreds of ties at any threshold
    return rng.integers(0, 6, (rows, v)).astype(np.float32)
  if kind == "dominant":
    x = rng.standard_normal((rows, v)).astype(np.float32)
    x[:, 7] = 40.0
    return x
  if kind == "bfloat16":       # bfloat16 logits: 8 significant bits, many ties
    return np.asarray(jnp.asarray(3.0 * rng.standard_normal((rows, v)), jnp.bfloat16).astype(jnp.float32))
  if kind == "flat":
    return np.zeros((rows, v), np.float32)
  raise ValueError(kind)


SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 1, 1.0), (0.7, 50, 1.0), (1.0, 300, 1.0), (1.0, 0, 1.0),
    (1.0, 0, 1e-6), (0.8, 0, 0.5), (0.8, 0, 0.95), (1.0, 0, 0.99), (1.3, 200, 0.9), (0.8, 40, 0.95),
]


@pytest.mark.parametrize("kind", ["normal", "lm-like", "ties", "dominant", "bfloat16", "flat"])
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_kept_set_and_probabilities_match_the_sorted_definition(kind, temperature, top_k, top_p):
  v = 2048
  x = _logits(kind, 12, v, seed=zlib.crc32(repr((kind, top_k, top_p)).encode()) % 1000)   # hash() of a str: per process
  got = np.asarray(probabilities(jnp.asarray(x), Sampling(temperature, top_k=top_k, top_p=top_p)), np.float64)
  keep, want, margin = kept64(x, temperature, top_k, top_p)
  rows = margin > KNIFE_EDGE
  assert rows.sum() >= 10, f"only {rows.sum()} of 12 rows away from the knife edge"
  np.testing.assert_array_equal(got[rows] > 0, keep[rows])
  np.testing.assert_allclose(got[rows], want[rows], rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("v", [64, 49152])
def test_top_k_of_one_and_of_the_whole_vocabulary(v):
  x = _logits("normal", 3, v, seed=1)
  one = np.asarray(probabilities(jnp.asarray(x), Sampling(1.0, top_k=1)))
  want = np.zeros_like(one)
  want[np.arange(len(x)), x.argmax(-1)] = 1.0
  np.testing.assert_array_equal(one, want)
  whole = np.asarray(probabilities(jnp.asarray(x), Sampling(1.0, top_k=v)), np.float64)
  np.testing.assert_allclose(whole, kept64(x, 1.0, 0, 1.0)[1], rtol=2e-5, atol=1e-9)


def test_wide_vocabulary_many_kept_and_many_ties_at_the_threshold():
  """Qwen's vocabulary; top-p sets of thousands of tokens (the search path, not the candidates alone); a
  row whose threshold value is shared by ~10,000 tokens; -inf outside a top-k cut; top-p near 1."""
  v = 152064
  rng = np.random.default_rng(5)
  x = (0.5 * rng.standard_normal((4, v)) - 12.0).astype(np.float32)
  for r in (0, 2, 3):                # 3000 plausible tokens, the rest far below them
    x[r, rng.choice(v, 3000, replace=False)] = 0.5 * rng.standard_normal(3000)
  x[1] = rng.integers(0, 15, v).astype(np.float32)
  for s in (Sampling(1.0, top_p=0.9), Sampling(1.0, top_p=0.999), Sampling(1.0, top_k=5000),
            Sampling(1.0, top_k=3000, top_p=0.5)):
    got = np.asarray(probabilities(jnp.asarray(x), s)) > 0
    keep, _, margin = kept64(x, s.temperature, s.top_k, s.top_p)
    assert (margin > KNIFE_EDGE).all(), (s, margin)
    np.testing.assert_array_equal(got, keep)
  assert (np.asarray(probabilities(jnp.asarray(x), Sampling(1.0, top_p=0.9))) > 0).sum(-1).min() > 1000


def test_float_keys_keep_the_order_of_floats():
  x = np.array([-np.inf, -3e38, -1.5, -1e-30, -0.0, 0.0, 1e-45, 1e-30, 0.25, 1.5, 3e38, np.inf], np.float32)
  k = np.asarray(sampling.float_to_key(jnp.asarray(x))).astype(np.int64)
  assert (np.diff(k) > 0).all()
  np.testing.assert_array_equal(np.asarray(sampling.key_to_float(jnp.asarray(k.astype(np.uint32)))), x)


def test_greedy_is_the_argmax():
  x = _logits("normal", 4, 300, seed=2)
  np.testing.assert_array_equal(np.asarray(probabilities(jnp.asarray(x), Sampling())), np.eye(300)[x.argmax(-1)])


def test_no_sort_of_the_vocabulary_in_the_compiled_filter():
  """The filter is a search and a top-k selection; XLA must not have turned either into a full sort."""
  x = jnp.zeros((8, 49152), jnp.float32)
  for s in (Sampling(0.8, top_p=0.95), Sampling(0.8, top_k=50), Sampling(0.8, top_k=500, top_p=0.9)):
    hlo = jax.jit(lambda y: probabilities(y, s)).lower(x).compile().as_text()
    sorts = [line for line in hlo.splitlines() if " sort(" in line and "49152" in line]
    assert not sorts, sorts[:2]


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
  assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
  expected = counts.sum() * probs
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] < 5:
    obs, exp = obs[:-1], exp[:-1]
  return float(stats.chi2.sf(((obs - exp) ** 2 / exp).sum(), len(obs) - 1))


@pytest.mark.parametrize("s", [Sampling(0.8, top_p=0.95), Sampling(0.9, top_k=12), Sampling(1.0)])
def test_sampled_tokens_follow_the_filtered_distribution(s):
  """10^5 draws of `sample(probabilities(...))` from one row of V = 300: chi-square against float64."""
  n, v = 100_000, 300
  x = _logits("lm-like", 1, v, seed=3) / 6.0
  _, want, margin = kept64(x, s.temperature, s.top_k, s.top_p)
  assert margin[0] > KNIFE_EDGE and (want[0] > 1e-3).sum() >= 10
  draw = jax.jit(lambda keys: sampling.sample(keys, jnp.broadcast_to(probabilities(jnp.asarray(x), s), (n, v))))
  tokens = np.asarray(draw(jax.random.split(jax.random.key(7), n)))
  pval = _chi_square(np.bincount(tokens, minlength=v), want[0])
  assert pval > 1e-3, pval


def test_draws_without_replacement_follow_sequential_sampling():
  """Ordered triples of distinct tokens from V = 7: float64 sequential-draw probabilities, chi-square."""
  n, v = 100_000, 7
  p = np.array([0.3, 0.2, 0.15, 0.15, 0.1, 0.0, 0.1])
  want = np.zeros((v, v, v))
  for a in range(v):
    for b in range(v):
      for c in range(v):
        if len({a, b, c}) == 3 and p[a] > 0 and p[b] > 0 and p[c] > 0:
          want[a, b, c] = p[a] * p[b] / (1 - p[a]) * p[c] / (1 - p[a] - p[b])
  draw = jax.jit(lambda keys: sampling.sample_without_replacement(
      keys, jnp.broadcast_to(jnp.asarray(p, jnp.float32), (n, v)), 3))
  t = np.asarray(draw(jax.random.split(jax.random.key(11), n)))
  assert (t[:, 0] != t[:, 1]).all() and (t[:, 1] != t[:, 2]).all() and (t[:, 0] != t[:, 2]).all()
  pval = _chi_square(np.bincount((t[:, 0] * v + t[:, 1]) * v + t[:, 2], minlength=v ** 3), want.reshape(-1))
  assert pval > 1e-3, pval


def test_sampling_never_draws_a_cut_token_across_blocks():
  """Mass in blocks of the two-stage draw that the filter emptied is never reached (V spans 3 blocks)."""
  v = 3 * sampling.SAMPLE_BLOCK - 17
  p = np.zeros(v, np.float32)
  p[[3, sampling.SAMPLE_BLOCK + 5, v - 1]] = [0.5, 1e-7, 0.5 - 1e-7]
  t = np.asarray(jax.jit(lambda k: sampling.sample(k, jnp.broadcast_to(jnp.asarray(p), (20000, v))))(
      jax.random.split(jax.random.key(3), 20000)))
  assert set(np.unique(t).tolist()) <= {3, sampling.SAMPLE_BLOCK + 5, v - 1}
  assert abs((t == 3).mean() - 0.5) < 0.02
