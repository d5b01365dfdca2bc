"""Structured output inside the speculative loop (row_features/constraint.py), against independent references.

  * greedy: every request of a mixed batch (JSON schemas, regexes, choice lists, an unconstrained one; slots
    refilled as rows finish) with each draft (none, a StreamingLLM chain and tree, prompt lookup, a model
    draft) equals a plain autoregressive loop written here: numpy argmax of float64 full-forward logits
    masked by the automaton walked in Python; that reference's outputs are themselves checked with
    `jsonschema` / `re.fullmatch`;
  * sampled rows next to greedy ones, chains and a tree: every output validates;
  * sampling: the first two tokens under speculation (rejection and invariant) match a float64 reference of
    the masked, tempered (and nucleus-cut) distribution (chi-square);
  * a constraint forcing a long literal: every drafted token accepted (chains and prompt lookup), each
    forced token's log-probability 0 (the constrained distribution is one-hot there);
  * a run without constraints compiles without the feature.
Tiny random models over the byte tokenizer; the SmolLM2 check is marked slow.
"""
from __future__ import annotations

import functools
import json
import re

import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from scipy import stats

from magicdec_jax import constraints as C
from magicdec_jax import checkpoints, drafts, row_features
from magicdec_jax.generation import generate
from magicdec_jax.model import full_forward
from magicdec_jax.options import RequestOptions
from magicdec_jax.settings import decode_settings
from magicdec_jax.request import Request, with_features
from magicdec_jax.stream import generate_stream
from magicdec_jax.testing import random_tiny_model
from magicdec_jax.trees import Tree

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                           "ok": {"type": "boolean"},
                                           "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "ok", "tag"]}
POINT = {"type": "object", "properties": {"x": {"type": "string", "pattern": "[0-9]{1,2}"},
                                          "kind": {"const": "point"}}, "required": ["x", "kind"]}
EMAIL = r"[a-z]{1,5}@[0-9]{2}\.(com|org)"
ANSWER = r"(yes|no), [0-9]{1,3}"
CHOICES = ["alpha", "beta", "gamma delta"]
REQUESTS = [("json_schema", PERSON, "{"), ("regex", EMAIL, "mail: "), ("choices", CHOICES, "pick one"),
            ("json_schema", POINT, "a point"), ("regex", ANSWER, "answer?"), (None, None, "free text here")]
MAX_NEW = 48
PAD = 128          # the reference's forward is padded to this length: one compile for every step


@functools.lru_cache(maxsize=None)
def model():
  return random_tiny_model(0)


def automaton(kind, value):
  m = model()
  vocab = C.token_vocabulary(m.tokenizer, m.config.eos_token_ids, m.config.vocab_size)
  return C.compile_constraint(C.make_constraint(**{kind: value}), vocab)


def logits64(ids: list[int]) -> np.ndarray:
  """float64 logits of the token after `ids` from a plain full forward (causal: right padding is inert)."""
  m = model()
  tokens = np.zeros((1, PAD), np.int32)
  tokens[0, :len(ids)] = ids
  return np.asarray(full_forward(m.params, m.config, jnp.asarray(tokens))[0, len(ids) - 1], np.float64)


def allowed(aut, state: int) -> np.ndarray:
  return aut.next_state[state][aut.token_class] >= 0


def reference_greedy(prompt: str, kind, value) -> tuple[list[int], str]:
  """Plain constrained greedy decoding: argmax of the masked logits, the automaton walked token by token."""
  m = model()
  eos = set(m.config.eos_token_ids)
  seq = list(m.tokenizer.encode(prompt).ids)
  aut = None if kind is None else automaton(kind, value)
  state, out = 0, []
  while len(out) < MAX_NEW:
    x = logits64(seq)
    if aut is not None:
      x[~allowed(aut, state)] = -np.inf
    t = int(np.argmax(x))
    out.append(t)
    if t in eos:
      return out, "eos"
    if aut is not None:
      state = int(aut.next_state[state, aut.token_class[t]])
      if aut.done[state]:
        return out, "stop"
    seq.append(t)
  return out, "length"


