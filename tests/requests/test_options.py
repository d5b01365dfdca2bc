"""Request options (options.py): one type every way in converts into, validated once, errors naming the field.

The Python API (`Request`), native datagen records and OpenAI batch bodies carry the same fields; each way in
refuses a bad value naming the field in its own words, an unknown field by name, a field no registered
row feature serves by name, never ignoring it, and a constraint (json_schema / regex / choices, OpenAI
response_format) that cannot compile by name, as an error line that costs the rest of the batch nothing. No model runs here except where a stream or datagen must read a request.
"""
from __future__ import annotations

import functools
import json

import pytest

import magicdec_jax as md
from magicdec_jax import datagen, datagen_formats, openai_batch, testing
from magicdec_jax.options import FIELDS, OptionError, RequestOptions
from magicdec_jax.request import Request
from magicdec_jax.stream import generate_stream

COMP = "/v1/completions"


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)


def _line(cid, url, body):
  return {"custom_id": cid, "method": "POST", "url": url, "body": body}


SCHEMA = "a JSON schema, an object or its JSON text"
NOT_JSON = "(not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"  # json's


@pytest.mark.parametrize("field,value,python,record", [
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5", "'top_p' must be a number in (0, 1], got 1.5"),
    ("temperature", "hot", "temperature must be a finite number, got 'hot'",
     "'temperature' must be a finite number in [1e-30, 1e+30] or 0 (greedy), got \"hot\""),
    ("seed", -1, "seed must be an integer in [0, 2**32), got -1", "'seed' must be an integer in [0, 2**32), got -1"),
    ("top_k", 2.0, "top_k must be an integer >= 0, got 2.0", "'top_k' must be an integer >= 0, got 2.0"),
    ("stop", [""], "stop must be a non-empty string or a list of them, got ['']",
     "'stop' must be a non-empty string or a list of them, got [\"\"]"),
    ("keep_stop", 1, "keep_stop must be True or False, got 1", "'keep_stop' must be True or False, got 1"),
    ("regex", "", "regex must be a non-empty string, got ''", "'regex' must be a non-empty string, got \"\""),
    ("json_schema", "{not json", f"json_schema must be {SCHEMA} {NOT_JSON}, got '{{not json'",
     f"'json_schema' must be {SCHEMA} {NOT_JSON}, got \"{{not json\""),
    ("json_schema", [1], "json_schema must be a JSON schema, an object or its JSON text, got [1]",
     "'json_schema' must be a JSON schema, an object or its JSON text, got [1]"),
])
def test_a_bad_value_names_the_field_in_each_way_ins_words(field, value, python, record):
  with pytest.raises(OptionError) as e:
    RequestOptions(**{field: value})
  assert e.value.field == field and str(e.value) == python
  assert e.value.render(f"'{field}'") == record


def test_values_are_normalised_and_run_checks_are_apart():
  o = RequestOptions(stop="\n", stop_token_ids=[3, 4], top_p=0.5)
  assert o.stop == ("\n",) and o.stop_token_ids == (3, 4)
  assert o.given() == {"stop": ("\n",), "stop_token_ids": (3, 4), "top_p": 0.5}
  assert RequestOptions(json_schema='{"type": "object"}').json_schema == {"type": "object"}
  # a stop would cut a constrained output short, and it would still read as finished
  for stop in (dict(stop="}"), dict(stop_token_ids=[3])):
    with pytest.raises(OptionError, match=f"{next(iter(stop))}: not with choices: a stop would cut"):
      RequestOptions(choices=["xyz"], **stop)
  RequestOptions(max_new_tokens=9)                      # alone it is fine; against a run of 8 it is not
  with pytest.raises(OptionError, match=r"max_new_tokens must be an integer in \[1, 8\]"):
    RequestOptions(max_new_tokens=9).check_budget(8)
  with pytest.raises(OptionError, match="give one of json_schema, regex, choices, not json_schema and regex"):
    RequestOptions(json_schema={}, regex="a+")
  with pytest.raises(OptionError, match="top_logprobs: needs logprobs"):
    RequestOptions(top_logprobs=2, logprobs=False)
  assert set(FIELDS) >= {"temperature", "top_k", "top_p", "min_p", "json_schema", "regex", "choices"}


BAD = {"json_schema": ({"type": "number", "minimum": 0}, "minimum"),        # refused keyword, named
       "regex": ("(?=a)b", "look-around"), "choices": (["\U00100000"], "incompatible")}


@pytest.mark.parametrize("field", sorted(BAD))
def test_a_constraint_that_cannot_compile_is_refused_by_name_and_the_rest_is_kept(field, tmp_path):
  value, reason = BAD[field]
  with pytest.raises(ValueError, match=f"request 1: {field}: .*{reason}"):
    list(generate_stream(tiny(), [Request("Hi"), Request("Hello", **{field: value})], batch_size=1,
                         max_new_tokens=4))
  inp = tmp_path / "in.jsonl"
  inp.write_text(json.dumps({"id": "ok", "prompt": "Hello"}) + "\n" +
                 json.dumps({"id": "a", "prompt": "Hello", field: value}) + "\n")
  s = datagen.run(tiny(), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=4, on_error="skip",
                  progress=False)
  (err,) = [json.loads(x) for x in open(str(tmp_path / "out.jsonl") + ".errors.jsonl")]
  assert s["bad_lines"] == 1 and err["id"] == "a" and err["reason"].startswith(f"'{field}': ")
  assert reason in err["reason"]
  (rec,) = [json.loads(x) for x in open(tmp_path / "out.jsonl")]
  alone = next(iter(generate_stream(tiny(), [Request(rec_prompt_ids(tiny(), "Hello"),
                                                     stream_ids=[datagen_formats.stream_id("ok", 0)])],
                                    batch_size=1, max_new_tokens=4)))
  assert rec["id"] == "ok" and rec["token_ids"] == alone.tokens


