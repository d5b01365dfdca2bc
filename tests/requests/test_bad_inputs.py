"""Bad arguments to `generate` raise a ValueError naming the offending value, before anything compiles.

`loop.prefill` / `loop.decode` are replaced by functions that fail the test if called, and the jit caches
must not grow: validation happens on the host, ahead of tracing.
"""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from magicdec_jax import datagen, loop, prefilled
from magicdec_jax.drafts import ModelDraft, PromptLookupDraft, SnapKVDraft, StreamingDraft, truncate_layers
from magicdec_jax.generation import generate, logits, prompt_logprobs
from magicdec_jax.settings import DecodeSettings
from magicdec_jax.request import Request
from magicdec_jax.stream import generate_stream
from magicdec_jax.trees import Tree

from conftest import compile_count, tiny_model

PROMPT = list(range(10))


@pytest.fixture
def model():
  return tiny_model(0)


@pytest.fixture(autouse=True)
def no_compile(monkeypatch):
  def boom(*a, **k):
    raise AssertionError("the engine reached compiled code with invalid inputs")
  before = compile_count()
  monkeypatch.setattr(loop, "prefill", boom)
  monkeypatch.setattr(loop, "decode", boom)
  yield
  monkeypatch.undo()
  assert compile_count() == before


def raises(*fragments):
  """pytest.raises(ValueError) whose message contains every fragment (e.g. the bad value itself)."""
  return pytest.raises(ValueError, match="".join(f"(?=.*{re.escape(str(f))})" for f in fragments))


def test_empty_prompt(model):
  with raises("prompt 1", "empty"):
    generate(model, [PROMPT, []], max_new_tokens=4)


@pytest.mark.parametrize("prompts", [[], (), "", None])
def test_empty_or_malformed_prompt_list(model, prompts):
  with raises("non-empty"):
    generate(model, prompts, max_new_tokens=4)


def test_a_prompt_neither_text_nor_ids(model):
  with raises("prompt 1", "None"):
    generate(model, [PROMPT, None], max_new_tokens=4)
  with raises("prompt 0", "'x'"):
    generate(model, [[1, "x"]], max_new_tokens=4)
  for bad, shown in ((1.9, "1.9 (float)"), (True, "True (bool)"), ("1", "'1' (str)")):   # (they were int()-ed)
    with raises("prompt 1: token ids must be integers", shown):
      generate(model, [PROMPT, [1, bad]], max_new_tokens=4)
    with raises("prompt 0: token ids must be integers", shown):
      logits(model, [[2, bad]])
  with raises("prompt 0 must be a string or a list of token ids", "array"):
    generate(model, [np.array([1.0, 2.0])], max_new_tokens=4)
  ids = [np.int64(3), jax.numpy.int32(4), np.array(5)]      # numpy / jax integer scalars are ids
  assert logits(model, [ids]).shape == (1, 3, 64)


def test_progress_is_a_bool_or_none(model):
  for bad in ("no", 2):
    with raises("progress must be True, False or None", repr(bad)):
      generate(model, [PROMPT], max_new_tokens=4, progress=bad)


def test_one_string_is_not_a_stream_of_requests(model):
  with raises("requests must be an iterable", "'hello'", "[prompt]"):
    generate_stream(model, "hello", max_new_tokens=4)


def test_prompt_plus_new_tokens_over_context(model):
  ctx = model.config.max_position_embeddings
  with raises(ctx - 5, "max_new_tokens=6", ctx):
    generate(model, [PROMPT, [7] * (ctx - 5)], max_new_tokens=6)


@pytest.mark.parametrize("bad", [-1, 64, 10**6])
def test_token_outside_vocabulary(model, bad):
  with raises(bad, "[0, 64)"):
    generate(model, [PROMPT, [1, bad, 2]], max_new_tokens=4)


@pytest.mark.parametrize("temperature", [-0.5, float("nan")])
def test_bad_temperature(model, temperature):
  with raises("temperature", temperature):
    generate(model, [PROMPT], max_new_tokens=4, temperature=temperature)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_bad_top_p(model, top_p):
  with raises("top_p", top_p):
    generate(model, [PROMPT], max_new_tokens=4, temperature=1.0, top_p=top_p)


