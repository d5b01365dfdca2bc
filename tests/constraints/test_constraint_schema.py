"""Constraint specs: which JSON-Schema keywords outlines-core really honours (and so which are refused by name),
malformed schemas / regexes / choices, OpenAI response_format. Host only, no tokenizer: milliseconds."""
from __future__ import annotations

import json
import re

import pytest
from outlines_core.json_schema import build_regex_from_schema

from magicdec_jax.constraints import (SUPPORTED, UNSUPPORTED, Constraint, ConstraintError, make_constraint,
                                      normalize_schema)


def outlines_regex(schema: dict) -> str:
  return build_regex_from_schema(json.dumps(schema))


# keyword -> (a schema without it, the same schema with it): outlines-core's regex does not change.
IGNORED_BY_OUTLINES = {
    "minimum": ({"type": "integer"}, {"type": "integer", "minimum": 5}),
    "maximum": ({"type": "number"}, {"type": "number", "maximum": 5}),
    "exclusiveMinimum": ({"type": "integer"}, {"type": "integer", "exclusiveMinimum": 5}),
    "exclusiveMaximum": ({"type": "integer"}, {"type": "integer", "exclusiveMaximum": 5}),
    "multipleOf": ({"type": "integer"}, {"type": "integer", "multipleOf": 3}),
    "not": ({"type": "string"}, {"type": "string", "not": {"const": "a"}}),
    "if": ({"type": "string"}, {"type": "string", "if": {"const": "a"}, "then": {"maxLength": 1}}),
    "patternProperties": ({"type": "object"}, {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}),
    "propertyNames": ({"type": "object"}, {"type": "object", "propertyNames": {"maxLength": 2}}),
    "dependentRequired": ({"type": "object"}, {"type": "object", "dependentRequired": {"a": ["b"]}}),
    "contains": ({"type": "array"}, {"type": "array", "contains": {"type": "integer"}}),
    "minContains": ({"type": "array"}, {"type": "array", "minContains": 2}),
    "unevaluatedProperties": ({"type": "object"}, {"type": "object", "unevaluatedProperties": False}),
}
# bounds outlines-core reads but honours only at 0 / 1
IGNORED_BOUNDS = {
    "maxProperties above 0": ({"type": "object"}, {"type": "object", "maxProperties": 2}),
    "minProperties above 1": ({"type": "object", "minProperties": 1}, {"type": "object", "minProperties": 3}),
}
# the same for keywords that are refused only in some company (outlines-core keeps one of the two)
IGNORED_TOGETHER = {
    "pattern next to maxLength": ({"type": "string", "maxLength": 3},
                                  {"type": "string", "maxLength": 3, "pattern": "[a-c]+"}),
    "minProperties next to properties": ({"properties": {"a": {"type": "integer"}}},
                                         {"properties": {"a": {"type": "integer"}}, "minProperties": 1}),
    "type next to anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]},
                           {"anyOf": [{"type": "integer"}, {"type": "string"}], "type": "integer"}),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
}


@pytest.mark.parametrize("keyword", sorted(IGNORED_BY_OUTLINES))
def test_keywords_outlines_ignores_are_refused_by_name(keyword):
  """outlines-core builds the same regex with and without the keyword (it would be silently dropped), so
  the spec refuses it, naming it."""
  without, with_it = IGNORED_BY_OUTLINES[keyword]
  assert outlines_regex(without) == outlines_regex(with_it)
  assert keyword in UNSUPPORTED
  with pytest.raises(ConstraintError, match=re.escape(repr(keyword))):
    Constraint.json_schema(with_it)
  Constraint.json_schema(without)


@pytest.mark.parametrize("case", sorted(IGNORED_TOGETHER) + sorted(IGNORED_BOUNDS))
def test_keyword_combinations_outlines_drops_are_refused(case):
  without, with_it = {**IGNORED_TOGETHER, **IGNORED_BOUNDS}[case]
  assert outlines_regex(without) == outlines_regex(with_it)
  with pytest.raises(ConstraintError):
    Constraint.json_schema(with_it)
  Constraint.json_schema(without)