def check_valid(kind, value, tokens: list[int]) -> None:
  """The output (its stop id dropped) parses and validates / fully matches, by the standard libraries."""
  m = model()
  body = tokens[:-1] if tokens and tokens[-1] in m.config.eos_token_ids else tokens
  text = m.tokenizer.decode(body)
  if kind == "json_schema":
    jsonschema.validate(json.loads(text), value)
  elif kind == "regex":
    assert re.fullmatch(value, text), (value, text)
  elif kind == "choices":
    assert text in value, (value, text)


@functools.lru_cache(maxsize=None)
def references():
  out = [reference_greedy(p, k, v) for k, v, p in REQUESTS]
  for (k, v, _), (toks, reason) in zip(REQUESTS, out):
    if k is not None:
      assert reason in ("stop", "eos"), (k, reason)
      check_valid(k, v, toks)
  return out


def requests(**own) -> list[Request]:
  return [Request(p, **({k: v} if k else {}), **own) for k, v, p in REQUESTS]


DRAFTS = {
    "plain": dict(),
    "streaming-chain": dict(draft=drafts.StreamingDraft(1, 4), gamma=3),
    "streaming-tree": dict(draft=drafts.StreamingDraft(1, 4), tree=Tree((-1, 0, 0, 1, 1, 2, 3))),
    "lookup": dict(draft=drafts.PromptLookupDraft(), gamma=2),
    "model-draft": dict(draft=drafts.ModelDraft(random_tiny_model(1), 1, 8), gamma=2),
}


@pytest.mark.parametrize("name", sorted(DRAFTS))
def test_greedy_with_each_draft_equals_constrained_plain_decoding(name):
  res = sorted(generate_stream(model(), requests(), batch_size=3, max_new_tokens=MAX_NEW, **DRAFTS[name]),
               key=lambda r: r.index)
  for r, (k, v, _), (toks, reason) in zip(res, REQUESTS, references()):
    assert r.tokens == toks, (name, k, r.text)
    assert r.finish_reason == reason
    if k is not None:
      check_valid(k, v, r.tokens)


@pytest.mark.parametrize("name", ["streaming-chain", "streaming-tree"])
def test_sampled_and_greedy_rows_all_validate(name):
  reqs = requests() + requests(temperature=0.8) + requests(temperature=1.0, top_p=0.95)
  res = list(generate_stream(model(), reqs, batch_size=4, max_new_tokens=2 * MAX_NEW, seed=3, **DRAFTS[name]))
  assert len(res) == len(reqs)
  for r in res:
    k, v, _ = REQUESTS[r.index % len(REQUESTS)]
    if k is not None:
      assert r.finish_reason in ("stop", "eos"), (k, r.text)
      check_valid(k, v, r.tokens)
  greedy = sorted((r for r in res if r.index < len(REQUESTS)), key=lambda r: r.index)
  assert [r.tokens[:MAX_NEW] for r in greedy] == [t for t, _ in references()]


def masked_probs(x: np.ndarray, ok: np.ndarray, temperature: float, top_p: float = 1.0) -> np.ndarray:
  """float64 distribution: mask, temperature, then the nucleus (tokens whose strictly-greater mass < top_p)."""
  z = np.where(ok, x / temperature, -np.inf)
  p = np.exp(z - z.max())
  p /= p.sum()
  if top_p < 1.0:
    above = np.array([p[p > q].sum() for q in p])
    p = np.where(above < top_p, p, 0.0)
    p /= p.sum()
  return p


# Samples are drawn CHUNK rows at a time: a row's samples depend only on (seed, stream id), so calls of one
# compiled batch give independent draws, and a batch of 768 rows compiles for minutes (fixed-shape numerics
# split token-wise work into row ranges) where 128 rows compile in seconds.
CHUNK = 128


@pytest.mark.parametrize("mode,draft,top_p", [("rejection", "streaming-chain", 1.0),
                                              ("rejection", "streaming-tree", 0.95),
                                              ("invariant", "streaming-chain", 1.0)])
