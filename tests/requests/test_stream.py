"""Continuous batching (`generate_stream`): a sample's tokens never depend on how it was batched.

Each (request, sample) is compared with the same stream decoded statically by `generate` (and, greedy, with a
plain full-forward argmax loop): under other batch sizes, refill thresholds (refill_at = batch is static
batching inside the stream), n samples per prompt, for autoregressive decoding, chains and trees with every
draft kind. Also: a row that stops on its first token, a prompt at the context limit, fewer prompts than
slots, more samples than slots, a lazily consumed iterator whose prompts outgrow the cache, bad inputs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import trees
from magicdec_jax.generation import generate
from magicdec_jax.request import Request
from magicdec_jax.stream import generate_stream

from conftest import random_prompts, tiny_model, xla_flags
from references import reference_greedy

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW = 12
LENGTHS = (5, 9, 3, 12, 7, 14, 4, 6, 11, 8)


@pytest.fixture(scope="module")
def model():
  return tiny_model(0, attn_scale=10.0)


@pytest.fixture(scope="module")
def prompts():
  return random_prompts(LENGTHS, 64, seed=1)


def _eos(model, prompts):
  """A stop id that some rows emit mid-run (ragged lengths: refills really happen)."""
  ref = generate(model, prompts, max_new_tokens=NEW).tokens
  counts = np.bincount([t for row in ref for t in row[2:]], minlength=64)
  return int(counts.argmax())


def _by_key(results):
  return {(r.index, r.sample): r for r in results}


CASES = {
    "ar-greedy": dict(),
    "ar-sampling": dict(temperature=0.9, top_k=20),
    "chain-streaming": dict(draft=md.StreamingDraft(sink=2, window=4), gamma=3, temperature=0.9),
    "tree-streaming-greedy": dict(draft=md.StreamingDraft(sink=2, window=4), tree=trees.Tree((-1, 0, 0, 1))),
    "tree-model-draft": dict(draft=md.ModelDraft(tiny_model(5, layers=1), sink=2, window=4),
                             tree=trees.Tree((-1, 0, 0, 1)), temperature=0.8),
}
SLOW_CASES = ("chain-streaming", "tree-model-draft")   # default: AR, and a streaming tree (chains: the mesh test)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in CASES])
def test_same_tokens_under_any_batching(model, prompts, case):
  kw = dict(CASES[case], max_new_tokens=NEW, eos_token_id=_eos(model, prompts), seed=3)
  static = generate(model, prompts, **kw)
  assert any(len(t) < NEW for t in static.tokens) and any(len(t) == NEW for t in static.tokens)
  for batch, refill in ((3, 1), (4, 2), (4, 4)):
    got = _by_key(generate_stream(model, prompts, batch_size=batch, refill_at=refill, **kw))
    assert sorted(got) == [(i, 0) for i in range(len(prompts))]
    for i in range(len(prompts)):
      assert got[i, 0].tokens == static.tokens[i], (case, batch, refill, i)
      assert got[i, 0].finish_reason == static.finish_reasons[i]
      assert got[i, 0].stats["verify_steps"] == static.row_stats[i]["verify_steps"]
  # n samples of one prompt: sample s of request i is stream i * n + s, alone in a static batch
  two = _by_key(generate_stream(model, prompts[:3], batch_size=4, num_samples=2, **kw))
  for (i, s), r in two.items():
    assert r.stream_id == 2 * i + s
    assert r.tokens == generate(model, [prompts[i]], stream_ids=[2 * i + s], **kw).tokens[0]
  if "temperature" in CASES[case]:
    assert two[0, 0].tokens != two[0, 1].tokens          # samples really differ


def test_snapkv_draft_same_tokens(model):
  prompts = random_prompts((40, 33, 45, 36, 38), 64, seed=2)
  kw = dict(max_new_tokens=NEW, draft=md.SnapKVDraft(budget=8, window=8, observation_window=4), gamma=2,
            temperature=0.9, seed=1)
  static = generate(model, prompts, **kw)
  got = _by_key(generate_stream(model, prompts, batch_size=2, refill_at=1, **kw))
  assert [got[i, 0].tokens for i in range(len(prompts))] == static.tokens


def test_greedy_equals_full_forward_argmax(model, prompts):
  ref = reference_greedy(model, prompts, NEW)
  got = _by_key(generate_stream(model, prompts, max_new_tokens=NEW, batch_size=3,
                                draft=md.StreamingDraft(sink=2, window=4), gamma=2))
  assert [got[i, 0].tokens for i in range(len(prompts))] == ref


def test_eos_on_first_token_frees_the_slot(model, prompts):
  ref = reference_greedy(model, prompts, NEW)
  eos = ref[2][0]
  got = _by_key(generate_stream(model, prompts, max_new_tokens=NEW, batch_size=2, eos_token_id=eos))
  assert got[2, 0].tokens == [eos] and got[2, 0].finish_reason == "eos"
  assert got[2, 0].stats["verify_steps"] == 1
  for i, row in enumerate(ref):
    want = row[:row.index(eos) + 1] if eos in row else row
    assert got[i, 0].tokens == want


def test_stop_ids_on_a_model_without_a_tokenizer(model, prompts):
  """Token-id prompts and stop ids need no tokenizer: the row ends at the id (kept), its text None (it
  crashed decoding the cut)."""
  ref = reference_greedy(model, prompts[:2], NEW)
  stop = ref[0][3]
  got = _by_key(generate_stream(model, [Request(p, stop_token_ids=[stop]) for p in prompts[:2]],
                                max_new_tokens=NEW, batch_size=2, eos_token_id=[]))
  for i, row in enumerate(ref):
    want = row[:row.index(stop) + 1] if stop in row else row
    assert got[i, 0].tokens == want and got[i, 0].text is None
  assert got[0, 0].finish_reason == "stop"


def test_prompt_at_context_limit_and_fewer_prompts_than_slots(model):
  limit = model.config.max_position_embeddings
  prompts = random_prompts((limit - NEW, 6), 64, seed=4)
  ref = reference_greedy(model, prompts, NEW)
  g = generate_stream(model, prompts, max_new_tokens=NEW, batch_size=8, draft=md.StreamingDraft(sink=2, window=8),
                      gamma=3)
  got = _by_key(g)
  assert [got[i, 0].tokens for i in range(2)] == ref
  assert g.stats["records"] == 2 and 0 < g.stats["slot_utilization"] <= 2 / 8
  with pytest.raises(ValueError, match="request 0: 501 prompt tokens"):
    list(generate_stream(model, [[1] * (limit - NEW + 1)], max_new_tokens=NEW))


def test_a_bad_request_of_a_lazy_stream_raises_after_the_ones_before_it(model, prompts):
  """A request's own budget sizes its context check; a bad request read lazily ends the stream only
  after the requests read before it have finished (each as `generate` gives it) and been yielded."""
  limit = model.config.max_position_embeddings
  long = [3] * (limit - 4)                                  # fits its own budget of 4, not the run's NEW
  reqs = [Request(prompts[0]), Request(prompts[1]), Request(long, max_new_tokens=4)]
  got = []
  with pytest.raises(ValueError, match=f"request 3: {limit - 4} prompt tokens \\+ max_new_tokens={NEW} exceed"):
    for r in generate_stream(model, iter(reqs + [Request(long)] + reqs[:1]), max_new_tokens=NEW, batch_size=2):
      got.append(r)
  ref = reference_greedy(model, prompts[:2], NEW) + reference_greedy(model, [long], 4)
  assert sorted(r.index for r in got) == [0, 1, 2]
  assert [r.tokens for r in sorted(got, key=lambda r: r.index)] == ref


def test_an_error_the_input_raises_ends_the_stream_after_the_requests_read_before_it(model, prompts):
  """An iterable that fails itself (an OSError reading its file) is treated as a bad request: the requests
  read before the error finish (each as plain greedy decoding gives it) and are yielded, then it raises.
  The rows in flight were lost before (only ValueError was caught)."""
  def requests():
    yield from prompts[:6]
    raise OSError("disk gone")
  got = []
  with pytest.raises(OSError, match="disk gone"):
    for r in generate_stream(model, requests(), max_new_tokens=NEW, batch_size=4):
      got.append(r)
  assert [r.tokens for r in sorted(got, key=lambda r: r.index)] == reference_greedy(model, prompts[:6], NEW)


def test_stats_after_a_break_count_what_was_yielded(model, prompts):
  """Static batching harvests four rows at once; a caller who breaks after the first has one record and
  its tokens (len of what it got), not the group's four."""
  g = generate_stream(model, prompts[:4], batch_size=4, refill_at=4, max_new_tokens=NEW, eos_token_id=[])
  first = next(iter(g))
  assert g.stats["records"] == 1 and g.stats["new_tokens"] == len(first.tokens) == NEW


