"""The tail of a fixed batch: rounds its slowest row needs, and what that does to a predicted speedup.

A fixed batch of B rows, each generating N new tokens, runs until its slowest row is done: rows that
finish early wait (`--mode=datagen` refills them; `generate` and the demo do not). Autoregressive decoding
needs exactly N steps for every row, so only speculation pays this tail. Measured on a 2-core CPU at
8 x 4096 (benchmarks/NOTES.md): the batch ran 1.09x the mean row's rounds over 64 tokens, 1.05x over 128,
1.04x over 256.

Model: the tokens a row gains per round are independent draws of a chain's accepted length X (gamma draft
tokens, each accepted with probability alpha while the ones before it were: P(X = k) = alpha^(k-1) (1 -
alpha) for k <= gamma, P(X = gamma + 1) = alpha^gamma, the bonus token included). A row needs
R = min{r : X_1 + ... + X_r >= N} rounds; the batch max(R_1..R_B) over independent rows. Both are computed
exactly from the distribution of the partial sums (no normal approximation). Rows whose acceptance differs
from each other (one hard prompt in the batch) lengthen the tail beyond this model, which assumes one
alpha for all rows: read its figure as a lower bound.
"""
from __future__ import annotations

import functools

import numpy as np


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
  """E[max over `batch` independent rows of the rounds each needs for `new_tokens` tokens] (a chain)."""
  if batch < 1:
    raise ValueError(f"batch must be >= 1, got {batch}")
  surv = rounds_survival(chain_accept_pmf(alpha, gamma), new_tokens)
  return float(np.sum(1.0 - (1.0 - surv) ** batch))       # E[M] = sum_r P(M > r)


def tokens_per_round(alpha: float, gamma: int, new_tokens: int, batch: int) -> float:
  """Tokens per row per round of the whole batch: new_tokens / E[rounds of the slowest row]. Below the
  chain's mean accepted length by the tail (and by the last round's overshoot past new_tokens)."""
  return new_tokens / expected_batch_rounds(float(alpha), int(gamma), int(new_tokens), int(batch))