@pytest.mark.parametrize("name,value,words", [
    ("temperature", "hot", "a finite number"), ("temperature", True, "a finite number"),
    ("temperature", float("inf"), "in [1e-30, 1e+30] or 0 (greedy)"), ("temperature", 1e-40, "1e-30"),
    ("top_k", 2.5, "an integer"),
    ("seed", -1, "[0, 2**32)"), ("seed", 2**32, "[0, 2**32)"), ("top_p", "0.9", "a number")])
def test_sampling_values_of_the_wrong_type_or_range(model, name, value, words):
  """Not converted or wrapped silently (2.5 was top_k 2, -1 seed 2**32 - 1): refused, naming the field."""
  with raises(name, repr(value), words):
    generate(model, [PROMPT], max_new_tokens=4, **{name: value})


@pytest.mark.parametrize("name", ["num_samples", "batch_size", "refill_at"])
def test_datagen_counts(model, tmp_path, name):
  with raises(name, "integer >= 1", "got 0"):
    datagen.run(model, str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), max_new_tokens=4, **{name: 0})


def test_bad_top_k(model):
  with raises("top_k", -1):
    generate(model, [PROMPT], max_new_tokens=4, temperature=1.0, top_k=-1)


@pytest.mark.parametrize("gamma", [0, -2])
def test_bad_gamma(model, gamma):
  with raises("gamma", gamma):
    generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(1, 4), gamma=gamma)


@pytest.mark.parametrize("make", [
    lambda m: StreamingDraft(sink=1, window=0),
    lambda m: SnapKVDraft(budget=2, window=0),
    lambda m: ModelDraft(m, sink=1, window=0),
], ids=["streaming", "snapkv", "model"])
def test_bad_window(model, make):
  with raises("window", 0):
    generate(model, [PROMPT], max_new_tokens=4, draft=make(model))


@pytest.mark.parametrize("make", [
    lambda m: StreamingDraft(sink=-1, window=4),
    lambda m: ModelDraft(m, sink=-1, window=4),
], ids=["streaming", "model"])
def test_bad_sink(model, make):
  with raises("sink", -1):
    generate(model, [PROMPT], max_new_tokens=4, draft=make(model))


def test_draft_vocabulary_mismatch(model):
  other = tiny_model(1, vocab=32)
  with raises("vocabulary", 32, 64):
    generate(model, [PROMPT], max_new_tokens=4, draft=ModelDraft(other, sink=1, window=4))


def test_a_draft_with_another_tokenizer_of_the_same_size_is_refused():
  """Vocabularies of one size with two tokens' ids swapped: the draft's proposals would mean other tokens."""
  import dataclasses
  import json
  from tokenizers import Tokenizer
  from magicdec_jax import testing
  target = testing.random_tiny_model(0)
  spec = json.loads(target.tokenizer.to_str())
  vocab = spec["model"]["vocab"]
  a, b = sorted(vocab, key=vocab.get)[97:99]            # the byte tokens of ids 97 and 98
  vocab[a], vocab[b] = vocab[b], vocab[a]
  other = dataclasses.replace(testing.random_tiny_model(1), tokenizer=Tokenizer.from_str(json.dumps(spec)))
  with raises("the draft's tokenizer is not the target's", f"token {a!r} is id 98 in the draft's, 97 in the target's"):
    generate(target, [PROMPT], max_new_tokens=4, draft=ModelDraft(other, sink=1, window=4))
  same = dataclasses.replace(testing.random_tiny_model(1), tokenizer=testing.byte_tokenizer())   # equal, not the same object
  ModelDraft(same, sink=1, window=4).check_compatible(target)


def test_unknown_settings_and_top_logprobs_beyond_the_vocabulary(model):
  with raises("unknown decoding setting(s) 'stop'", "Request"):
    generate(model, [PROMPT], max_new_tokens=4, stop=["x"])
  with raises("unknown decoding setting(s) 'stop', 'temp'"):
    generate_stream(model, [PROMPT], max_new_tokens=4, stop=["x"], temp=1.0)
  with raises("top_logprobs=17", "vocabulary of 16"):
    generate(tiny_model(0, vocab=16), [PROMPT], max_new_tokens=4, logprobs=True, top_logprobs=17)


def test_a_listed_stream_checks_every_request_before_compiling(model):
  limit = model.config.max_position_embeddings
  with raises("request 2:", f"{limit - 2} prompt tokens + max_new_tokens=4 exceed"):
    generate_stream(model, [PROMPT, PROMPT, [1] * (limit - 2)], max_new_tokens=4)
  with raises("request 1: max_new_tokens must be an integer in [1, 4]", "got 9"):
    generate_stream(model, [PROMPT, Request(PROMPT, max_new_tokens=9)], max_new_tokens=4)


