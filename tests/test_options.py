"""Request options (options.py): one type for a request's own options, validated once, errors naming the field.

Each way in renders a bad value in its own words (Python keywords, a JSON record's quoted field, an OpenAI
body path); checks that need the run (the budget) are apart. No model runs here.
"""
from __future__ import annotations

import pytest

from magicdec_jax.options import FIELDS, OptionError, RequestOptions


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
