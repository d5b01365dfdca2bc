"""PromptLookupDraft: its proposals against a plain-Python n-gram lookup, and decoding with it equal to plain
autoregressive decoding (fixed batch, continuous batching, stop tokens). Its sampling is checked by the
chi-square test of test_speculative_sampling.py (case chain2-lookup-t1)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax.drafts import PromptLookupDraft, Round
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree

from conftest import tiny_model


def lookup_reference(seq: list[int], gamma: int, max_ngram: int, min_ngram: int) -> list[int]:
  """The proposal for the row seq (its last token pending): the tokens after the latest earlier occurrence
  of its longest matching suffix n-gram, a continuation that runs past the end copying what it proposed;
  the last token repeated where nothing matches."""
  ext = list(seq)
  start = None
  for n in range(max_ngram, min_ngram - 1, -1):
    if len(seq) <= n:
      continue
    suffix = seq[-n:]
    hits = [j for j in range(len(seq) - n) if seq[j:j + n] == suffix]    # window ends before the last token
    if hits:
      start = hits[-1] + n
      break
  if start is None:
    start = len(seq) - 1
  out = []
  for d in range(gamma):
    tok = ext[start + d]
    ext.append(tok)
    out.append(tok)
  return out


@pytest.mark.parametrize("max_ngram,min_ngram,s", [(3, 1, 64), (2, 2, 64), (1, 1, 64), (14, 1, 12)])
def test_proposals_match_a_plain_python_lookup(max_ngram, min_ngram, s):
  """(s: the history's slots; an n-gram longer than it never matches)"""
  rng = np.random.default_rng(max_ngram * 10 + min_ngram)
  cfg = tiny_model(0).config
  d = PromptLookupDraft(max_ngram, min_ngram)
  gamma = 4
  rows = []
  for _ in range(24):                       # small alphabets: plenty of repeats, some rows with none
    length = int(rng.integers(1, min(40, s - gamma)))
    rows.append(rng.integers(0, int(rng.choice([3, 6, 50])), length).tolist())
  b = len(rows)
  hist = np.zeros((b, s), np.int32)
  for i, r in enumerate(rows):
    hist[i, :len(r) - 1] = r[:-1]
    hist[i, len(r) - 1:] = 7          # garbage past the committed length must never be read
  lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
  last = jnp.asarray([r[-1] for r in rows], jnp.int32)
  tree = Tree.chain(gamma)
  keys = jax.random.split(jax.random.key(0), b)
  node_tokens, _, _ = d.propose(jnp.asarray(hist), Round(tree, Sampling(), None, cfg, None, last, last, lengths, keys))
  node_tokens = np.asarray(node_tokens)
  for i, row in enumerate(rows):
    assert node_tokens[i, 0] == row[-1]
    assert node_tokens[i, 1:].tolist() == lookup_reference(row, gamma, max_ngram, min_ngram), (i, row)


def _repetitive_prompts(vocab: int):
  rng = np.random.default_rng(4)
  motif = rng.integers(0, vocab, 9).tolist()
  return [motif * 5 + rng.integers(0, vocab, 3).tolist(), rng.integers(0, vocab, 23).tolist() + motif * 2,
          (motif[:4] * 8)[:29]]


def test_greedy_decoding_with_lookup_equals_autoregressive():
  model = tiny_model(3, attn_scale=8.0)
  prompts = _repetitive_prompts(model.config.vocab_size)
  ref = md.generate(model, prompts, max_new_tokens=24)
  eos = ref.tokens[0][10]                  # a token row 0 emits mid-run: rows stop at different rounds
  ref_eos = md.generate(model, prompts, max_new_tokens=24, eos_token_id=eos)
  for gamma in (1, 3, 5):
    res = md.generate(model, prompts, max_new_tokens=24, draft=PromptLookupDraft(), gamma=gamma)
    assert res.tokens == ref.tokens
    assert res.stats["acceptance_rate"] > 0, "repetitive prompts: some proposals must be accepted"
    assert md.generate(model, prompts, max_new_tokens=24, draft=PromptLookupDraft(2), gamma=gamma,
                       eos_token_id=eos).tokens == ref_eos.tokens


def test_continuous_batching_with_lookup_gives_the_autoregressive_tokens():
  """Rows inserted into slots whose history holds an earlier occupant's tokens (insert_rows) still look
  up only their own text."""
  model = tiny_model(3, attn_scale=8.0)
  prompts = _repetitive_prompts(model.config.vocab_size) * 2
  ref = md.generate(model, prompts, max_new_tokens=12).tokens
  got = sorted(md.generate_stream(model, prompts, max_new_tokens=12, batch_size=2, draft=PromptLookupDraft(),
                                  gamma=3), key=lambda r: r.index)
  assert [r.tokens for r in got] == ref


def test_lookup_refuses_trees_and_bad_sizes():
  model = tiny_model(0)
  for tree in (Tree.from_children_counts([2, 1]), "auto"):
    with pytest.raises(ValueError, match="chain"):
      md.generate(model, [[1, 2, 3]], max_new_tokens=4, draft=PromptLookupDraft(), tree=tree)
  with pytest.raises(ValueError, match="max_ngram"):
    PromptLookupDraft(0)
  with pytest.raises(ValueError, match="min_ngram=3"):
    PromptLookupDraft(2, 3)