def test_trees_schedules_and_draft_sizes_of_the_wrong_kind(model, tmp_path):
  """Values that read as numbers but are not integers are refused, not truncated; a draft cache larger than
  the context and a tree node wider than the vocabulary are refused before tracing."""
  for bad in ((-1, 0.7), (-1, False), (-1, "0")):
    with raises("Tree parents must be a sequence of ints"):
      Tree(bad)
  with raises("tree JSON must be"):
    Tree.from_json('{"parents": 5}')
  with raises("gamma must be an integer >= 0, got 2.0"):
    Tree.chain(2.0)
  with raises("max_ngram must be an integer in [1, 64], got True"):
    PromptLookupDraft(max_ngram=True)
  for n in (65, 10 ** 30):             # (the match unrolls over lengths: its compile grows as n squared)
    with raises(f"max_ngram must be an integer in [1, 64], got {n}"):
      PromptLookupDraft(max_ngram=n, min_ngram=n)
  with raises("pool_kernel must be an integer in [1, 1023], got 1000000000000000000000000000001"):
    SnapKVDraft(pool_kernel=10 ** 30 + 1)
  for gamma in (65, 10 ** 9):          # (a chain of 10**9 was built, node by node, before any check)
    with raises(f"gamma must be an integer in [1, 64] or 'auto', got {gamma}"):
      generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(1, 4), gamma=gamma)
  assert truncate_layers(model, np.int64(1)).config.num_layers == 1
  for schedule in ([(0, 2.7)], [(0.5, 2)], [(0, True)]):
    with raises("schedule must be a list of (from_context, gamma) integer pairs"):
      generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(1, 4), schedule=schedule)
  with raises("cache of 1048580 slots is larger than the model's context of 512"):
    generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(4, 1 << 20))
  with raises("a node of 70 children, more than the vocabulary's 64 tokens"):
    generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(1, 4), tree=Tree((-1,) + (0,) * 70))


def test_snapkv_budget_larger_than_prompt(model):
  with raises("budget=16", "10 tokens"):
    generate(model, [PROMPT + PROMPT, PROMPT], max_new_tokens=4, draft=SnapKVDraft(budget=16, window=4))


def test_text_prompt_without_tokenizer(model):
  with raises("tokenizer", "prompt 0"):
    generate(model, ["hello world"], max_new_tokens=4)


@pytest.mark.parametrize("max_new", [0, -3, 2.5])
def test_bad_max_new_tokens(model, max_new):
  with raises("max_new_tokens", max_new):
    generate(model, [PROMPT], max_new_tokens=max_new)


def test_stream_ids_length_mismatch(model):
  with raises("stream_ids", "3 entries", "2 prompts"):
    generate(model, [PROMPT, PROMPT], max_new_tokens=4, stream_ids=[0, 1, 2])


def test_unknown_draft_and_tree(model):
  with raises("draft", "object"):
    generate(model, [PROMPT], max_new_tokens=4, draft=object())
  with raises("tree", "(3, 2)"):
    generate(model, [PROMPT], max_new_tokens=4, draft=StreamingDraft(1, 4), tree=(3, 2))


@pytest.mark.parametrize("ids", [[-1, 0], [2**33, 0], [1.7, 0.2], ["a", "b"], 3])
def test_bad_stream_ids(model, ids):
  with raises("stream_ids", "[0, 2**32)"):
    generate(model, [PROMPT, PROMPT], max_new_tokens=4, temperature=1.0, stream_ids=ids)


@pytest.mark.parametrize("eos", [-1, 10**6, 2**40, "abc", 2.5, True, [2.9], [3, -1]])
def test_bad_eos_token_id(model, eos):
  """Not truncated or wrapped, and not an id no row can draw (which would never stop one)."""
  with raises("eos_token_id", "[0, 64)"):
    generate(model, [PROMPT], max_new_tokens=4, eos_token_id=eos)


def test_draft_arguments_of_the_wrong_kind(model):
  with raises("ModelDraft needs a Model", "'smollm2-135m'"):
    ModelDraft("smollm2-135m")
  for field in ("budget", "observation_window"):
    with raises(f"SnapKVDraft {field}", "integer >= 1", "1.5"):
      SnapKVDraft(**{field: 1.5})
  with raises("truncate_layers", "1.5"):
    truncate_layers(model, 1.5)


