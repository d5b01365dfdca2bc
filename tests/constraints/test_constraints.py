"""Constraints compiled to token automata, checked against independent references: random walks decode
(through the tokenizer) to text that `jsonschema` validates / `re.fullmatch`es / is one of the choices; the
tokenizer's own encoding of valid (and invalid) texts is accepted (refused); the allowed set after a text
equals the `regex` module's partial-match verdict for every token; token bytes equal what decoding emits."""
from __future__ import annotations

import datetime
import json
import re
import uuid

import jsonschema
import numpy as np
import pytest
import regex as regex_module
from outlines_core import Index, Vocabulary
from tokenizers import Tokenizer, decoders, models

from magicdec_jax import checkpoints
from magicdec_jax.constraints import (Constraint, ConstraintError, TokenAutomaton, build_vocabulary,
                                      compile_constraint, token_vocabulary)
from magicdec_jax.constraints.automaton import clear_cache
from magicdec_jax.testing import byte_tokenizer

BYTE_EOS = 256
FOUR_FIELDS = {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                              "tags": {"type": "array", "items": {"type": "string"}},
                              "color": {"enum": ["red", "green", "blue"]}},
               "required": ["name", "age", "tags", "color"]}
NESTED = {
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                        "required": ["x", "y"]}},
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "when": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "mail": {"type": "string", "format": "email"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "short": {"type": "string", "minLength": 2, "maxLength": 4},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "flag": {"type": "boolean"},
        "kind": {"const": "fixed"},
        "pair": {"prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 3}]},
        "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "minItems": 1, "maxItems": 3},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
        "note": {"type": ["string", "null"], "maxLength": 5},
        "opt": {"type": "integer"},
    },
    "required": ["id", "when", "at", "mail", "code", "short", "maybe", "flag", "kind", "pair", "points", "extra",
                 "note"],
}


@pytest.fixture(scope="module")
def byte_vocab():
  return token_vocabulary(byte_tokenizer(), [BYTE_EOS], 264)


@pytest.fixture(scope="module")
def smol():
  model = checkpoints.load_model("smollm2-135m")
  return model.tokenizer, token_vocabulary(model.tokenizer, model.config.eos_token_ids, model.config.vocab_size)


def allowed_tokens(a: TokenAutomaton, state: int) -> np.ndarray:
  return np.flatnonzero(a.next_state[state][a.token_class] >= 0)


def distance_to_accept(a: TokenAutomaton) -> np.ndarray:
  """Fewest tokens from each state to an accepting one (the walker's way home)."""
  dist = np.where(a.accepting, 0, np.iinfo(np.int32).max).astype(np.int64)
  for _ in range(a.num_states):
    nxt = np.where(a.next_state >= 0, dist[np.maximum(a.next_state, 0)], np.iinfo(np.int32).max)
    new = np.minimum(dist, nxt.min(1) + 1)
    if np.array_equal(new, dist):
      return dist
    dist = new
  return dist


def random_walk(a: TokenAutomaton, eos: int, rng, wander: int = 60) -> list[int]:
  """Tokens drawn uniformly from the allowed ones (EOS excluded) for `wander` steps (stopping with
  probability 0.3 at accepting states), then along a shortest way to an accepting state; EOS appended."""
  dist, state, out = distance_to_accept(a), 0, []
  while True:
    options = allowed_tokens(a, state)
    options = options[options != eos]
    if a.accepting[state] and (len(out) >= wander or rng.random() < 0.3 or not len(options)):
      assert eos in allowed_tokens(a, state)
      return out + [eos]
    if len(out) >= wander:
      nd = dist[a.next_state[state, a.token_class[options]]]
      options = options[nd == nd.min()]
    t = int(rng.choice(options))
    out.append(t)
    state = int(a.next_state[state, a.token_class[t]])
    assert len(out) < 10 * wander + 200


def accepts(a: TokenAutomaton, tokens) -> bool:
  state = 0
  for t in tokens:
    state = int(a.next_state[state, a.token_class[t]])
    if state < 0:
      return False
  return bool(a.accepting[state])


