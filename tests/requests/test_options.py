"""Request options (options.py): one type every way in converts into, validated once, errors naming the field.

The Python API (`Request`), native datagen records and OpenAI batch bodies carry the same fields; each way in
refuses a bad value naming the field in its own words, an unknown field by name, and a field no registered
row feature serves (structured output today: json_schema / regex / choices, OpenAI response_format) by name,
never ignoring it. No model runs here except where a stream or datagen must read a request.
"""
from __future__ import annotations

import functools
import json

import pytest

import magicdec_jax as md
from magicdec_jax import datagen, openai_batch, row_features, testing
from magicdec_jax.options import FIELDS, OptionError, RequestOptions
from magicdec_jax.stream import Request, generate_stream

COMP = "/v1/completions"


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)


def _line(cid, url, body):
  return {"custom_id": cid, "method": "POST", "url": url, "body": body}


@pytest.mark.parametrize("field,value,python,record", [
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5", "'top_p' must be a number in (0, 1], got 1.5"),
    ("temperature", "hot", "temperature must be a number, got 'hot'",
     "'temperature' must be a number >= 0, got \"hot\""),
    ("seed", -1, "seed must be an integer in [0, 2**32), got -1", "'seed' must be an integer in [0, 2**32), got -1"),
    ("top_k", 2.0, "top_k must be an integer >= 0, got 2.0", "'top_k' must be an integer >= 0, got 2.0"),
    ("stop", [""], "stop must be a non-empty string or a list of them, got ['']",
     "'stop' must be a non-empty string or a list of them, got [\"\"]"),
    ("keep_stop", 1, "keep_stop must be True or False, got 1", "'keep_stop' must be True or False, got 1"),
    ("regex", "", "regex must be a non-empty string, got ''", "'regex' must be a non-empty string, got \"\""),
    ("json_schema", "{not json", "json_schema must be a JSON schema (an object, or its JSON text), got '{not json'",
     "'json_schema' must be a JSON schema (an object, or its JSON text), got \"{not json\""),
])
def test_a_bad_value_names_the_field_in_each_way_ins_words(field, value, python, record):
  with pytest.raises(OptionError) as e:
    RequestOptions(**{field: value})
  assert e.value.field == field and str(e.value) == python
  assert e.value.render(f"'{field}'") == record


def test_values_are_normalised_and_run_checks_are_apart():
  o = RequestOptions(stop="\n", stop_token_ids=[3, 4], json_schema='{"type": "object"}')
  assert o.stop == ("\n",) and o.stop_token_ids == (3, 4) and o.json_schema == {"type": "object"}
  assert o.given() == {"stop": ("\n",), "stop_token_ids": (3, 4), "json_schema": {"type": "object"}}
  RequestOptions(max_new_tokens=9)                      # alone it is fine; against a run of 8 it is not
  with pytest.raises(OptionError, match=r"max_new_tokens must be an integer in \[1, 8\]"):
    RequestOptions(max_new_tokens=9).check_budget(8)
  with pytest.raises(OptionError, match="give one of json_schema, regex, choices, not json_schema and regex"):
    RequestOptions(json_schema={}, regex="a+")
  with pytest.raises(OptionError, match="top_logprobs: needs logprobs"):
    RequestOptions(top_logprobs=2, logprobs=False)
  assert set(FIELDS) >= {"temperature", "top_k", "top_p", "min_p", "json_schema", "regex", "choices"}


@pytest.mark.parametrize("field,value", [("json_schema", {"type": "object"}), ("regex", "[ab]+"),
                                         ("choices", ["yes", "no"])])
def test_structured_output_is_refused_by_name_until_a_feature_serves_it(field, value, tmp_path):
  assert not any(field in f.fields for f in row_features.REGISTRY.values())
  with pytest.raises(ValueError, match=f"request 0: {field}: structured output is not available yet"):
    list(generate_stream(tiny(), [Request("Hello", **{field: value})], batch_size=1, max_new_tokens=4))
  inp = tmp_path / "in.jsonl"
  inp.write_text(json.dumps({"id": "a", "prompt": "Hello", field: value}) + "\n")
  s = datagen.run(tiny(), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=4, on_error="skip",
                  progress=False)
  (err,) = [json.loads(x) for x in open(str(tmp_path / "out.jsonl") + ".errors.jsonl")]
  assert s["bad_lines"] == 1 and f"'{field}': structured output is not available yet" in err["reason"]


def test_openai_response_format_is_parsed_then_refused_by_name(tmp_path):
  schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
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
              {"type": "text", "extra": 1}):
    with pytest.raises(openai_batch.RequestError) as e:
      openai_batch.to_native(_line("a", COMP, {"prompt": "x", "response_format": bad}), max_new_tokens=8)
    assert e.value.field == "response_format"
  lines = [_line("ok", COMP, {"prompt": "Hello", "max_tokens": 3}),
           _line("rf", COMP, {"prompt": "Hello", "response_format": fmt})]
  inp = tmp_path / "in.jsonl"
  inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
  s = datagen.run(tiny(), str(inp), str(tmp_path / "out.jsonl"), max_new_tokens=4, progress=False)
  recs = [json.loads(x) for x in open(tmp_path / "out.jsonl")]
  (err,) = [r for r in recs if r["error"] is not None]
  assert s["bad_lines"] == 1 and err["custom_id"] == "rf"
  assert "body.response_format: structured output is not available yet" in err["error"]["message"]


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