@pytest.mark.parametrize("kw,words", [
    (dict(prefill_batch=0), "prefill_batch must be an integer >= 1, got 0"),
    (dict(max_prompt_tokens=0), "max_prompt_tokens must be an integer >= 1, got 0"),
    (dict(batch_size=True), "batch_size must be an integer >= 1, got True"),
    (dict(decode_plan="x"), "decode_plan must be a plan.DecodePlan")])
def test_bad_stream_arguments(model, kw, words):
  with raises(words):
    generate_stream(model, [PROMPT], **({} if "decode_plan" in kw else dict(max_new_tokens=4)), **kw)


@pytest.mark.parametrize("kw,words", [
    (dict(tree="auto"), "needs a draft"),
    (dict(gamma=5), "gamma=5 needs a draft"),
    (dict(gamma="auto", hardware="cpu"), "gamma='auto' needs a draft"),
    (dict(draft=StreamingDraft(1, 4), tree="auto", gamma=5), "gamma=5 and tree='auto'"),
    (dict(draft=StreamingDraft(1, 4), tree=Tree.chain(2), gamma=3), "gamma=3 and tree=Tree"),
    (dict(draft=StreamingDraft(1, 4), schedule=[(0, 1), (8, 2)], gamma=2), "gamma=2 and a schedule"),
    (dict(draft=StreamingDraft(1, 4), schedule=[(0, 1)], gamma="auto", acceptance=[0.5]),
     "acceptance= prices gamma='auto'; a forced schedule is not priced"),
    (dict(draft=StreamingDraft(1, 4), gamma=2, hardware="cpu"), "hardware= is read by gamma='auto'"),
    (dict(draft=StreamingDraft(1, 4), gamma=2, acceptance=[0.5]), "acceptance= is read by gamma='auto'"),
    (dict(draft=StreamingDraft(1, 4), gamma="auto", acceptance="/nonexistent.json"), "/nonexistent.json")])
def test_settings_that_would_do_nothing_or_fail_late(model, kw, words):
  """A setting the run would not read is refused by name, not ignored; a missing file is a ValueError."""
  with raises(words):
    generate(model, [PROMPT], max_new_tokens=4, **kw)


def test_a_gamma_not_given_fingerprints_as_the_chain_it_stands_for():
  """So a data set written when gamma's default was 3 resumes; beside a tree or a schedule it is not read."""
  d = StreamingDraft(1, 4)
  assert DecodeSettings(max_new_tokens=4, draft=d).fingerprint() == \
      DecodeSettings(max_new_tokens=4, draft=d, gamma=3).fingerprint()
  DecodeSettings(max_new_tokens=4, draft=StreamingDraft(1, 4), tree=Tree.chain(2))
  DecodeSettings(max_new_tokens=4, draft=StreamingDraft(1, 4), gamma="auto", schedule=[(0, 1)])


def test_attention_implementations_this_backend_cannot_run(model):
  for impl, words in (("pallas_mosaic", "no Mosaic GPU kernel"), ("pallas_triton", "needs a GPU")):
    if impl == "pallas_triton" and jax.default_backend() == "gpu":
      continue
    with raises(f"attention_impl='{impl}'", words):
      generate(model, [PROMPT], max_new_tokens=4, attention_impl=impl, numerics="fast")


def test_tree_auto_with_a_chain_only_draft_is_refused_before_planning(model):
  with raises("PromptLookupDraft proposes one continuation", "tree='auto'"):
    generate(model, [PROMPT], max_new_tokens=4, draft=PromptLookupDraft(), tree="auto")


def test_prefill_and_logits_arguments(model):
  for kw, *words in ((dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1, got 0"),
                     (dict(max_new_tokens=4.5), "got 4.5"), (dict(max_new_tokens=4, chunk=True), "chunk"),
                     (dict(max_new_tokens=4, max_tree_nodes=0), "max_tree_nodes"),
                     (dict(max_new_tokens=4, attention_impl="flash"), "'flash'"),
                     (dict(max_new_tokens=4, numerics="exact"), "numerics must be one of", "'exact'")):
    with raises(*words):
      prefilled.prefill(model, [PROMPT], **kw)
  ctx = model.config.max_position_embeddings
  for fn in (logits, prompt_logprobs):
    with raises("prompt 0", ctx + 1, ctx):
      fn(model, [[1] * (ctx + 1)])