def test_constrained_sampling_matches_the_masked_distribution(mode, draft, top_p):
  regex, n, t = r"[a-d][a-h]", 768, 0.8
  prompt = "sample two letters"
  pairs = []
  for k in range(0, n, CHUNK):          # n independent streams in calls of one compiled batch
    res = generate(model(), [prompt] * CHUNK, max_new_tokens=4, regex=regex, temperature=t, top_p=top_p,
                   sampling=mode, seed=11, stream_ids=range(k, k + CHUNK), **DRAFTS[draft])
    assert set(res.finish_reasons) == {"stop"}
    pairs += [tuple(toks) for toks in res.tokens]
  aut = automaton("regex", regex)
  ids = list(model().tokenizer.encode(prompt).ids)
  p1 = masked_probs(logits64(ids), allowed(aut, 0), t, top_p)
  expected = {}
  for a in np.flatnonzero(p1):
    s = int(aut.next_state[0, aut.token_class[a]])
    p2 = masked_probs(logits64(ids + [int(a)]), allowed(aut, s), t, top_p)
    for b in np.flatnonzero(p2):
      expected[(int(a), int(b))] = p1[a] * p2[b]
  assert set(pairs) <= set(expected)
  cells = sorted(expected)
  exp = np.asarray([expected[c] for c in cells]) * n
  obs = np.asarray([pairs.count(c) for c in cells], np.float64)
  big = exp >= 5                        # pool the rare cells into one
  obs_g, exp_g = np.append(obs[big], obs[~big].sum()), np.append(exp[big], exp[~big].sum())
  keep = exp_g > 0
  assert stats.chisquare(obs_g[keep], exp_g[keep]).pvalue > 1e-3


LITERAL = "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("draft", [drafts.StreamingDraft(1, 4), drafts.PromptLookupDraft()])
def test_forced_literal_runs_are_accepted_whole(draft):
  res = generate(model(), ["x", "a longer prompt"], max_new_tokens=64, regex=re.escape(LITERAL), draft=draft,
                 gamma=3, logprobs=True)
  assert res.texts == [LITERAL] * 2 and res.finish_reasons == ["stop"] * 2
  for r in res.row_stats:        # every drafted token accepted: ceil(len / (gamma + 1)) rounds
    assert r["accepted_tokens"] == r["drafted_tokens"] and r["verify_steps"] == -(-len(LITERAL) // 4)
  assert np.allclose(np.asarray(res.logprobs), 0.0, atol=1e-6)      # one allowed token: probability 1


def test_logprobs_are_the_constrained_distributions():
  res = generate(model(), ["mail: "], max_new_tokens=MAX_NEW, regex=EMAIL, logprobs=True,
                 draft=drafts.StreamingDraft(1, 4), gamma=2)
  aut = automaton("regex", EMAIL)
  seq, state = list(model().tokenizer.encode("mail: ").ids), 0
  for tok, lp in zip(res.tokens[0], res.logprobs[0]):
    x = np.where(allowed(aut, state), logits64(seq), -np.inf)
    ref = x[tok] - x.max() - np.log(np.exp(x - x.max()).sum())
    assert abs(lp - ref) < 1e-4
    state = int(aut.next_state[state, aut.token_class[tok]])
    seq.append(tok)


def test_without_a_constraint_the_feature_is_not_compiled_in():
  st = decode_settings(None, max_new_tokens=8)
  assert "constraint" not in with_features(st, [RequestOptions(), RequestOptions(temperature=0.5)],
                                           model()).row_features
  assert "constraint" in with_features(st, [RequestOptions(regex="a+")], model()).row_features
  assert row_features.enabled(st) == ()


@pytest.mark.slow
def test_smollm2_json_schema_greedy_with_a_draft_equals_plain():
  m = checkpoints.load_model("smollm2-135m")
  schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                             "year": {"type": "integer"}}, "required": ["city", "year"]}
  prompt = "The first modern Olympic Games were held in Athens in 1896. As JSON: "
  plain = generate(m, [prompt], max_new_tokens=48, json_schema=schema)
  spec = generate(m, [prompt], max_new_tokens=48, json_schema=schema, draft=drafts.StreamingDraft(4, 16), gamma=2)
  assert plain.tokens == spec.tokens and plain.finish_reasons == ["stop"]
  jsonschema.validate(json.loads(plain.texts[0]), schema)
