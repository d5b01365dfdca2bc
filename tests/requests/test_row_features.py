"""The row-feature interface (row_features/): a feature registered from outside the package runs inside the
compiled speculative loop, on the target's and the draft's logits alike, with its own per-row state filled
at insert, advanced by the emitted tokens, and able to end a row.

The feature under test bans one token on every row and ends a row after LIMIT tokens. References are
independent of the loop: a float64 numpy argmax / softmax over a plain full forward with that token
removed, one token at a time. Also: a feature that is off leaves the logits object untouched and the state
without its leaves, and every leaf of the per-row state leads with the batch axis.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import magicdec_jax as md
from magicdec_jax import row_features
from magicdec_jax.generation import generate
from magicdec_jax.model import full_forward
from magicdec_jax.row_features import Nodes, RowFeature
from magicdec_jax.sampling import Sampling, Scores, filter_logits
from magicdec_jax.stream import generate_stream
from magicdec_jax.trees import Tree

from conftest import random_prompts, tiny_model

LIMIT = 6


@dataclasses.dataclass(frozen=True)
class BanAndLimit(RowFeature):
  """Bans `banned` on every row; a row ends after LIMIT tokens (its state counts them)."""
  name: ClassVar[str] = "ban"
  banned: int = 0

  def fill(self, options, run):
    return {"seen": jnp.zeros((len(options),), jnp.int32)}         # [n] tokens emitted so far

  def logits(self, state, scores, nodes, sampling):
    return Scores(scores.x.at[..., self.banned].set(-jnp.inf), scores.argmax)

  def end(self, state, emitted, count):
    room = LIMIT - state["seen"]
    return jnp.minimum(count, room), (count >= room) & (count > 0)

  def advance(self, state, emitted, count):
    return {"seen": state["seen"] + count}


@pytest.fixture(scope="module")
def model():
  return tiny_model(0, attn_scale=10.0)


@pytest.fixture(scope="module")
def prompts():
  return random_prompts((5, 9, 3, 12), 64, seed=1)


def _logits64(model, seq) -> np.ndarray:
  return np.asarray(full_forward(model.params, model.config, jnp.asarray([seq]))[0, -1], np.float64)


def _masked_greedy(model, prompts, banned: int) -> list[list[int]]:
  out = []
  for p in prompts:
    seq = list(p)
    for _ in range(LIMIT):
      x = _logits64(model, seq)
      x[banned] = -np.inf
      seq.append(int(np.argmax(x)))
    out.append(seq[len(p):])
  return out


def _most_argmaxed(model, prompts) -> int:
  """The token greedy decoding emits most often (banning it changes the outputs, and a draft that did not
  ban it would propose it and be rejected)."""
  toks = [t for row in generate(model, prompts, max_new_tokens=LIMIT).tokens for t in row]
  return int(np.bincount(toks).argmax())


@pytest.fixture
def banned(model, prompts, monkeypatch):
  tok = _most_argmaxed(model, prompts)
  monkeypatch.setattr(row_features, "REGISTRY", {"ban": BanAndLimit(tok), **row_features.REGISTRY})
  return tok


@pytest.mark.parametrize("spec", ["chain", "tree", "stream"])
def test_a_registered_feature_masks_draft_and_target_and_ends_rows(model, prompts, banned, spec):
  want = _masked_greedy(model, prompts, banned)
  assert want != generate(model, prompts, max_new_tokens=LIMIT).tokens      # the ban matters
  kw = dict(max_new_tokens=16, row_features=("ban",), draft=md.StreamingDraft(sink=4, window=64))
  if spec == "stream":
    got = {r.index: r for r in generate_stream(model, prompts, batch_size=2, gamma=2, **kw)}
    assert [got[i].tokens for i in range(len(prompts))] == want
    assert all(got[i].finish_reason == "length" for i in got)
    return
  res = generate(model, prompts, **(dict(gamma=3) if spec == "chain" else dict(tree=Tree((-1, 0, 0, 1)))), **kw)
  assert res.tokens == want
  # the draft (the target over a window holding every position) is transformed as the target is: nothing is
  # rejected, though the banned token is greedy decoding's favourite
  assert res.stats["acceptance_rate"] == 1.0


def test_a_sampled_row_draws_from_the_transformed_distribution(model, banned):
  """First tokens of 300 rows of one prompt at temperature 0.7, speculating with a draft that disagrees
  with the target (sink 1, window 2), against float64 numpy of the masked, tempered distribution."""
  prompt = random_prompts((11,), 64, seed=7)[0]
  x = _logits64(model, prompt) / 0.7
  x[banned] = -np.inf
  p = np.exp(x - x.max())
  p /= p.sum()
  n, chunk = 300, 100               # independent streams, 100 rows a call: one small compiled batch
  tokens = []
  for k in range(0, n, chunk):
    res = generate(model, [prompt] * chunk, max_new_tokens=1, temperature=0.7, seed=2, row_features=("ban",),
                   draft=md.StreamingDraft(sink=1, window=2), gamma=2, stream_ids=range(k, k + chunk))
    tokens += [t[0] for t in res.tokens]
  counts = np.bincount(tokens, minlength=len(p))
  assert counts[banned] == 0
  big = n * p >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(n * p[big], n * p[~big].sum())
  stat = float(((obs - exp) ** 2 / exp).sum())
  assert stats.chi2.sf(stat, len(obs) - 1) > 1e-3, (obs, exp)


def test_an_off_feature_compiles_to_nothing(model, prompts):
  logits = jnp.ones((2, 3, 64))
  nodes = Nodes(Tree.chain(2), jnp.zeros((2, 3), jnp.int32), jnp.arange(3))
  assert row_features.scores_at({}, Sampling(), logits, nodes).x is logits          # greedy: the logits as they are
  s = Sampling(0.7, top_k=5)
  np.testing.assert_array_equal(row_features.scores_at({}, s, logits, nodes).x, filter_logits(logits, s))
  eng_state = md.engine.Engine(model, md.plan.make_plan(model, md.DecodeSettings(max_new_tokens=4), batch=2,
                                                        shortest=3, longest=3)).empty_state(2, 32)
  assert eng_state.rows.features == {}


def test_every_per_row_leaf_leads_with_the_batch(model, banned):
  st = md.DecodeSettings(max_new_tokens=4, per_row_sampling=True, logprobs=True, top_logprobs=2,
                         row_features=("ban",), draft=md.StreamingDraft(2, 8), gamma=2)
  eng = md.engine.Engine(model, md.plan.make_plan(model, st, batch=3, shortest=3, longest=3))
  state = eng.empty_state(3, 32)
  assert set(state.rows.features) == {"ban", "sampling"}
  assert all(x.shape[0] == 3 for x in jax.tree.leaves(state.per_row()))
  assert state.out is state.rows.out and state.step is state.shared.step       # reads route to the parts
  assert state.replace(done=state.done, step=state.step).rows.done is state.rows.done
