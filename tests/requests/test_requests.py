"""Requests as users write them: per-request max_new_tokens / seed / num_samples, stop strings and stop ids in
`generate_stream`, and OpenAI batch files in datagen.

References are independent of the stream: `generate` of each request alone with the matching settings (plain
decoding or the same draft), its text cut with Python's `str.find`, and the choices of an OpenAI batch file
against `generate` of each request alone.
"""
from __future__ import annotations

import functools
import json
import time

import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import stops as stops_lib
from magicdec_jax import datagen, datagen_formats, openai_batch, testing
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.generation import generate
from magicdec_jax.request import Request, overflow_stream
from magicdec_jax.stream import generate_stream

PROMPTS = ["Hello there, friend", "To be or not", "abc", "The quick brown fox", "Once upon"]


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)


def _ref(prompt, n=1, **kw):
  return generate(tiny(), [prompt] * n, **kw)


@pytest.mark.parametrize("draft", [None, "chain"])
def test_per_request_max_new_seed_num_samples(draft):
  """Each (request, sample) equals `generate` of that request alone with its own settings."""
  gen = dict(temperature=0.9, seed=5)
  if draft:
    gen.update(draft=md.StreamingDraft(sink=2, window=8), gamma=2)
  reqs = [Request(PROMPTS[0]), Request(PROMPTS[1], max_new_tokens=5), Request(PROMPTS[2], seed=77, num_samples=3),
          Request(PROMPTS[3], seed=9, max_new_tokens=7, num_samples=1), Request(PROMPTS[4], num_samples=3)]
  got = {(r.index, r.sample): r for r in generate_stream(tiny(), reqs, batch_size=3, num_samples=2,
                                                           max_new_tokens=12, **gen)}
  assert len(got) == 2 + 2 + 3 + 1 + 3
  refs = {0: _ref(PROMPTS[0], 2, stream_ids=[0, 1], max_new_tokens=12, **gen),
          1: _ref(PROMPTS[1], 2, stream_ids=[2, 3], max_new_tokens=5, **gen),
          2: _ref(PROMPTS[2], 3, max_new_tokens=12, **dict(gen, seed=77)),
          3: _ref(PROMPTS[3], 1, max_new_tokens=7, **dict(gen, seed=9)),
          4: _ref(PROMPTS[4], 3, stream_ids=[8, 9, overflow_stream(4, 2)], max_new_tokens=12, **gen)}
  assert got[(4, 2)].stream_id == overflow_stream(4, 2) >= 2**31
  for (i, s), r in got.items():
    assert r.tokens == refs[i].tokens[s], (i, s)
    assert r.finish_reason == refs[i].finish_reasons[s]
  assert all(len(got[(1, s)].tokens) <= 5 for s in range(2)) and len(got[(3, 0)].tokens) <= 7


def test_per_request_bad_values():
  with pytest.raises(ValueError, match=r"request 1: max_new_tokens must be an integer in \[1, 8\]"):
    list(generate_stream(tiny(), [Request("a"), Request("b", max_new_tokens=9)], max_new_tokens=8))
  with pytest.raises(ValueError, match=r"request 0: seed must be"):
    list(generate_stream(tiny(), [Request("a", seed=-1)], max_new_tokens=8))
  with pytest.raises(ValueError, match=r"request 0: stop must be"):
    list(generate_stream(tiny(), [Request("a", stop=[""])], max_new_tokens=8))
  with pytest.raises(ValueError, match=r"request 0: num_samples=2 but 1 stream_ids"):
    list(generate_stream(tiny(), [Request("a", num_samples=2, stream_ids=[4])], max_new_tokens=8))


def _ascii_stop(text: str, start: int) -> str:
  """Two ASCII characters of `text` from `start` on (two byte tokens: a stop split across tokens)."""
  for i in range(start, len(text) - 1):
    if text[i].isascii() and text[i + 1].isascii() and text[i:i + 2].isprintable():
      return text[i:i + 2]
  raise AssertionError(f"no ASCII pair in {text!r}")


def _completing(toks, stop):
  """The reference count of tokens up to the one completing the first `stop` (decoded prefix by prefix)."""
  dec = tiny().tokenizer.decode
  return next(k for k in range(1, len(toks) + 1) if stop in dec(toks[:k], skip_special_tokens=False))