HONOURED = {  # keyword -> (base, with it): outlines-core's regex changes, and the spec keeps it
    "type": ({}, {"type": "integer"}),
    "enum": ({"type": "string"}, {"enum": ["a", "b"]}),
    "const": ({"type": "string"}, {"const": "a"}),
    "anyOf": ({}, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    "properties": ({"type": "object"}, {"properties": {"a": {"type": "integer"}}}),
    "required": ({"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "integer"}},
                                                              "required": ["a"]}),
    "items": ({"type": "array"}, {"type": "array", "items": {"type": "integer"}}),
    "prefixItems": ({"type": "array"}, {"prefixItems": [{"type": "integer"}, {"type": "string"}]}),
    "minItems": ({"type": "array"}, {"type": "array", "minItems": 2}),
    "maxItems": ({"type": "array"}, {"type": "array", "maxItems": 2}),
    "minLength": ({"type": "string"}, {"type": "string", "minLength": 2}),
    "maxLength": ({"type": "string"}, {"type": "string", "maxLength": 2}),
    "pattern": ({"type": "string"}, {"type": "string", "pattern": "[a-z]+"}),
    "format": ({"type": "string"}, {"type": "string", "format": "date"}),
    "minProperties": ({"type": "object"}, {"type": "object", "minProperties": 1}),
    "maxProperties": ({"type": "object"}, {"type": "object", "maxProperties": 0}),
    "additionalProperties": ({"type": "object"}, {"type": "object", "additionalProperties": {"type": "integer"}}),
}


@pytest.mark.parametrize("keyword", sorted(HONOURED))
def test_supported_keywords_change_the_regex(keyword):
  """Every keyword on the supported list really changes what outlines-core generates."""
  base, with_it = HONOURED[keyword]
  assert keyword in SUPPORTED
  assert outlines_regex(normalize_schema(base)) != outlines_regex(normalize_schema(with_it))


def test_annotations_refs_and_single_allof_normalize_away():
  schema = {"$defs": {"Color": {"enum": ["red", "blue"], "title": "Color"}},
            "title": "T", "description": "d", "type": "object",
            "properties": {"c": {"$ref": "#/$defs/Color"}, "n": {"allOf": [{"type": "integer"}],
                                                                    "description": "x"}},
            "required": ["c"]}
  assert normalize_schema(schema) == {"properties": {"c": {"enum": ["red", "blue"]}, "n": {"type": "integer"}},
                                      "required": ["c"]}
  assert normalize_schema({"description": "anything"}) == normalize_schema({})


ANY_TEXTS = ['{"a":1}', '{"a":[1,2]}', '{"a":"x"}', '{"a":null}', '{"a":1,"b":{"c":2}}', '{}', 'null', '7',
             '{5}', '[{"x":1},0]', '{},0]', '[null,3]', '[true,2]', '"x"']


@pytest.mark.parametrize("schema, wanted", [
    ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, ['{"a":1}', '{"a":[1,2]}', '{"a":null}']),
    ({"type": "object", "properties": {"a": {"description": "any"}}, "required": ["a"]}, ['{"a":"x"}']),
    ({"type": "object", "additionalProperties": {}}, ['{"a":1}', '{"a":1,"b":{"c":2}}', '{}']),
    ({"type": "array", "prefixItems": [{}, {"type": "integer"}], "minItems": 2, "maxItems": 2},
     ['[{"x":1},0]', '[null,3]', '[true,2]']),
    ({"$defs": {"A": {}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]},
     ['{"a":1}']),
    ({}, ['null', '7', '"x"', '{"a":1}']),
])
def test_an_any_value_subschema_admits_json_values_only(schema, wanted):
  """{} (or annotations only) inside an object or a prefixItems entry: every text the regex admits is JSON
  that validates against the schema (jsonschema), and the wanted ones are admitted."""
  jsonschema = pytest.importorskip("jsonschema")
  regex = outlines_regex(normalize_schema(schema))

  def valid(text):
    try:
      jsonschema.validate(json.loads(text), schema)
      return True
    except (ValueError, jsonschema.ValidationError):
      return False
  admitted = [t for t in ANY_TEXTS if re.fullmatch(regex, t)]
  assert all(valid(t) for t in admitted), [t for t in admitted if not valid(t)]
  assert set(wanted) <= set(admitted)


