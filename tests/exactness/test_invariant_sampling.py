"""Drafter-invariant sampling (`sampling="invariant"`): the sampled tokens are plain decoding's.

The reference is plain autoregressive decoding in the same mode (draft None): every draft, chain or tree,
batch composition, refill pattern and datagen run must reproduce its tokens exactly (meshes:
tests/planning/test_sharding.py). That plain sampler itself is checked for exactness by the chi-square cases
"autoregressive-invariant-*" of tests/exactness/test_speculative_sampling.py (joint of three tokens against float64),
and the speculative one by "chain2-model-invariant-*" there.
"""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import datagen, testing
from magicdec_jax.drafts import ModelDraft, PromptLookupDraft, SnapKVDraft, StreamingDraft, truncate_layers
from magicdec_jax.engine import stream_keys
from magicdec_jax.sampling import position_noise
from magicdec_jax.trees import Tree

from conftest import REAL_MODEL_XLA, random_prompts, tiny_model

KW = dict(max_new_tokens=16, temperature=0.9, top_p=0.95, top_k=40, seed=5, sampling="invariant")


def _model():
  return tiny_model(3, attn_scale=8.0)


def _prompts():
  return random_prompts([40, 23, 57, 31], _model().config.vocab_size, seed=9)


def _drafts(model):
  return {"streaming-chain3": (StreamingDraft(2, 8), dict(gamma=3)),
          "streaming-tree": (StreamingDraft(2, 8), dict(tree=Tree.from_children_counts([3, 2, 1]))),
          "snapkv-chain2": (SnapKVDraft(budget=4, window=4, observation_window=4), dict(gamma=2)),
          "model-tree": (ModelDraft(truncate_layers(model, 1), 2, 8), dict(tree=Tree.kary([2, 2]))),
          "lookup-chain4": (PromptLookupDraft(), dict(gamma=4))}


@pytest.mark.heavy
def test_every_draft_samples_plain_decodings_tokens():
  model, prompts = _model(), _prompts()
  ref = md.generate(model, prompts, **KW)
  eos = ref.tokens[1][5]                         # a token one row samples mid-run: rows stop apart
  ref_eos = md.generate(model, prompts, **KW, eos_token_id=eos)
  assert ref.tokens != md.generate(model, prompts, **dict(KW, seed=6)).tokens      # really sampled
  accepted = 0
  for name, (draft, extra) in _drafts(model).items():
    res = md.generate(model, prompts, draft=draft, **KW, **extra)
    assert res.tokens == ref.tokens, name
    assert md.generate(model, prompts, draft=draft, eos_token_id=eos, **KW, **extra).tokens == ref_eos.tokens, name
    accepted += sum(r["accepted_tokens"] for r in res.row_stats)
  assert accepted > 0, "some proposals must be accepted, or the accept path is not exercised"


def test_samples_do_not_depend_on_the_batch():
  """A row's tokens depend on (seed, stream id, position) only: alone, reordered, or with other rows."""
  model, prompts = _model(), _prompts()
  ref = md.generate(model, prompts, **KW).tokens
  draft = StreamingDraft(2, 8)
  for i, p in enumerate(prompts):
    assert md.generate(model, [p], stream_ids=[i], draft=draft, gamma=2, **KW).tokens == [ref[i]]
  order = [2, 0, 3, 1]
  got = md.generate(model, [prompts[i] for i in order], stream_ids=order, draft=draft, gamma=3, **KW).tokens
  assert got == [ref[i] for i in order]


def test_continuous_batching_samples_plain_decodings_tokens():
  model, prompts = _model(), _prompts()
  ref = md.generate(model, prompts, **KW).tokens
  for refill in (1, 2):
    got = sorted(md.generate_stream(model, prompts, batch_size=2, refill_at=refill, draft=StreamingDraft(2, 8),
                                    gamma=2, **KW), key=lambda r: r.index)
    assert [r.tokens for r in got] == ref


def test_temperature_zero_is_greedy():
  model, prompts = _model(), _prompts()
  greedy = md.generate(model, prompts, max_new_tokens=12).tokens
  assert md.generate(model, prompts, max_new_tokens=12, sampling="invariant").tokens == greedy
  assert md.generate(model, prompts, max_new_tokens=12, sampling="invariant", draft=StreamingDraft(2, 8),
                     gamma=2).tokens == greedy


def test_bad_mode_is_refused():
  with pytest.raises(ValueError, match="sampling must be one of"):
    md.generate(_model(), [[1, 2, 3]], max_new_tokens=2, sampling="gumbel")


def _records(path):
  with open(path) as f:
    return sorted((json.loads(line) for line in f), key=lambda r: (json.dumps(r["id"]), r["sample"]))


