"""The tail of a fixed batch: rounds its slowest row needs, and what that does to a predicted speedup.

A fixed batch of B rows, each generating N new tokens, runs until its slowest row is done: rows that
finish early wait (`--mode=datagen` refills them; `generate` and the demo do not). Autoregressive decoding
needs exactly N steps for every row, so only speculation pays this tail. Measured on a 2-core CPU at
8 x 4096 (docs/measurements.md#notes-demo-tail): the batch ran 1.09x the mean row's rounds over 64
tokens, 1.05x over 128, 1.04x over 256.

Model: the tokens a row gains per round are independent draws of a chain's accepted length X (gamma draft
tokens, each accepted with probability alpha while the ones before it were: P(X = k) = alpha^(k-1) (1 -
alpha) for k <= gamma, P(X = gamma + 1) = alpha^gamma, the bonus token included). A row needs
R = min{r : X_1 + ... + X_r >= N} rounds; the batch max(R_1..R_B) over independent rows. Up to
EXACT_UP_TO new tokens both come exactly from the distribution of the partial sums (cost ~ new_tokens^2);
beyond, from the normal approximation of a renewal count (within 0.03% of exact at the switch, tested).
Rows whose acceptance differs from each other (one hard prompt in the batch) lengthen the tail beyond
this model, which assumes one alpha for all rows: read its figure as a lower bound.
"""
from __future__ import annotations

import functools

import numpy as np

EXACT_UP_TO = 8192     # new tokens computed exactly; above, the normal approximation (normal_batch_rounds)


def chain_accept_pmf(alpha: float, gamma: int) -> np.ndarray:
  """P(X = k) for k = 0..gamma + 1 (index k; P(X = 0) = 0): tokens a gamma chain commits per round."""
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if gamma < 0:
    raise ValueError(f"gamma must be >= 0, got {gamma}")
  p = np.zeros(gamma + 2)
  for k in range(1, gamma + 1):
    p[k] = alpha ** (k - 1) * (1 - alpha)
  p[gamma + 1] = alpha ** gamma
  return p


def rounds_survival(pmf: np.ndarray, new_tokens: int, tol: float = 1e-13) -> np.ndarray:
  """P(R > r) for r = 0, 1, ...: R = rounds a row needs to commit `new_tokens` tokens when each round
  commits an independent draw of `pmf` (index = tokens, pmf[0] must be 0). Ends where P(R > r) < tol."""
  pmf = np.asarray(pmf, np.float64)
  if new_tokens < 1:
    raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
  if pmf[0] != 0 or abs(pmf.sum() - 1) > 1e-9 or (pmf < 0).any():
    raise ValueError("pmf must be a distribution over 1, 2, ... tokens (pmf[0] = 0, summing to 1)")
  alive = np.zeros(new_tokens)                   # alive[s] = P(partial sum = s < N after r rounds)
  alive[0] = 1.0
  out = [1.0]
  while out[-1] >= tol:
    alive = np.convolve(alive, pmf)[:new_tokens]
    out.append(float(alive.sum()))
  return np.asarray(out)


@functools.lru_cache(maxsize=4096)
def expected_batch_rounds(alpha: float, gamma: int, new_tokens: int, batch: int) -> float:
  """E[max over `batch` independent rows of the rounds each needs for `new_tokens` tokens] (a chain):
  exact up to EXACT_UP_TO new tokens, the normal approximation beyond."""
  if batch < 1:
    raise ValueError(f"batch must be >= 1, got {batch}")
  pmf = chain_accept_pmf(alpha, gamma)
  if new_tokens > EXACT_UP_TO:
    return normal_batch_rounds(pmf, new_tokens, batch)
  surv = rounds_survival(pmf, new_tokens)
  return float(np.sum(1.0 - (1.0 - surv) ** batch))       # E[M] = sum_r P(M > r)


def expected_max_std_normal(batch: int) -> float:
  """E[max of `batch` independent standard normals] = integral of P(M > x) - P(M < -x) over x > 0."""
  from scipy.special import ndtr   # imported where used: scipy is slow to import (as in stepfit._nnls)
  x = np.linspace(0.0, 12.0, 24001)
  f = 1.0 - ndtr(x) ** batch - ndtr(-x) ** batch
  return float(np.sum((f[1:] + f[:-1]) / 2) * (x[1] - x[0]))


def normal_batch_rounds(pmf: np.ndarray, new_tokens: int, batch: int) -> float:
  """The renewal count's normal approximation: a row's rounds R have mean (N - 1 + E[overshoot]) / mu with
  the lattice overshoot E[X (X + 1)] / (2 mu), variance N sigma^2 / mu^3; the batch's E[max] adds
  sd * E[max of `batch` standard normals]."""
  k = np.arange(len(pmf))
  mu = float((k * pmf).sum())
  var = float((k * k * pmf).sum()) - mu * mu
  mean = (new_tokens - 1 + float((k * (k + 1) * pmf).sum()) / (2 * mu)) / mu
  return mean + np.sqrt(new_tokens * var / mu ** 3) * expected_max_std_normal(batch)


def tokens_per_round(alpha: float, gamma: int, new_tokens: int, batch: int) -> float:
  """Tokens per row per round of the whole batch: new_tokens / E[rounds of the slowest row]. Below the
  chain's mean accepted length by the tail (and by the last round's overshoot past new_tokens)."""
  return new_tokens / expected_batch_rounds(float(alpha), int(gamma), int(new_tokens), int(batch))
