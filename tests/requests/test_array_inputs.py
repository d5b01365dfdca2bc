"""generate / logits take integer arrays [B, T] (numpy or jax), ragged via lengths or attention_mask, with
the same results as the list form; bad arrays are ValueErrors naming the value, raised before compiling."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md

from conftest import compile_count, random_prompts, tiny_model

LENS = [5, 11, 8]


def _padded(prompts, left=False, pad=0):
  t = max(map(len, prompts))
  ids = np.full((len(prompts), t), pad, np.int64)
  mask = np.zeros((len(prompts), t), np.int64)
  for i, p in enumerate(prompts):
    sl = slice(t - len(p), t) if left else slice(0, len(p))
    ids[i, sl], mask[i, sl] = p, 1
  return ids, mask


@pytest.mark.parametrize("draft", [None, md.StreamingDraft(sink=1, window=4)], ids=["ar", "streaming"])
def test_arrays_equal_lists(draft):
  model = tiny_model(0, attn_scale=10.0)
  prompts = random_prompts(LENS, 64, seed=3)
  kw = dict(max_new_tokens=6, draft=draft, gamma=None if draft is None else 2)
  ref = md.generate(model, prompts, **kw).tokens
  ids, mask = _padded(prompts, pad=63)
  assert md.generate(model, ids, lengths=np.asarray(LENS), **kw).tokens == ref
  assert md.generate(model, jnp.asarray(ids, jnp.int32), attention_mask=jnp.asarray(mask), **kw).tokens == ref
  left_ids, left_mask = _padded(prompts, left=True, pad=7)
  assert md.generate(model, left_ids, attention_mask=left_mask.astype(bool), **kw).tokens == ref
  same = [p[:5] for p in prompts]                                     # rectangular: no lengths needed
  assert md.generate(model, np.asarray(same, np.int32), **kw).tokens == md.generate(model, same, **kw).tokens


def test_logits_arrays_equal_lists():
  model = tiny_model(0)
  prompts = random_prompts([7, 7], 64, seed=4)
  ref = md.logits(model, prompts)
  np.testing.assert_array_equal(md.logits(model, np.asarray(prompts, np.int16)), ref)
  np.testing.assert_array_equal(md.logits(model, jnp.asarray(prompts)), ref)


@pytest.mark.parametrize("prompts, kw, match", [
    (np.zeros((2, 4), np.float32), {}, "integer dtype"),
    (np.zeros((4,), np.int32), {}, "2-D"),
    (np.zeros((2, 0), np.int32), {}, "2-D"),
    (np.full((2, 4), 64, np.int32), {}, "token id 64"),
    (np.full((2, 4), -1, np.int32), {}, "token id -1"),
    (np.zeros((2, 4), np.int32), dict(lengths=[4, 5]), r"lengths\[1\]=5 is outside \[1, 4\]"),
    (np.zeros((2, 4), np.int32), dict(lengths=[0, 2]), r"lengths\[0\]=0"),
    (np.zeros((2, 4), np.int32), dict(lengths=[1.5, 2.0]), "lengths must be an integer array"),
    (np.zeros((2, 4), np.int32), dict(lengths=[1, 2, 3]), r"lengths must have shape \(2,\)"),
    (np.zeros((2, 4), np.int32), dict(attention_mask=[[1, 0, 1, 0], [1, 1, 1, 1]]), "row 0 is not one contiguous"),
    (np.zeros((2, 4), np.int32), dict(attention_mask=[[0, 1, 1, 0], [1, 1, 1, 1]]), "row 0 is not one contiguous"),
    (np.zeros((2, 4), np.int32), dict(attention_mask=[[1, 1, 0, 0], [0, 0, 0, 0]]), "row 1 is all padding"),
    (np.zeros((2, 4), np.int32), dict(attention_mask=[[1, 2, 0, 0], [1, 1, 1, 1]]), "only 0 and 1, found 2"),
    (np.zeros((2, 4), np.int32), dict(attention_mask=np.ones((2, 3), int)), r"shape \(2, 4\)"),
    (np.zeros((2, 4), np.int32), dict(lengths=[1, 1], attention_mask=np.ones((2, 4), int)), "not both"),
    ([[1, 2], [3]], dict(lengths=[2, 1]), "array prompts"),
    (np.array([[1, 70, 0, 0]]), dict(lengths=[2]), r"token id 70 \(at \[0, 1\]\)"),
])
def test_bad_arrays_raise_before_compiling(prompts, kw, match):
  model = tiny_model(0)
  before = compile_count()
  with pytest.raises(ValueError, match=match):
    md.generate(model, prompts, max_new_tokens=4, **kw)
  assert compile_count() == before


def test_padding_ids_outside_the_vocab_are_ignored():
  model = tiny_model(0)
  prompts = random_prompts([3, 6], 64, seed=5)
  ids, mask = _padded(prompts, pad=-100)                  # HF's ignore index as padding
  ref = md.generate(model, prompts, max_new_tokens=3).tokens
  assert md.generate(model, ids, attention_mask=mask, max_new_tokens=3).tokens == ref