def test_datagen_records_do_not_depend_on_the_draft_and_resume_across_drafts(tmp_path):
  """Invariant sampling: the same records with and without a draft; an output begun without a draft is
  resumed with one (the draft is not part of what shapes the samples) and ends as the uninterrupted run."""
  model = testing.random_tiny_model(0)
  inp = tmp_path / "in.jsonl"
  inp.write_text("".join(json.dumps({"id": i, "prompt": f"prompt number {i} " * (1 + i % 3)}) + "\n"
                         for i in range(6)))
  kw = dict(max_new_tokens=10, temperature=0.9, top_p=0.95, sampling="invariant", num_samples=2,
            batch_size=3, progress=False)
  plain, spec = tmp_path / "plain.jsonl", tmp_path / "spec.jsonl"
  datagen.run(model, str(inp), str(plain), **kw)
  datagen.run(model, str(inp), str(spec), draft=StreamingDraft(2, 16), gamma=2, **kw)
  strip = lambda rs: [{k: r[k] for k in ("id", "sample", "token_ids", "finish_reason")} for r in rs]
  assert strip(_records(plain)) == strip(_records(spec))
  cut = tmp_path / "cut.jsonl"
  lines = plain.read_text().splitlines(keepends=True)
  cut.write_text("".join(lines[:5]))
  (tmp_path / "cut.jsonl.config.json").write_text((tmp_path / "plain.jsonl.config.json").read_text())
  s = datagen.run(model, str(inp), str(cut), draft=PromptLookupDraft(), gamma=3, **kw)
  assert s["records_skipped_existing"] == 5 and s["records_written"] == 7
  assert strip(_records(cut)) == strip(_records(plain))
  with pytest.raises(datagen.DatagenError, match="sampling"):     # but not under another sampler
    datagen.run(model, str(inp), str(cut), **dict(kw, sampling="rejection"))


def test_position_noise_is_fresh_per_row_and_position():
  """No noise vector is reused: distinct (stream, position) pairs give distinct, uncorrelated vectors."""
  keys = stream_keys(3, [0, 1])
  g = np.asarray(position_noise(keys, jnp.asarray([[5, 6, 7], [5, 6, 7]]), 4096)).reshape(6, 4096)
  corr = np.corrcoef(g)
  assert np.abs(corr[~np.eye(6, dtype=bool)]).max() < 0.1
  assert abs(g.mean() - np.euler_gamma) < 0.05 and abs(g.var() - np.pi ** 2 / 6) < 0.1    # standard Gumbel
  again = np.asarray(position_noise(stream_keys(3, [1]), jnp.asarray([[6]]), 4096))[0, 0]
  np.testing.assert_array_equal(again, g[4])                  # (stream 1, position 6) whatever the batch


@pytest.mark.heavy
def test_plain_invariant_sampler_against_hf_float64_at_1e5_draws():
  """The first sampled token of 106,496 streams (13 calls of 8192 rows, distinct stream ids) against the
  float64 top-p distribution of HF's logits for a random tiny LLaMA (its weights converted to ours)."""
  import torch
  from references import hf_model, ours_from_hf
  hf = hf_model(2, None, False, seed=4)
  ours = ours_from_hf(hf)
  prompt = [3, 17, 99, 4, 250, 31]
  with torch.no_grad():
    lg = hf.double()(torch.tensor([prompt])).logits[0, -1].numpy()
  t, top_p = 1.3, 0.9
  z = lg / t
  p = np.exp(z - z.max())
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  keep = np.zeros_like(p, bool)
  keep[order[(np.cumsum(p[order]) - p[order]) < top_p]] = True
  assert np.abs(np.cumsum(p[order]) - p[order] - top_p).min() > 1e-4      # not on a knife edge
  want = np.where(keep, p, 0.0) / p[keep].sum()
  assert (want > 1e-3).sum() >= 20
  counts = np.zeros(len(p), np.int64)
  for call in range(13):
    ids = list(range(call * 8192, (call + 1) * 8192))
    res = md.generate(ours, [prompt] * 8192, max_new_tokens=1, temperature=t, top_p=top_p, seed=11,
                      sampling="invariant", stream_ids=ids, eos_token_id=[], numerics="fast",
                      xla_options=REAL_MODEL_XLA)
    counts += np.bincount([r[0] for r in res.tokens], minlength=len(p))
  assert counts[want == 0].sum() == 0, "drew a token outside the top-p set"
  big = want * counts.sum() >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(want[big], want[~big].sum()) * counts.sum()
  if exp[-1] < 5:
    obs, exp = obs[:-1], exp[:-1]
  from scipy import stats
  pval = stats.chi2.sf(((obs - exp) ** 2 / exp).sum(), len(obs) - 1)
  assert pval > 1e-3, pval


@pytest.mark.heavy
def test_smollm2_self_draft_samples_plain_decodings_tokens():
  """A real vocabulary (49,152 tokens: the top-p search's per-row path; the tiny models' 64 take the
  all-rows one) and real weights: SmolLM2's first 8 layers with its final norm and tied head, a quarter of the
  30-layer loops' compile (docs/testing.md#compile-time)."""
  from magicdec_jax import checkpoints
  try:
    model = truncate_layers(checkpoints.load_model("smollm2-135m"), 8)
  except (ValueError, FileNotFoundError, ImportError) as e:
    pytest.skip(str(e))
  prompts = [model.tokenizer.encode(t).ids for t in
             ("The quick brown fox jumps over the lazy dog. " * 6, "To be, or not to be, that is the question:")]
  kw = dict(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=2, sampling="invariant", xla_options=REAL_MODEL_XLA)
  ref = md.generate(model, prompts, **kw)
  res = md.generate(model, prompts, draft=StreamingDraft(4, 32), gamma=3, **kw)
  assert res.tokens == ref.tokens
  assert res.stats["acceptance_rate"] > 0