def check_instance(obj, schema):
  jsonschema.validate(obj, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def check_nested_formats(obj):
  """The formats jsonschema leaves unchecked without optional packages."""
  uuid.UUID(obj["id"])
  assert datetime.date.fromisoformat(obj["when"])
  assert datetime.datetime.fromisoformat(obj["at"]).tzinfo is not None
  assert re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", obj["mail"])


@pytest.mark.parametrize("schema", [
    FOUR_FIELDS, NESTED, {"type": "object", "additionalProperties": {"type": ["integer", "string", "null"]}},
    {"type": "array", "items": {"enum": [1, "two", None, [3]]}, "maxItems": 4},
    {"type": ["object", "null"], "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    pytest.param({"type": "object"}, marks=pytest.mark.slow)],          # json_object: seconds in outlines-core
    ids=["four_fields", "nested", "object_of_scalars", "array_enum", "nullable_object", "any_object"])
def test_random_walks_validate_against_the_schema(schema, byte_vocab):
  tok = byte_tokenizer()
  a = compile_constraint(Constraint.json_schema(schema), byte_vocab)
  rng = np.random.default_rng(0)
  kinds = set()
  for _ in range(25):
    ids = random_walk(a, BYTE_EOS, rng)
    obj = json.loads(tok.decode(ids[:-1]))
    check_instance(obj, schema)
    kinds.add(type(obj))
    if schema is NESTED:
      check_nested_formats(obj)
    if schema.get("type") == "object" and schema.get("properties") is None:
      assert isinstance(obj, dict)
  if isinstance(schema.get("type"), list):
    assert kinds == {dict, type(None)}                  # every type of the list is generated


ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"   # ECMA-262 WhiteSpace


def ecma(pattern: str) -> str:
  """A pattern as Python's re reads ECMA-262 (with re.ASCII: \\d and \\w ASCII; \\s ECMA's Unicode spaces)."""
  return pattern.replace(r"\s", f"[{ECMA_SPACE}]").replace(r"\S", f"[^{ECMA_SPACE}]")


PATTERNS = ["^.{3,6}$", r'^[a-z\\"]{1,4}$', "^[^@]+@[^@]+$", r"^\d{3}$", "^a$|^b$", 'say "(hi|yo)"', r"[ -~]{2,5}",
            r"\w\s\S\D\W", r"^C:\\[A-Z]+$",
            # ECMA's classes do not nest: '[' is a member, '&&' and '~' characters, POSIX names plain text
            "^[[:alpha:]]$", "^[[a]b]$", "^[a-z&&[^aeiou]]$", "^[[]$", "^[~]{2}$",
            # a quantifier after a quote or a backslash repeats the whole escape
            '^"+$', '^a"?$', r"^\\{2}$"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_patterns_strings_are_valid_json_and_match_it_as_ecma_reads_it(pattern, byte_vocab):
  """Characters JSON holds only escaped (control characters, a quote, a backslash) never appear raw; `"`
  and `\\` in the pattern are written escaped; \\d is ASCII as in ECMA-262."""
  schema = {"type": "string", "pattern": pattern}
  a = compile_constraint(Constraint.json_schema(schema), byte_vocab)
  rng = np.random.default_rng(0)
  for _ in range(25):
    value = json.loads(byte_tokenizer().decode(random_walk(a, BYTE_EOS, rng, wander=12)[:-1]))
    assert isinstance(value, str)        # (jsonschema's pattern check is Python's re: Unicode \\w, \\d)
    assert re.search(ecma(pattern), value, re.ASCII), (pattern, value)


@pytest.mark.parametrize("pattern, needle", [(r"^a\nb$", "lets '\\n' into the string"),
                                             (r"\x22", "lets '\"' into the string"),
                                             ("(a|^b)", "the anchor '^' inside it"),
                                             ("(?x) a # b", "verbose mode"),
                                             (r"^\pL+$", "the Unicode property escape \\pL is"),
                                             (r"^[\p{L}]$", "the Unicode property escape \\p{L}"),
                                             ("^[a--b]$", "'--' is not supported")])
def test_patterns_json_cannot_hold_are_refused_by_name(pattern, needle):
  with pytest.raises(ConstraintError, match=re.escape(needle)):
    Constraint.json_schema({"type": "string", "pattern": pattern})


def test_smollm2_four_field_schema(smol):
  """SmolLM2's byte-level BPE: random walks validate; the tokenizer's own encoding of valid instances is
  accepted token by token (EOS only at the end), of invalid ones refused."""
  tok, vocab = smol
  a = compile_constraint(Constraint.json_schema(FOUR_FIELDS), vocab)
  assert a.vocab_size == 49152
  rng = np.random.default_rng(1)
  for _ in range(12):
    ids = random_walk(a, 2, rng, wander=40)
    check_instance(json.loads(tok.decode(ids[:-1])), FOUR_FIELDS)
  valid = [{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"], "color": "green"},
           {"name": "Zoë \"Z\" 日本", "age": -7, "tags": [], "color": "red"},
           {"name": "", "age": 0, "tags": ["a\\b", "x\ny"], "color": "blue"}]
  invalid = [{"name": "x" * 21, "age": 1, "tags": [], "color": "red"},
             {"name": "x", "age": 1.5, "tags": [], "color": "red"},
             {"name": "x", "age": 1, "tags": [], "color": "purple"},
             {"name": "x", "age": 1, "tags": [3], "color": "red"},
             {"name": "x", "age": 1, "tags": []}]
  for obj in valid + invalid:
    ok = jsonschema.Draft202012Validator(FOUR_FIELDS).is_valid(obj)
    assert ok == (obj in valid)
    # outlines-core's strings take the escapes \" \\ \/ \b \f \n \r \t, not \uXXXX: non-ASCII text as is
    for text in (json.dumps(obj, ensure_ascii=False), json.dumps(obj, separators=(",", ":"), ensure_ascii=False)):
      ids = tok.encode(text, add_special_tokens=False).ids
      assert accepts(a, ids) == ok, text
      if ok:      # EOS is allowed at the end only
        states = [0]
        for t in ids:
          states.append(int(a.next_state[states[-1], a.token_class[t]]))
        assert [2 in allowed_tokens(a, s) for s in states] == [False] * len(ids) + [True]


@pytest.mark.parametrize("pattern", [r"[0-9]+(\.[0-9]{1,2})?", r"(ab)*c?", r"a(bc)?|x[yz]{2,3}", r"-?(0|[1-9][0-9]*)",
                                     r"(cat|category|cattle)s?", r"[a-c]{0,3}d?"])
def test_regex_allowed_set_equals_partial_match(pattern, byte_vocab):
  """After any text, token t is allowed iff text + t can still be completed to a full match (the `regex`
  module's partial matching), and the state is accepting iff the text fully matches (Python's `re`)."""
  tok = byte_tokenizer()
  a = compile_constraint(Constraint.regex(pattern), byte_vocab)
  printable = [i for i in range(256) if 32 <= byte_vocab.token_bytes[i][0] < 127]
  rng = np.random.default_rng(2)
  texts = {""}
  for _ in range(15):
    ids = random_walk(a, BYTE_EOS, rng, wander=8)[:-1]
    texts.update(tok.decode(ids[:k]) for k in range(len(ids) + 1))
  for text in sorted(texts):
    state = 0
    for t in tok.encode(text).ids:
      state = int(a.next_state[state, a.token_class[t]])
    assert bool(a.accepting[state]) == bool(re.fullmatch(pattern, text)), text
    allowed = set(allowed_tokens(a, state).tolist())
    for t in printable:
      expect = regex_module.fullmatch(pattern, text + chr(byte_vocab.token_bytes[t][0]), partial=True) is not None
      assert (t in allowed) == expect, (text, chr(byte_vocab.token_bytes[t][0]))
    assert (BYTE_EOS in allowed) == bool(re.fullmatch(pattern, text))


def test_outlines_index_alone_drops_continuations_the_automaton_keeps(byte_vocab):
  """Why index.py appends a sentinel: outlines-core's own Index over single bytes refuses "b" after "a"
  under a(bc)? (a token ending one byte past a full match); the compiled automaton accepts "abc"."""
  table = {b: [i] for i, b in enumerate(byte_vocab.token_bytes) if b is not None}
  raw = Index("a(bc)?", Vocabulary(BYTE_EOS, table))
  after_a = raw.get_next_state(raw.get_initial_state(), table[b"a"][0])
  assert table[b"b"][0] not in raw.get_allowed_tokens(after_a)
  a = compile_constraint(Constraint.regex("a(bc)?"), byte_vocab)
  tok = byte_tokenizer()
  assert accepts(a, tok.encode("abc").ids) and accepts(a, tok.encode("a").ids)
  assert not accepts(a, tok.encode("ab").ids)


def test_smollm2_allowed_sets_equal_outlines_full_vocabulary_index(smol):
  """Byte-class reduction and token classes on a real BPE vocabulary: along random walks, the allowed set
  equals outlines-core's own Index over all 49,152 tokens, state by state, but for the tokens holding byte
  0xF4 (characters U+100000-U+10FFFF: the compiler's sentinel), which are never allowed."""
  tok, vocab = smol
  a = compile_constraint(Constraint.json_schema(FOUR_FIELDS), vocab)
  table = {}
  for i, b in enumerate(vocab.token_bytes):
    if b is not None:
      table.setdefault(b, []).append(i)
  raw = Index(Constraint.json_schema(FOUR_FIELDS).to_regex(), Vocabulary(2, table))
  rng = np.random.default_rng(4)
  for _ in range(3):
    ours, theirs = 0, raw.get_initial_state()
    for t in random_walk(a, 2, rng, wander=25)[:-1]:
      sentinel = {i for i in raw.get_allowed_tokens(theirs) if 0xF4 in (vocab.token_bytes[i] or b"")}
      assert set(allowed_tokens(a, ours).tolist()) == set(raw.get_allowed_tokens(theirs)) - sentinel
      ours, theirs = int(a.next_state[ours, a.token_class[t]]), raw.get_next_state(theirs, t)
    assert a.accepting[ours] and raw.is_final_state(theirs)


def test_choices_accept_exactly_the_choices(byte_vocab):
  tok = byte_tokenizer()
  options = ["a.b", "(x|y)", "tab\there", "naïve", "\\", "cat", "category"]
  a = compile_constraint(Constraint.choices(options), byte_vocab)
  for text in options + ["axb", "x", "tab", "naive", "\\\\", "ca", "cats", ""]:
    assert accepts(a, tok.encode(text).ids) == (text in options), text
  rng = np.random.default_rng(3)
  for _ in range(30):
    assert tok.decode(random_walk(a, BYTE_EOS, rng, wander=3)[:-1]) in options


def test_forced_and_done(byte_vocab):
  """forced[s] is the one token the choices leave after a text that is not itself a choice; done: a
  complete choice no other choice extends."""
  tok = byte_tokenizer()
  options = ["hello world", "hello there", "help"]
  a = compile_constraint(Constraint.choices(options), byte_vocab)
  texts = sorted({o[:k] for o in options for k in range(len(o) + 1)})
  for text in texts:
    state = 0
    for t in tok.encode(text).ids:
      state = int(a.next_state[state, a.token_class[t]])
    following = {o[len(text)] for o in options if o.startswith(text) and len(o) > len(text)}
    if len(following) == 1 and text not in options:
      assert a.forced[state] == tok.encode(following.pop()).ids[0], text
    else:
      assert a.forced[state] == -1, text
    assert a.done[state] == (text in options and not following), text


def test_special_tokens_never_and_eos_only_at_acceptance(smol):
  tok, vocab = smol
  a = compile_constraint(Constraint.regex(r"(.|\n)*"), vocab)      # anything at all: accepting everywhere
  special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special and i != 2]
  assert special and all(a.next_state[0, a.token_class[i]] < 0 for i in special)
  assert a.next_state[0, a.token_class[2]] == 0 and a.accepting[0]
  b = compile_constraint(Constraint.regex("[0-9]{3}"), vocab)
  ids = tok.encode("123", add_special_tokens=False).ids
  state = 0
  for t in ids:
    assert b.next_state[state, b.token_class[2]] < 0
    state = b.next_state[state, b.token_class[t]]
  assert b.accepting[state] and b.done[state]


def test_token_bytes_are_what_decoding_emits(smol):
  """Byte-level: a token's bytes are the text it adds mid-sequence (where it decodes to whole characters).
  A SentencePiece-style tokenizer (▁ for space, <0xHH> byte fallback): the same."""
  tok, vocab = smol
  checked = 0
  for i in range(0, tok.get_vocab_size(), 7):
    b, text = vocab.token_bytes[i], tok.decode([28, i, 28])
    if b is None or "\ufffd" in text:
      continue
    assert text.encode() == b"," + b + b",", i
    checked += 1
  assert checked > 6000
  pieces = ["<unk>", "<0x0A>", "<0xC3>", "<0xA9>", "▁", "a", "b", "▁a", "ab", "▁ab"]
  sp = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, [("a", "b"), ("▁", "a"), ("▁a", "b")],
                            byte_fallback=True, unk_token="<unk>"))
  sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                  decoders.Strip(" ", 1, 0)])
  sp.add_special_tokens(["</s>"])
  v = build_vocabulary(sp, [len(pieces)])
  assert v.token_bytes[:len(pieces)] == (b"<unk>", b"\n", b"\xc3", b"\xa9", b" ", b"a", b"b", b" a", b"ab", b" ab")
  for i in range(1, len(pieces)):
    if i not in (2, 3):
      assert sp.decode([5, i]).encode() == b"a" + v.token_bytes[i]
  assert sp.decode([5, 2, 3]) == "aé"