@pytest.mark.parametrize("draft", [None, "chain"])
def test_stop_strings_and_ids(draft):
  """Split across tokens, at the first token, never reached, kept, a stop id: the text is the plain
  decoding's cut at `str.find`, the tokens its prefix up to the completing token, and no row ran more than
  one round past it."""
  new, gamma = 24, 3
  ref = generate(tiny(), PROMPTS[:4], max_new_tokens=new)          # plain greedy: the reference
  gen = dict(max_new_tokens=new)
  if draft:
    gen.update(draft=md.StreamingDraft(sink=2, window=8), gamma=gamma)
  t = ref.texts
  stops = [_ascii_stop(t[0], 3), t[1][0], "\x01never\x02", _ascii_stop(t[3], 2)]
  stop_id = ref.tokens[2][4]
  reqs = [Request(PROMPTS[0], stop=[stops[0], "\x03unused"]), Request(PROMPTS[1], stop=[stops[1]]),
          Request(PROMPTS[2], stop=[stops[2]], stop_token_ids=[stop_id]),
          Request(PROMPTS[3], stop=stops[3], keep_stop=True), Request(PROMPTS[0], stop=[stops[2]])]
  got = {r.index: r for r in generate_stream(tiny(), reqs, batch_size=2, **gen)}
  per_round = 1 if draft is None else gamma + 1
  for i in (0, 1, 3):
    r, stop, text = got[i], stops[i], t[i]
    pos = text.find(stop)
    assert pos >= 0 and r.finish_reason == "stop"
    assert r.text == (text[:pos + len(stop)] if i == 3 else text[:pos])
    k = _completing(ref.tokens[i], stop)
    assert r.tokens == ref.tokens[i][:k]
    assert k <= r.stats["generated_tokens"] <= k + per_round - 1
  assert got[1].text == "" and len(got[1].tokens) == 1              # the stop matched at the first token
  k = ref.tokens[2].index(stop_id) + 1                                # the stop id
  assert got[2].finish_reason == "stop" and got[2].tokens == ref.tokens[2][:k]
  assert got[2].text == tiny().tokenizer.decode(ref.tokens[2][:k - 1], skip_special_tokens=False)
  assert got[4].tokens == ref.tokens[0] and got[4].text == t[0]      # never reached
  assert got[4].finish_reason == ref.finish_reasons[0]


# ------------------------------------------------------------------------------------------ OpenAI batch

def _line(cid, url, body):
  return {"custom_id": cid, "method": "POST", "url": url, "body": body}


CHAT, COMP = "/v1/chat/completions", "/v1/completions"
MSGS = [{"role": "user", "content": "Tell me a story"}]


def _write(path, lines):
  with open(path, "w") as f:
    for ln in lines:
      f.write((ln if isinstance(ln, str) else json.dumps(ln)) + "\n")
  return str(path)


