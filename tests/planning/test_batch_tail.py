"""batch_tail: the slowest row's rounds in a fixed batch, against hand-counted cases and a numpy simulation."""
import numpy as np
import pytest

from magicdec_jax import trees
from magicdec_jax.tuning import batch_tail, costmodel, shapes
from magicdec_jax.tuning.draft_cost import DraftCost


def simulate_batch_rounds(alpha, gamma, new_tokens, batch, trials, seed=0):
  """Monte Carlo: per round each row's draft tokens are accepted one by one (Bernoulli alpha) until the
  first rejection; the row commits the accepted ones plus one token (the correction or the bonus)."""
  rng = np.random.default_rng(seed)
  rounds = new_tokens                                      # no row needs more than one round per token
  accepted = rng.random((trials, batch, rounds, gamma)) < alpha
  run = np.cumprod(accepted, axis=-1).sum(-1)              # leading accepted draft tokens
  total = np.cumsum(run + 1, axis=-1)                      # tokens after r + 1 rounds
  need = (total < new_tokens).sum(-1) + 1                  # rounds until the row has new_tokens
  return need.max(-1)                                      # the batch runs until its slowest row is done


def test_hand_counted_cases():
  # alpha 1: every round commits gamma + 1 tokens -> ceil(N / (gamma + 1)) rounds for every row
  assert batch_tail.expected_batch_rounds(1.0, 2, 7, 8) == pytest.approx(3.0)
  # alpha 0: one token per round -> N rounds
  assert batch_tail.expected_batch_rounds(0.0, 3, 5, 4) == pytest.approx(5.0)
  # N 2, gamma 1: one round with prob alpha (both tokens), else two; the max of two rows: 2 - alpha^2
  a = 0.7
  assert batch_tail.expected_batch_rounds(a, 1, 2, 1) == pytest.approx(2 - a)
  assert batch_tail.expected_batch_rounds(a, 1, 2, 2) == pytest.approx(2 - a * a)


def test_pmf_mean_is_the_chains_expected_tokens():
  for a, g in [(0.5, 1), (0.8, 3), (0.95, 6), (0.0, 2), (1.0, 4)]:
    p = batch_tail.chain_accept_pmf(a, g)
    assert p.sum() == pytest.approx(1.0)
    assert (np.arange(g + 2) * p).sum() == pytest.approx(costmodel.expected_tokens_chain(a, g))


@pytest.mark.parametrize("alpha,gamma,new_tokens,batch", [(0.8, 3, 64, 8), (0.876, 2, 64, 8), (0.6, 2, 40, 4),
                                                         (0.9, 2, 128, 1)])
def test_matches_a_simulation(alpha, gamma, new_tokens, batch):
  sim = simulate_batch_rounds(alpha, gamma, new_tokens, batch, trials=20000)
  se = sim.std() / np.sqrt(sim.size)
  assert abs(batch_tail.expected_batch_rounds(alpha, gamma, new_tokens, batch) - sim.mean()) < 4 * se + 1e-9


def test_long_runs_approach_the_mean_accepted_length_and_the_tail_shrinks():
  a, g = 0.85, 3
  e = costmodel.expected_tokens_chain(a, g)
  assert batch_tail.tokens_per_round(a, g, 4000, 1) == pytest.approx(e, rel=0.01)
  tails = [e / batch_tail.tokens_per_round(a, g, n, 8) for n in (64, 128, 256, 1024)]
  assert all(x > y for x, y in zip(tails, tails[1:])) and tails[0] > 1.1 and tails[-1] < 1.04


def test_bad_values_are_named():
  with pytest.raises(ValueError, match="alpha"):
    batch_tail.chain_accept_pmf(1.5, 2)
  with pytest.raises(ValueError, match="new_tokens"):
    batch_tail.rounds_survival(batch_tail.chain_accept_pmf(0.5, 2), 0)
  with pytest.raises(ValueError, match="batch"):
    batch_tail.expected_batch_rounds(0.5, 2, 10, 0)
  with pytest.raises(ValueError, match="pmf"):
    batch_tail.rounds_survival(np.array([0.5, 0.5]), 4)


def test_the_cost_model_prices_a_fixed_batchs_tail():
  """predicted_speedup(new_tokens=N) = N * T_AR / (E[slowest row's rounds] * T_round), E[...] simulated."""
  cfg, hw = shapes.llama31_8b(), costmodel.HARDWARE["h100"]
  draft = DraftCost(16 + 512)
  b, n, a, g, new = 8, 16384, 0.8, 3, 64
  t_round = g * costmodel.t_draft(cfg, hw, draft, b, n, 1) + costmodel.t_verify(cfg, hw, b, n, g + 1)
  sim = simulate_batch_rounds(a, g, new, b, trials=20000)
  want = new * costmodel.t_ar(cfg, hw, b, n) / (sim.mean() * t_round)
  got = costmodel.predicted_speedup(cfg, hw, draft, b, n, gamma=g, alpha=a, new_tokens=new)
  assert got == pytest.approx(want, rel=4 * sim.std() / np.sqrt(sim.size) / sim.mean() + 1e-9)
  steady = costmodel.predicted_speedup(cfg, hw, draft, b, n, gamma=g, alpha=a)
  assert got < steady / 1.05                                 # 64 tokens at batch 8: a tail of over 5%
  gamma, best = costmodel.choose_gamma(cfg, hw, draft, b, n, a, new_tokens=new)
  assert best == pytest.approx(costmodel.predicted_speedup(cfg, hw, draft, b, n, gamma=gamma, alpha=a,
                                                           new_tokens=new))
  with pytest.raises(ValueError, match="tree"):
    costmodel.predicted_speedup(cfg, hw, draft, b, n, tree=trees.Tree.chain(2), acceptance_vector=[0.8],
                                new_tokens=new)


def test_long_runs_use_a_normal_approximation_that_agrees_at_the_switch():
  # E[max of B standard normals]: 0 for one, 1 / sqrt(pi) for two, 3 / (2 sqrt(pi)) for three (closed forms)
  assert abs(batch_tail.expected_max_std_normal(1)) < 1e-9
  assert batch_tail.expected_max_std_normal(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
  assert batch_tail.expected_max_std_normal(3) == pytest.approx(1.5 / np.sqrt(np.pi), rel=1e-6)
  n = batch_tail.EXACT_UP_TO
  for a, g, b in [(0.8, 3, 8), (0.5, 2, 1), (0.95, 5, 32)]:
    exact = batch_tail.expected_batch_rounds(a, g, n, b)
    assert batch_tail.normal_batch_rounds(batch_tail.chain_accept_pmf(a, g), n, b) == pytest.approx(exact, rel=1e-3)
  # beyond the switch: the approximation, fast and still above the steady state by a shrinking tail
  e = costmodel.expected_tokens_chain(0.8, 3)
  r = batch_tail.expected_batch_rounds(0.8, 3, 16 * n, 8)
  assert 16 * n / e < r < 1.01 * 16 * n / e