def test_a_stream_closed_early_frees_its_batch(model, prompts):
  """close() (or leaving a with block) drops the rows in flight and frees the batch's caches at once, as a
  generator's close() does; the stream then ends."""
  import jax
  live = lambda: sum(a.nbytes for a in jax.live_arrays())
  g = generate_stream(model, prompts[:6], batch_size=4, max_new_tokens=NEW)
  base = live()                               # (the engine's placed params: the Generator's own)
  with g:
    first = next(g)
    assert live() > base                      # the batch's state is held while the stream runs
  assert live() == base and list(g) == []
  assert first.tokens == reference_greedy(model, [prompts[first.index]], NEW)[0]


def test_more_samples_than_slots_one_prefill(model, prompts):
  kw = dict(max_new_tokens=NEW, temperature=1.0, seed=7)
  g = generate_stream(model, [Request(prompts[0], stream_ids=[11, 12, 13, 14, 15], tag="a")], batch_size=2,
                      **kw)
  got = list(g)
  assert sorted(r.stream_id for r in got) == [11, 12, 13, 14, 15] and {r.tag for r in got} == {"a"}
  assert g.stats["prefills"] == 1
  for r in got:
    assert r.tokens == generate(model, [prompts[0]], stream_ids=[r.stream_id], **kw).tokens[0]
  assert len({tuple(r.tokens) for r in got}) == 5