def test_openai_batch_mixed_file_bad_lines_and_resume(tmp_path, monkeypatch):
  model = tiny()
  bars = []                    # (total, count) of each run's progress bar: the same on a first run and a resume

  class Bar(datagen_formats.tqdm):
    def close(self):
      bars.append((self.total, self.n))
      super().close()
  monkeypatch.setattr(datagen_formats, "tqdm", Bar)
  greedy = generate(model, ["The quick brown fox"], max_new_tokens=10)
  stop = next(c for c in greedy.texts[0][1:] if c.isascii() and c.isprintable())
  good = [_line("g1", COMP, {"prompt": "Hello world", "max_tokens": 6}),
          _line("s1", CHAT, {"messages": MSGS, "max_tokens": 9, "temperature": 0.8, "n": 2, "seed": 4}),
          _line("s2", COMP, {"prompt": "To be", "temperature": 0.8, "n": 2}),
          _line("st", COMP, {"prompt": "The quick brown fox", "stop": stop, "max_tokens": 10})]
  bad = [{"method": "POST", "url": COMP, "body": {"prompt": "x"}},
         _line("t", COMP, {"prompt": "x", "max_tokens": "5"}),
         _line("u", COMP, {"prompt": "x", "foo": 1}),
         _line("g1", COMP, {"prompt": "again"}),
         _line("lp", "/v1/embeddings", {"prompt": "x"})]
  inp = _write(tmp_path / "in.jsonl", good[:2] + bad[:3] + good[2:] + bad[3:])
  out = str(tmp_path / "out.jsonl")
  kw = dict(max_new_tokens=10, batch_size=3, seed=3, progress=False)
  t0 = int(time.time())
  s = datagen.run(model, inp, out, **dict(kw, progress=True))
  t1 = time.time()
  assert s["input_format"] == "openai" and s["sampling_groups"] == 1 and s["bad_lines"] == 5   # one mixed stream
  lines = open(out).read().splitlines()
  recs = [json.loads(x) for x in lines]
  errs = {r["id"]: r for r in recs if r["error"] is not None}
  assert len(errs) == 5 and all(r["response"] is None for r in errs.values())
  msgs = sorted(r["error"]["message"] for r in errs.values())
  for frag in ("'custom_id'", "body.max_tokens", "'foo'", "duplicate custom_id \"g1\"",
               "'url'"):
    assert any(frag in m for m in msgs), (frag, msgs)
  choices = {(r["custom_id"], r["response"]["body"]["choices"][0]["index"]): r for r in recs if r["error"] is None}
  assert set(choices) == {("g1", 0), ("s1", 0), ("s1", 1), ("s2", 0), ("s2", 1), ("st", 0)}
  # each choice against `generate` of its request alone
  dec = lambda toks: model.tokenizer.decode(toks[:-1] if toks and toks[-1] == 256 else toks,   # noqa: E731
                                            skip_special_tokens=False)
  chat_prompt = tok_lib.chat_prompt(model, MSGS)
  refs = {"g1": _ref("Hello world", max_new_tokens=6, stream_ids=[datagen_formats.stream_id("g1", 0)], seed=3),
          "s1": _ref(chat_prompt, 2, max_new_tokens=9, temperature=0.8, seed=4),
          "s2": _ref("To be", 2, max_new_tokens=10, temperature=0.8, seed=3,
                     stream_ids=[datagen_formats.stream_id("s2", s) for s in range(2)])}
  for (cid, s), r in choices.items():
    body = r["response"]["body"]
    assert isinstance(body["created"], int) and t0 <= body["created"] <= t1   # OpenAI's objects require it
    ch = body["choices"][0]
    text = ch["message"]["content"] if cid == "s1" else ch["text"]
    assert body["object"] == ("chat.completion" if cid == "s1" else "text_completion")
    if cid == "st":
      assert text == greedy.texts[0][:greedy.texts[0].find(stop)] and ch["finish_reason"] == "stop"
      continue
    assert text == dec(refs[cid].tokens[s]), (cid, s)
    assert body["usage"]["completion_tokens"] == len(refs[cid].tokens[s])
    assert ch["finish_reason"] == ("length" if refs[cid].finish_reasons[s] == "length" else "stop")
  # resume after a torn line: only the missing choices are generated again
  with open(out + ".config.json") as f:
    config = f.read()
  out2 = str(tmp_path / "out2.jsonl")
  keep = 7
  with open(out2, "w") as f:
    f.write("\n".join(lines[:keep]) + "\n" + lines[keep][:25])
  with open(out2 + ".config.json", "w") as f:
    f.write(config)
  kept_choices = sum(1 for x in recs[:keep] if x["error"] is None)
  s2 = datagen.run(model, inp, out2, **kw)
  assert s2["records_written"] == 6 - kept_choices and s2["torn_bytes_repaired"] == 25
  assert sorted(map(_without_created, open(out2).read().splitlines())) == sorted(map(_without_created, lines))
  assert datagen.run(model, inp, out2, **dict(kw, progress=True))["records_written"] == 0
  assert bars[0] == bars[-1] == (len(lines), len(lines))          # 6 choices + 5 error lines
  # its requests sample (rejection sampling), so another draft would change their samples: refused
  with pytest.raises(datagen.DatagenError, match="different settings.*draft"):
    datagen.run(model, inp, out2, **kw, draft=md.StreamingDraft(sink=1, window=4), gamma=2)


def _without_created(line: str) -> str:
  rec = json.loads(line)
  if rec["response"] is not None:
    del rec["response"]["body"]["created"]
  return json.dumps(rec, sort_keys=True)