def test_integers_outlines_core_cannot_write_exactly_are_refused():
  for value in (2 ** 64, -2 ** 63 - 1, 123456789012345678901234567890):
    for schema in ({"const": value}, {"enum": [1, value]}, {"const": {"a": [value]}}):
      with pytest.raises(ConstraintError, match=f"integer {value} in a const / enum value"):
        normalize_schema(schema)
  for value in (2 ** 64 - 1, -2 ** 63):        # written exactly
    assert re.fullmatch(outlines_regex(normalize_schema({"const": value})), str(value))


@pytest.mark.parametrize("schema, needle", [
    ('{"type": "object",', "not valid JSON"),
    ([1, 2], "must be a JSON object"),
    ({"type": "strin"}, "unknown type 'strin'"),
    ({"type": "string", "maxLenght": 3}, "unknown keyword 'maxLenght'"),
    ({"type": "string", "minLength": 4, "maxLength": 3}, "minLength 4 > maxLength 3"),
    ({"type": "string", "maxLength": -1}, "maxLength must be a non-negative integer"),
    ({"type": "string", "format": "hostname"}, "format 'hostname' is not supported"),
    ({"type": "string", "pattern": "a(^b)"}, "the anchor '^' inside it"),
    ({"type": "string", "pattern": "(?=a)a"}, "is not a regex outlines-core compiles"),
    ({"properties": {"a": {}}, "required": ["b"]}, "required property 'b' is not in properties"),
    ({"properties": {"a": {}}, "type": "string"}, "the value generated is an object"),
    ({"$ref": "#/$defs/X"}, "does not resolve"),
    ({"$ref": "https://example.com/s.json"}, "only references inside the schema"),
    ({"$defs": {"N": {"properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"}, "recursive $ref"),
    ({"allOf": [{"type": "integer"}, {"type": "number"}]}, "allOf of 2 schemas"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf of 2 schemas"),
    ({"anyOf": []}, "anyOf must be a non-empty list"),
    ({"enum": [1, "a"], "type": "string"}, "value 1 is not of type 'string'"),
    ({"type": "object", "additionalProperties": False}, "additionalProperties: false without properties"),
    ({"type": "object", "required": ["a"]}, "required without properties"),
    ({"properties": {"a": True}}, "boolean schema true"),
    (False, "boolean schema false"),
    ({"prefixItems": [{}], "minItems": 2}, "generates exactly 1 items"),
    ({"const": {"a.b": 1}}, "object key 'a.b'"),
    ({"properties": {'say "hi"': {}}}, "names needing JSON escapes"),
    ({"maxLength": 3}, "need a type"),
    ({"type": "array", "prefixItems": [{}], "items": 5}, "at #/items: a schema must be a JSON object"),
    ({"properties": {"a": {}}, "additionalProperties": {"not": {}}}, "at #/additionalProperties: keyword 'not'"),
    ({"enum": [b"x"]}, "holds a value JSON cannot: Object of type bytes"),      # a ConstraintError, not a TypeError
    ({"const": float("nan")}, "holds a value JSON cannot"),
])
def test_malformed_or_unsupported_schemas_raise_naming_the_problem(schema, needle):
  with pytest.raises(ConstraintError, match=re.escape(needle)):
    Constraint.json_schema(schema)


def test_schema_as_json_text_equals_dict():
  schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
  assert Constraint.json_schema(json.dumps(schema)) == Constraint.json_schema(schema)
  # property order is the generation order: it is part of the canonical spec
  reordered = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
  assert Constraint.json_schema(reordered) != Constraint.json_schema(schema)


@pytest.mark.parametrize("pattern, needle", [
    ("(", "malformed or unsupported regex"),
    ("a{3,1}", "malformed or unsupported regex"),
    ("(?=a)b", "look-around"),
    (r"(a)\1", "backreference"),
    (5, "regex must be a non-empty string"),
    ("", "regex must be a non-empty string"),
    ("a(^b)", "the anchor '^' inside it"),
    ("(?x) a # b", "verbose mode"),
])
def test_bad_regex_raises(pattern, needle):
  with pytest.raises(ConstraintError, match=re.escape(needle)):
    Constraint.regex(pattern)


def test_rust_syntax_regex_is_accepted():
  assert Constraint.regex(r"\p{Greek}+").spec == r"\p{Greek}+"


def test_anchors_at_the_ends_are_what_a_whole_match_means():
  assert Constraint.regex(r"^ab$") == Constraint.regex(r"\Aab\z") == Constraint.regex("ab")
  assert Constraint.regex("^a$|^b$") == Constraint.regex("a|b")


@pytest.mark.parametrize("options, needle", [([], "choices is empty"), ("abc", "list of strings"),
                                             (["a", 3], "choices must be non-empty strings"), (None, "list of strings"),
                                             (["a", ""], "choices must be non-empty strings")])
def test_bad_choices_raise(options, needle):
  with pytest.raises(ConstraintError, match=re.escape(needle)):
    Constraint.choices(options)


def test_response_format():
  schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
  rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
  assert Constraint.response_format(rf) == Constraint.json_schema(schema)
  assert Constraint.response_format({"type": "json_object"}) == Constraint.json_schema({"type": "object"})
  assert Constraint.response_format({"type": "text"}) is None
  for bad, needle in [({"type": "xml"}, "type 'xml'"), ({"type": "json_object", "schema": {}}, "'schema'"),
                      ({"type": "json_schema", "json_schema": {"name": "x"}}, "no 'schema'"),
                      ({"type": "json_schema", "json_schema": {"schema": {}, "stric": True}}, "'stric'"),
                      ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "strict must be"),
                      ("json", "must be an object")]:
    with pytest.raises(ConstraintError, match=re.escape(needle)):
      Constraint.response_format(bad)


def test_make_constraint_takes_one():
  assert make_constraint() is None
  assert make_constraint(regex="a+") == Constraint.regex("a+")
  assert make_constraint(choices=["x"]) == Constraint.choices(["x"])
  with pytest.raises(ConstraintError, match="one constraint, got regex, choices"):
    make_constraint(regex="a", choices=["a"])
  with pytest.raises(ConstraintError, match="kind 'grammar'"):
    Constraint("grammar", "x")


def test_a_schema_that_doubles_at_every_ref_is_refused_before_it_is_built():
  """Twenty levels of an array of two $refs to the level below: 2^20 subschemas once inlined (it ran for
  minutes and tens of megabytes); a size limit refuses it at once, naming why."""
  defs = {"A0": {"type": "integer"}}
  for i in range(1, 21):
    defs[f"A{i}"] = {"type": "array", "prefixItems": [{"$ref": f"#/$defs/A{i - 1}"}] * 2}
  with pytest.raises(ConstraintError, match="more than 20,000 subschemas once its \\$refs are inlined"):
    Constraint.json_schema({"$defs": defs, "$ref": "#/$defs/A20"})
  defs = {"A0": {"type": "integer"}}
  for i in range(1, 6):                                         # 2^5: fine
    defs[f"A{i}"] = {"type": "array", "prefixItems": [{"$ref": f"#/$defs/A{i - 1}"}] * 2}
  Constraint.json_schema({"$defs": defs, "$ref": "#/$defs/A5"})