def test_lazy_iterator_grows_the_cache(model):
  prompts = random_prompts((4, 6, 30, 5, 70, 3), 64, seed=5)      # prompt buckets 16 -> 32 -> 128
  kw = dict(max_new_tokens=NEW, temperature=0.9, seed=2)
  static = generate(model, prompts, **kw)
  got = _by_key(generate_stream(model, iter(prompts), batch_size=2, **kw))
  assert [got[i, 0].tokens for i in range(len(prompts))] == static.tokens


def test_bad_arguments(model, prompts):
  with pytest.raises(ValueError, match="refill_at=5 is larger than batch_size=4"):
    generate_stream(model, prompts, max_new_tokens=4, batch_size=4, refill_at=5)
  with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
    generate_stream(model, prompts, max_new_tokens=4, batch_size=0)
  with pytest.raises(ValueError, match="request 1 has token id 99"):
    list(generate_stream(model, iter([[1, 2], [99]]), max_new_tokens=4))
  with pytest.raises(ValueError, match="request 0: stream_ids"):
    list(generate_stream(model, [Request([1, 2], stream_ids=[])], max_new_tokens=4))


@pytest.mark.heavy
def test_meshes_same_tokens_as_one_device():
  """generate_stream with mesh= (data:2,model:2 and data:4,model:1 on 4 CPU devices, in a subprocess: this
  process already started jax with one device) gives single-device generate's tokens; on data:2,model:2 a chain's
  and a tree's log-probabilities are plain decoding's bits."""
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=4"), JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, os.path.join(HERE, "stream_mesh_worker.py")], env=env, capture_output=True,
                     text=True, cwd=os.path.dirname(HERE), timeout=600)
  lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
  assert r.returncode == 0 and lines, r.stderr[-4000:]
  out = json.loads(lines[-1][len("RESULT "):])
  assert out.pop("devices") == 4 and out.pop("bitwise") == {"ar": True, "chain": True, "tree": True} and len(out) == 6
  for case, facts in out.items():
    assert all(facts["equal"]), (case, facts)
    assert 0 < facts["utilization"] <= 1
