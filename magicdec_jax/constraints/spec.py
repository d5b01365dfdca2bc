"""What a request's output must match: a JSON schema, a regex, one of a list of strings, or an OpenAI
`response_format` - checked and put in one canonical form (`Constraint`) before anything is compiled.

Every kind ends as a regular expression in the Rust `regex` crate's syntax (what outlines-core compiles),
matched against the whole output text, byte for byte: a JSON schema through `schema.normalize_schema`, a
list of choices as the alternation of their escaped texts, a regex as given.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.schema import normalize_schema, schema_regex
from magicdec_jax.constraints.index import byte_index, escape
from magicdec_jax.constraints.pattern import strip_anchors

KINDS = ("json_schema", "regex", "choices")
ANY_OBJECT = {"type": "object"}                 # response_format json_object: any JSON object
# Constructs of Python's `re` that are not regular, which the Rust syntax refuses: named in the error.
_NOT_REGULAR = re.compile(r"\(\?<?[=!]|(?<!\\)\\[1-9]|\(\?P=")


@dataclasses.dataclass(frozen=True)
class Constraint:
  """A checked constraint in canonical form. kind: one of KINDS; spec: the normalized schema's JSON text,
  the regex, or the JSON list of choices. Equal constraints compile to the same automaton (the compile
  cache is keyed by them)."""
  kind: str
  spec: str

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ConstraintError(f"constraint kind {self.kind!r} is not one of {', '.join(KINDS)}")

  @classmethod
  def json_schema(cls, schema: Any) -> "Constraint":
    """A JSON schema (a dict or its JSON text); keywords checked by `schema.normalize_schema`."""
    return cls("json_schema", json.dumps(normalize_schema(schema), ensure_ascii=False, separators=(",", ":")))

  @classmethod
  def regex(cls, pattern: Any) -> "Constraint":
    """A regular expression (Rust `regex` syntax) the whole output must match (anchors at its ends are
    redundant and dropped: pattern.strip_anchors)."""
    if not isinstance(pattern, str) or not pattern:
      raise ConstraintError(f"regex must be a non-empty string, got {pattern!r:.60}")
    pattern = strip_anchors(pattern)
    try:
      byte_index(pattern)
    except ConstraintError as e:
      if "incompatible" in str(e):
        raise ConstraintError(f"regex {pattern!r:.80} needs characters U+100000-U+10FFFF somewhere, which "
                              "constrained decoding never emits: no text of it can be generated") from e
      found = _NOT_REGULAR.search(pattern)
      if found:
        raise ConstraintError(f"regex {pattern!r:.80}: {found.group()!r} (look-around or a backreference) is "
                              "not supported: the output must be matched by a finite automaton") from e
      try:
        re.compile(pattern)
        hint = "Rust regex syntax"
      except re.error as py:
        hint = f"Python's re says: {py}"
      raise ConstraintError(f"malformed or unsupported regex {pattern!r:.80} ({hint}): {e}") from e
    return cls("regex", pattern)

  @classmethod
  def choices(cls, options: Any) -> "Constraint":
    """Exactly one of `options` (strings), in full."""
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
      raise ConstraintError(f"choices must be a list of strings, got {options!r:.60}")
    if not options:
      raise ConstraintError("choices is empty: no output would be allowed")
    bad = [o for o in options if not isinstance(o, str) or not o]
    if bad:
      raise ConstraintError(f"choices must be non-empty strings, got {bad[0]!r:.60}")
    return cls("choices", json.dumps(list(dict.fromkeys(options)), ensure_ascii=False))

  @classmethod
  def response_format(cls, obj: Any) -> "Constraint | None":
    """An OpenAI `response_format` (response_format_schema) as a constraint; None for {"type": "text"}."""
    schema = response_format_schema(obj)
    return None if schema is None else cls.json_schema(schema)

  def to_regex(self) -> str:
    """The regex (Rust syntax) whose full matches are exactly the allowed output texts."""
    if self.kind == "regex":
      return self.spec
    if self.kind == "choices":
      return "|".join(escape(o) for o in json.loads(self.spec))
    return schema_regex(json.loads(self.spec))


def response_format_schema(obj: Any) -> Any:
  """The schema an OpenAI `response_format` asks for: {"type": "json_schema", "json_schema": {"name",
  "schema", "strict", "description"}} its schema (enforced whatever `strict` says), {"type": "json_object"}
  any JSON object, {"type": "text"} None (unconstrained). ConstraintError naming a bad or unknown field."""
  if not isinstance(obj, Mapping):
    raise ConstraintError(f"response_format must be an object, got {obj!r:.60}")
  kind = obj.get("type")
  fields = {"json_schema": {"type", "json_schema"}, "json_object": {"type"}, "text": {"type"}}
  if kind not in fields:
    raise ConstraintError(f"response_format type {kind!r} is not one of {', '.join(fields)}")
  stray = sorted(set(obj) - fields[kind])
  if stray:
    raise ConstraintError(f"response_format of type {kind!r} has unknown field {stray[0]!r}")
  if kind == "text":
    return None
  if kind == "json_object":
    return dict(ANY_OBJECT)
  spec = obj.get("json_schema")
  if not isinstance(spec, Mapping):
    raise ConstraintError(f"response_format json_schema must be an object, got {spec!r:.60}")
  stray = sorted(set(spec) - {"name", "schema", "strict", "description"})
  if stray:
    raise ConstraintError(f"response_format json_schema has unknown field {stray[0]!r}")
  if "schema" not in spec:
    raise ConstraintError("response_format json_schema has no 'schema'")
  for key, types in (("name", str), ("description", str), ("strict", bool)):
    if spec.get(key) is not None and not isinstance(spec[key], types):
      raise ConstraintError(f"response_format json_schema {key} must be a {types.__name__}, "
                            f"got {spec[key]!r:.60}")
  return spec["schema"]


def make_constraint(*, json_schema: Any = None, regex: Any = None, choices: Any = None,
                    response_format: Any = None) -> Constraint | None:
  """The request's constraint from whichever one of its fields is set (None: unconstrained); two set is an
  error naming them."""
  given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("choices", choices),
                             ("response_format", response_format)) if v is not None}
  if len(given) > 1:
    raise ConstraintError(f"a request takes one constraint, got {', '.join(given)}")
  if not given:
    return None
  (kind, value), = given.items()
  return getattr(Constraint, kind)(value)