def test_unsupported_decoder_and_missing_eos_refused():
  wp = Tokenizer(models.WordPiece({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
  wp.decoder = decoders.WordPiece()
  with pytest.raises(ConstraintError, match="decoder WordPiece is not supported"):
    build_vocabulary(wp, [1])
  with pytest.raises(ConstraintError, match="needs an EOS"):
    build_vocabulary(byte_tokenizer(), [])


def digitless_tokenizer():
  """The byte tokenizer with the ten digit tokens special (never allowed under a constraint)."""
  tok = byte_tokenizer()
  tok.add_special_tokens([str(d) for d in range(10)])
  return tok


def test_empty_automaton_refused(byte_vocab):
  """No token sequence of the vocabulary matches: refused before anything runs."""
  with pytest.raises(ConstraintError, match="no text of it can be generated"):
    Constraint.regex("\U00100000+")
  no_digits = token_vocabulary(digitless_tokenizer(), [BYTE_EOS], 264)
  with pytest.raises(ConstraintError, match="no token sequence|cannot compile the constraint over"):
    compile_constraint(Constraint.regex("a*[0-9]"), no_digits)
  for empty_only in ("a{0}", "(?:)", "(a{0})|(?:)"):     # ("" itself is refused as a regex)
    with pytest.raises(ConstraintError, match="admits only the empty output"):
      compile_constraint(Constraint.regex(empty_only), byte_vocab)
  compile_constraint(Constraint.regex("a?"), byte_vocab)   # empty or one token: allowed


def test_compile_cache(byte_vocab):
  clear_cache()
  c = Constraint.json_schema(FOUR_FIELDS)
  a = compile_constraint(c, byte_vocab)
  assert compile_constraint(Constraint.json_schema(json.dumps(FOUR_FIELDS)), byte_vocab) is a
  assert token_vocabulary(byte_tokenizer(), [BYTE_EOS], 264) is not byte_vocab   # another tokenizer object
  other = token_vocabulary(byte_tokenizer(), [BYTE_EOS], 264)
  assert other.fingerprint == byte_vocab.fingerprint
  assert compile_constraint(c, other) is a                        # same tokens: same key
  assert compile_constraint(c, token_vocabulary(byte_tokenizer(), [BYTE_EOS], 300)) is not a
