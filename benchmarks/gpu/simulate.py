"""Simulated acceptance for runs with random weights: the acceptance vectors they use and a check of the walk.

Random weights accept almost nothing, so a benchmark after a draft's real costs at a realistic acceptance sets
the plan field `simulated_acceptance` (the loop's `verify.simulated_walk`): a chain's draft token is accepted
with probability alpha once the ones before it were, a tree's child of rank k with probability v[k]. The real
`verify.accept` still runs; only its outcome is replaced (drafts, verify, commits, rollbacks run as in use).
"""
from __future__ import annotations

import jax
import numpy as np

from magicdec_jax import verify
from magicdec_jax.trees import Tree


def default_vector(alpha: float, width: int = 8) -> tuple[float, ...]:
  """v[k] = alpha (1 - alpha)^k: each of a node's children accepted independently with probability alpha
  (the first one wins); a chain node (rank 0 only) is accepted with alpha."""
  return tuple(float(alpha * (1 - alpha) ** k) for k in range(width))


def check(alpha: float, gamma: int = 4, batch: int = 4096, tree: Tree | None = None, vector=None) -> dict:
  """Large-sample check of the switch: a chain's per-position conditional acceptance should be alpha, a
  tree's mean accepted length tree.expected_tokens(vector) - 1."""
  vector = tuple(vector) if vector is not None else (alpha,)
  tree = tree or Tree.chain(gamma)
  _, n, acc_at = verify.simulated_walk(tree, vector, jax.random.split(jax.random.key(1), batch))
  acc_at = np.asarray(acc_at)
  trials = batch + acc_at[:, :-1].sum()             # depth d is tried iff every depth before it was accepted
  return {"alpha": alpha, "gamma": gamma if tree.is_chain else None, "tree_nodes": tree.num_nodes, "rows": batch,
          "conditional_acceptance": float(acc_at.sum() / trials), "mean_accepted": float(np.asarray(n).mean()),
          "expected_mean_accepted": float(tree.expected_tokens(vector) - 1)}