def test_openai_logprobs_are_plain_decodings(tmp_path):
  """An OpenAI request with logprobs / top_logprobs: each token's log-probability and alternatives in the
  output line equal plain decoding's (generate with logprobs, no draft) for that request alone."""
  model = tiny()
  inp = _write(tmp_path / "in.jsonl", [_line("lp", COMP, {"prompt": "Hello world", "max_tokens": 6,
                                                           "logprobs": True, "top_logprobs": 2}),
                                       _line("legacy", COMP, {"prompt": "Hello world", "max_tokens": 6,
                                                              "logprobs": 2}),      # the completions API's form
                                       _line("chat", CHAT, {"messages": MSGS, "max_tokens": 6, "logprobs": True,
                                                            "top_logprobs": 2})])
  out = str(tmp_path / "out.jsonl")
  datagen.run(model, inp, out, max_new_tokens=6, batch_size=2, seed=3, progress=False,
              draft=md.StreamingDraft(sink=1, window=4), gamma=2)
  recs = {r["custom_id"]: r for r in (json.loads(x) for x in open(out).read().splitlines())}
  # chat: each token's bytes, joined, are the tokens' text (decoded as a whole, not token by token), and a
  # token's own bytes its text wherever they are whole characters
  choice = recs.pop("chat")["response"]["body"]["choices"][0]
  content, text = choice["logprobs"]["content"], choice["message"]["content"]
  whole = bytes(b for c in content for b in c["bytes"]).decode("utf-8", errors="replace")
  assert whole == text or (choice["finish_reason"] == "stop" and whole == text + content[-1]["token"])
  for e in [c for c in content] + [a for c in content for a in c["top_logprobs"]]:
    if "\ufffd" not in e["token"]:
      assert bytes(e["bytes"]) == e["token"].encode("utf-8")
  ref = generate(model, ["Hello world"], max_new_tokens=6, logprobs=True, top_logprobs=2)
  name = lambda t: _legacy_name(model.tokenizer, t)      # noqa: E731
  for rec in recs.values():
    lp = rec["response"]["body"]["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ref.tokens[0])
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"], ref.logprobs[0])) < 1e-5
    assert lp["tokens"] == [name(t) for t in ref.tokens[0]]
    for got, want in zip(lp["top_logprobs"], ref.top_logprobs[0]):
      want = {name(t): v for t, v in want}
      assert set(got) == set(want) and all(abs(got[k] - want[k]) < 1e-5 for k in want)
    assert lp["text_offset"] == _char_offsets(model.tokenizer, ref.tokens[0])


def _byte_of_token():
  """The byte tokenizer's token id -> byte, from its construction (testing.byte_tokenizer: ids in the order
  of ByteLevel's alphabet) and GPT-2's byte -> character table, written out here."""
  from tokenizers import pre_tokenizers
  char_byte = {}
  n = 0
  for b in range(256):
    if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff:          # printable: themselves
      char_byte[chr(b)] = b
    else:
      char_byte[chr(256 + n)] = b
      n += 1
  return {i: char_byte[c] for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}


def _token_bytes(tok, t) -> bytes:
  return bytes([_byte_of_token()[t]]) if t < 256 else tok.decode([t], skip_special_tokens=False).encode()


def _legacy_name(tok, t) -> str:
  """OpenAI's /v1/completions token name: the text, or "bytes:\\xNN..." for part of a character."""
  raw = _token_bytes(tok, t)
  try:
    raw.decode("utf-8")
    return tok.decode([t], skip_special_tokens=False)
  except UnicodeDecodeError:
    return "bytes:" + "".join("\\x%02x" % b for b in raw)


def _char_offsets(tok, tokens) -> list[int]:
  """Each token's start in characters: the characters complete after its predecessors' bytes, counted
  byte by byte (a character is complete when the decoder emits it)."""
  import codecs
  dec, after, n = codecs.getincrementaldecoder("utf-8")("replace"), [0], 0
  for b in b"".join(_token_bytes(tok, t) for t in tokens):
    n += len(dec.decode(bytes([b])))
    after.append(n)
  starts = [0]
  for t in tokens[:-1]:
    starts.append(starts[-1] + len(_token_bytes(tok, t)))
  return [after[s] for s in starts]


def test_openai_request_validation():
  ok = _line("a", COMP, {"prompt": "x", "n": 2, "stop": ["\n"], "seed": -1})
  rec, opts = openai_batch.to_native(ok, max_new_tokens=8)
  assert rec == {"id": "a", "prompt": "x"} and opts["n"] == 2 and opts["seed"] == 2**32 - 1
  for line, field in [(_line("a", COMP, {"prompt": "x", "max_tokens": 9}), "max_tokens"),
                      (_line("a", COMP, {"messages": MSGS}), "messages"),
                      (_line("a", CHAT, {"messages": MSGS, "temperature": "hot"}), "temperature"),
                      (_line("a", COMP, {"prompt": "x", "stop": [1]}), "stop"),
                      ({**_line("a", COMP, {"prompt": "x"}), "method": "GET"}, "method"),
                      ({"custom_id": "a", "method": "POST", "url": COMP}, "body"),
                      (_line(7, COMP, {"prompt": "x"}), "custom_id"),
                      (_line("a", COMP, {"prompt": "x", "logprobs": 2, "top_logprobs": 2}), "top_logprobs"),
                      (_line("a", CHAT, {"messages": MSGS, "logprobs": 2}), "logprobs"),
                      # fields another field overrides are still checked: not dropped with a bad value
                      (_line("a", COMP, {"prompt": "x", "temperature": 0, "top_p": 5}), "top_p"),
                      (_line("a", COMP, {"prompt": "x", "temperature": 0, "top_p": "abc"}), "top_p"),
                      (_line("a", COMP, {"prompt": "x", "max_tokens": 5, "max_completion_tokens": "abc"}),
                       "max_completion_tokens"),
                      (_line("a", COMP, {"prompt": "x", "max_tokens": 5, "max_completion_tokens": 1000}),
                       "max_completion_tokens")]:
    with pytest.raises(openai_batch.RequestError) as e:
      openai_batch.to_native(line, max_new_tokens=8)
    assert e.value.field == field and field in str(e.value)


def test_input_format_is_told_by_the_first_line_that_parses(tmp_path):
  """A malformed or body-less first request still makes the file an OpenAI batch (its own error line), not
  a native file whose every line lacks an 'id'."""
  req = json.dumps(_line("a", COMP, {"prompt": "x"}))
  for first in ('{"custom_id": "torn", "meth', '{"custom_id": "b", "method": "POST", "url": "/v1/completions"}', ""):
    path = tmp_path / "in.jsonl"
    path.write_text(f"{first}\n{req}\n")
    assert datagen.detect_format(str(path)) == "openai", first
  path.write_text('not json\n{"id": 1, "prompt": "x"}\n')
  assert datagen.detect_format(str(path)) == "native"


def test_openai_files_refuse_the_run_wide_options_their_requests_set(tmp_path):
  """chat and num_samples are each OpenAI request's own (its url, body.n): a run-wide value is refused by
  name, not ignored, before anything is generated."""
  inp = _write(tmp_path / "in.jsonl", [_line("a", COMP, {"prompt": "x"})])
  for kw, words in ((dict(chat=True), "chat is for native records"), (dict(num_samples=3), "num_samples=3")):
    with pytest.raises(datagen.DatagenError, match=words):
      datagen.run(tiny(), inp, str(tmp_path / "out.jsonl"), max_new_tokens=4, progress=False, **kw)


def test_native_records_carry_their_own_settings(tmp_path):
  """A native file mixing greedy and sampled records with their own max_new_tokens / seed runs as one
  stream (per-row sampling); each record equals `generate` of it alone with its settings; an unknown field
  or a bad value is a bad line naming it."""
  model = tiny()
  recs = [{"id": "g", "prompt": "Hello world"},
          {"id": "t", "prompt": "To be", "temperature": 0.8, "top_p": 0.9, "max_new_tokens": 7},
          {"id": "k", "prompt": "The quick brown fox", "temperature": 1.0, "top_k": 20, "seed": 9}]
  out = str(tmp_path / "out.jsonl")
  s = datagen.run(model, _write(tmp_path / "in.jsonl", recs), out, max_new_tokens=10, batch_size=2, seed=3,
                  progress=False)
  assert s["records_written"] == 3 and s["sampling_groups"] == 1
  got = {r["id"]: r for r in map(json.loads, open(out).read().splitlines())}
  for rec in recs:
    own = {k: v for k, v in rec.items() if k not in ("id", "prompt")}
    want = _ref(rec["prompt"], stream_ids=[datagen_formats.stream_id(rec["id"], 0)], **dict(dict(max_new_tokens=10,
                                                                                          seed=3), **own))
    assert got[rec["id"]]["token_ids"] == want.tokens[0], rec["id"]
  bad = [{"id": "u", "prompt": "x", "meta": 1}, {"id": "v", "prompt": "x", "top_p": 0},
         {"id": "w", "prompt": "x", "max_new_tokens": 11}]
  s = datagen.run(model, _write(tmp_path / "bad.jsonl", bad), str(tmp_path / "o2.jsonl"), max_new_tokens=10,
                  on_error="skip", progress=False)
  reasons = [json.loads(x)["reason"] for x in open(str(tmp_path / "o2.jsonl") + ".errors.jsonl")]
  assert s["bad_lines"] == 3 and "unknown field(s) 'meta'" in reasons[0]
  assert "'top_p' must be a number in (0, 1]" in reasons[1] and "'max_new_tokens' must be an integer in [1, 10]" \
      in reasons[2]


def test_a_row_ended_by_its_stop_id_has_that_ids_text_left_out():
  """The text is the tokens before the stop id decoded, as for a request's own stop ids; the tokens keep it."""
  free = generate(tiny(), ["To be or not"], max_new_tokens=8, eos_token_id=[]).tokens[0]
  eos = free[3]
  k = free.index(eos)
  res = generate(tiny(), ["To be or not"], max_new_tokens=8, eos_token_id=eos)
  streamed = next(iter(generate_stream(tiny(), [Request("To be or not")], max_new_tokens=8, eos_token_id=eos)))
  want = tiny().tokenizer.decode(free[:k], skip_special_tokens=False)
  assert res.tokens[0] == streamed.tokens == free[:k + 1] and res.finish_reasons[0] == streamed.finish_reason == "eos"
  assert res.texts[0] == streamed.text == want


@pytest.mark.parametrize("keep", [False, True])
def test_a_stop_string_is_not_found_in_the_end_of_sequence_tokens_text(keep):
  """The row ends at its EOS id, whose text is not output (as without stops): a stop string that only the
  EOS token's text completes (SmolLM2: '|' or 'end' in '<|im_end|>') does not stop it, so the reason stays
  "eos" and no piece of that text appears, kept or not. Reference: the same request without stops."""
  free = generate(tiny(), ["To be or not"], max_new_tokens=12, eos_token_id=[]).tokens[0]
  dec = lambda t: tiny().tokenizer.decode(t, skip_special_tokens=False)      # noqa: E731
  k = next(i for i in range(1, len(free)) if dec(free[i:i + 1]) and dec(free[i:i + 1]) not in dec(free[:i]))
  eos, eos_text = free[k], dec(free[k:k + 1])
  reqs = [Request("To be or not"), Request("To be or not", stop=[eos_text], keep_stop=keep)]
  plain, stopped = sorted(generate_stream(tiny(), reqs, max_new_tokens=12, eos_token_id=eos), key=lambda r: r.index)
  assert plain.finish_reason == stopped.finish_reason == "eos"
  assert stopped.text == plain.text == dec(free[:k]) and stopped.tokens == plain.tokens == free[:k + 1]


def test_stop_search_reads_a_bounded_tail_and_cuts_where_a_whole_text_search_does():
  """find_stop, called as a stream calls it (a few new tokens at a time), cuts where a plain search of
  each whole prefix's text first finds a stop, over random byte-token text with characters split across
  tokens; and a check that finds nothing decodes a bounded tail, not the whole output."""
  tok = testing.byte_tokenizer()
  decode = lambda t: tok.decode(t, skip_special_tokens=False)      # noqa: E731
  rng = np.random.default_rng(0)
  chars = list("ab é€😀\n")
  for trial in range(60):
    text = "".join(rng.choice(chars, size=160))
    toks = tok.encode(text).ids
    at = int(rng.integers(100, 150))
    stops = [text[at:at + int(rng.integers(1, 4))], "".join(rng.choice(chars, size=3))]
    keep = bool(trial % 2)
    want = None
    for k in range(1, len(toks) + 1):                       # the reference: every prefix's whole text
      t = decode(toks[:k])
      hits = [(t.find(s), -len(s)) for s in stops if s in t]
      if hits:
        pos, neg = min(hits)
        want = (k, t[:pos - neg if keep else pos])
        break
    got, start, lengths = None, 0, []
    while got is None and start < len(toks):
      end = min(len(toks), start + int(rng.integers(1, 6)))
      got = stops_lib.find_stop(lambda t: lengths.append(len(t)) or decode(t), toks[:end], stops, frozenset(),
                                keep, start)
      start = end
    assert got == want, (trial, stops)
  lengths = []
  toks = tok.encode("ab" * 2000).ids
  for start in range(0, len(toks), 3):
    assert stops_lib.find_stop(lambda t: lengths.append(len(t)) or decode(t), toks[:start + 3], ["zz", "ba a"],
                               frozenset(), False, start) is None
  assert max(lengths) <= 3 + 4 * 4 + 16