def rec_prompt_ids(model, text):
  return list(model.tokenizer.encode(text).ids)


def test_openai_response_format_is_served_and_a_bad_schema_is_an_error_line(tmp_path):
  schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
  fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
  _, opts = openai_batch.to_native(_line("a", COMP, {"prompt": "x", "response_format": fmt}), max_new_tokens=8)
  assert opts.request.json_schema == schema and opts["response_format"] == schema
  _, opts = openai_batch.to_native(_line("a", COMP, {"prompt": "x", "response_format": {"type": "json_object"}}),
                                   max_new_tokens=8)
  assert opts.request.json_schema == {"type": "object"}
  _, opts = openai_batch.to_native(_line("a", COMP, {"prompt": "x", "response_format": {"type": "text"}}),
                                   max_new_tokens=8)
  assert opts.request.json_schema is None
  for bad in ({"type": "yaml"}, {"type": "json_schema", "json_schema": {"name": "x"}},
              {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
              {"type": "text", "extra": 1}, {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}},
              {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}):
    with pytest.raises(openai_batch.RequestError) as e:
      openai_batch.to_native(_line("a", COMP, {"prompt": "x", "response_format": bad}), max_new_tokens=8)
    assert e.value.field == "response_format"
  unsupported = {"type": "json_schema", "json_schema": {"name": "y", "schema": {"type": "integer", "maximum": 3}}}
  lines = [_line("ok", COMP, {"prompt": "Hello", "max_tokens": 3, "seed": 5}),
           _line("rf", COMP, {"prompt": "Hello", "response_format": fmt, "max_tokens": 12}),
           _line("bad", COMP, {"prompt": "Hello", "response_format": unsupported})]
  inp = tmp_path / "in.jsonl"
  inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
  s = datagen.run(tiny(), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=12, progress=False)
  recs = {r["custom_id"]: r for r in map(json.loads, open(tmp_path / "out.jsonl"))}
  err = recs["bad"]
  assert s["bad_lines"] == 1 and err["error"] is not None
  assert "body.response_format: " in err["error"]["message"] and "maximum" in err["error"]["message"]
  text = recs["rf"]["response"]["body"]["choices"][0]["text"]
  assert recs["rf"]["response"]["body"]["choices"][0]["finish_reason"] in ("stop", "length")
  if recs["rf"]["response"]["body"]["choices"][0]["finish_reason"] == "stop":
    assert isinstance(json.loads(text)["a"], int)
  alone = next(iter(generate_stream(tiny(), [Request("Hello", seed=5, max_new_tokens=3, stream_ids=[0])],
                                    batch_size=1, max_new_tokens=12)))
  assert recs["ok"]["response"]["body"]["choices"][0]["text"] == alone.text.replace("<|eos|>", "")


def test_openai_body_errors_name_the_body_field():
  for body, field, fragment in [({"prompt": "x", "n": 0}, "n", "body.n must be an integer >= 1, got 0"),
                                ({"prompt": "x", "n": 200}, "n", "body.n must be at most 128"),
                                ({"prompt": "x", "temperature": 2.5}, "temperature",
                                 "body.temperature must be at most"),
                                ({"prompt": "x", "max_completion_tokens": 9}, "max_completion_tokens",
                                 "body.max_completion_tokens must be an integer in [1, 8]"),
                                ({"prompt": "x", "top_logprobs": 2}, "top_logprobs",
                                 "body.top_logprobs: needs logprobs"),
                                ({"prompt": "x", "stop": ["a"] * 5}, "stop", "up to 4")]:
    with pytest.raises(openai_batch.RequestError) as e:
      openai_batch.to_native(_line("a", COMP, body), max_new_tokens=8)
    assert e.value.field == field and fragment in str(e.value), str(e.value)


def test_native_records_refuse_options_they_cannot_honour_by_name(tmp_path):
  inp = tmp_path / "in.jsonl"
  inp.write_text(json.dumps({"id": "a", "prompt": "Hello", "logprobs": True}) + "\n")
  s = datagen.run(tiny(), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=4, on_error="skip",
                  progress=False)
  (err,) = [json.loads(x) for x in open(str(tmp_path / "out.jsonl") + ".errors.jsonl")]
  assert s["bad_lines"] == 1 and "unknown field(s) 'logprobs'" in err["reason"]


def test_a_request_disagreeing_with_the_compiled_logprobs_is_refused():
  with pytest.raises(ValueError, match=r"request 0: logprobs=True but the stream runs logprobs=False"):
    list(generate_stream(tiny(), [Request("Hello", logprobs=True)], batch_size=1, max_new_tokens=4))


def test_row_features_setting_takes_registered_names_only():
  with pytest.raises(ValueError, match="row_features must be distinct names of"):
    md.DecodeSettings(max_new_tokens=4, row_features=("constraints",))
  with pytest.raises(ValueError, match="per_row_sampling=True"):
    md.DecodeSettings(max_new_tokens=4, row_features=("sampling",))
