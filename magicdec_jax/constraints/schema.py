"""JSON Schema -> a regular expression over the JSON text, through outlines-core, honouring every keyword.

outlines-core's `build_regex_from_schema` picks one keyword per schema object and ignores the rest (a
`maximum`, a `pattern` next to a `maxLength`, the siblings of an `anyOf`); its `allOf` concatenates the
sub-schemas' texts; a recursive `$ref` drops the property it reaches. So every schema is first checked and
normalized here: each keyword is either honoured by what outlines-core then generates, or only an
annotation, or refused by name (`ConstraintError`). The normalized schema has no annotations, no `$ref`
(references are inlined; recursive ones are refused), no `format` (rewritten to a pattern that also keeps the
JSON string valid) and one keyword family per object, so outlines-core sees exactly what it implements.

What is honoured (SUPPORTED): `type` (one name or a list), `enum`, `const`, `anyOf`, a one-schema `allOf` /
`oneOf`, local `$ref`, `properties` + `required` (properties are generated in the schema's order, no others),
strings' `minLength` / `maxLength` or `pattern` (read as ECMA-262 over the string's unescaped characters:
pattern.py) or `format` (date, date-time, time, uuid, uri, email), arrays'
`items`, `prefixItems`, `minItems` / `maxItems`, objects' (without `properties`) `additionalProperties`,
`minProperties` 0 or 1 and `maxProperties` 0 (outlines-core tells only empty from non-empty). Anything else - `minimum`, `multipleOf`, `uniqueItems: true`, `not`,
`if`, `patternProperties`, ... - is refused by name.
"""
from __future__ import annotations

import json
import math
import re
import urllib.parse
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.pattern import json_string_pattern

# Keywords that never change which values are valid: dropped.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "$schema", "$id",
                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions"})
TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")
# Keywords honoured under each `type` (besides `type` itself).
TYPE_KEYWORDS = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset(), "integer": frozenset(), "boolean": frozenset(), "null": frozenset(),
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
    "object": frozenset({"additionalProperties", "minProperties", "maxProperties", "required"}),
}
SUPPORTED = frozenset({"type", "enum", "const", "anyOf", "allOf", "oneOf", "$ref", "properties", "required",
                       "additionalProperties", "prefixItems"}).union(*TYPE_KEYWORDS.values())
# JSON-Schema keywords outlines-core does not implement (named as such when refused).
UNSUPPORTED = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems", "contains", "minContains", "maxContains", "additionalItems",
    "contentEncoding", "contentMediaType", "contentSchema", "$anchor", "$dynamicRef", "$dynamicAnchor",
    "$recursiveRef", "$recursiveAnchor", "$vocabulary", "nullable", "discriminator"})

# `format` -> a pattern inside the quotes: only characters a JSON string holds unescaped, and only values the
# format's RFC accepts (RFC 3339 dates and times with an offset, days that exist in their month).
_DAY = (r"((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
        r"02-(0[1-9]|1[0-9]|2[0-8]))")
_LEAP = r"([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29"
_DATE = rf"([0-9]{{4}}-{_DAY}|{_LEAP})"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_URI_CHARS = r"[A-Za-z0-9._~!$&'()*+,;=:@-]"
FORMAT_PATTERNS = {
    "date": _DATE,
    "date-time": rf"{_DATE}T{_TIME}",
    "time": _TIME,
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "uri": rf"(https?|ftp)://{_LABEL}(\.{_LABEL})*(:[0-9]{{1,5}})?(/{_URI_CHARS}*)*(\?({_URI_CHARS}|/)*)?",
    "email": rf"[A-Za-z0-9_+-]+(\.[A-Za-z0-9_+-]+)*@{_LABEL}(\.{_LABEL})+",
}
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_ ]*")        # object keys outlines-core writes unescaped in const / enum


def _refuse(path: str, message: str):
  raise ConstraintError(f"JSON schema at {path}: {message}")


def _count(node: dict, key: str, path: str) -> int | None:
  v = node.get(key)
  if v is None:
    return None
  if isinstance(v, bool) or not isinstance(v, int) or v < 0:
    _refuse(path, f"{key} must be a non-negative integer, got {v!r}")
  return v


def _bounds(node: dict, lo: str, hi: str, path: str) -> None:
  a, b = _count(node, lo, path), _count(node, hi, path)
  if a is not None and b is not None and a > b:
    _refuse(path, f"{lo} {a} > {hi} {b}: no value fits")


def _types(node: dict, path: str) -> list[str]:
  t = node["type"]
  types = [t] if isinstance(t, str) else t
  if not isinstance(types, list) or not types or not all(isinstance(x, str) for x in types):
    _refuse(path, f"type must be a type name or a non-empty list of them, got {t!r}")
  bad = [x for x in types if x not in TYPES]
  if bad:
    _refuse(path, f"unknown type {bad[0]!r} (known: {', '.join(TYPES)})")
  if len(set(types)) != len(types):
    _refuse(path, f"type lists {t!r} with repeats")
  return types


def _conforms(value: Any, types: list[str]) -> bool:
  kind = {bool: "boolean", str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value))
  if kind is None and isinstance(value, (int, float)):
    kind = "integer" if float(value).is_integer() else "number"
  return kind in types or (kind == "integer" and "number" in types)


def _check_constant(value: Any, path: str) -> None:
  if isinstance(value, dict):
    for k, v in value.items():
      if not _PLAIN_KEY.fullmatch(k):
        _refuse(path, f"object key {k!r} in a const / enum value: only letters, digits, '_' and spaces are "
                "written exactly by outlines-core")
      _check_constant(v, path)
  elif isinstance(value, list):
    for v in value:
      _check_constant(v, path)
  elif isinstance(value, float) and not math.isfinite(value):
    _refuse(path, f"{value!r} is not a JSON value")
  elif type(value) is int and not -2 ** 63 <= value < 2 ** 64:
    _refuse(path, f"integer {value} in a const / enum value: outlines-core writes integers outside "
            "[-2**63, 2**64) as a rounded float, another number")


def _resolve(root: dict, ref: Any, path: str) -> Any:
  if not isinstance(ref, str):
    _refuse(path, f"$ref must be a string, got {ref!r}")
  base, sep, fragment = ref.partition("#")
  if not sep or (base and base != root.get("$id")):
    _refuse(path, f"$ref {ref!r}: only references inside the schema ('#/...') are supported")
  if fragment and not fragment.startswith("/"):
    _refuse(path, f"$ref {ref!r}: anchors are not supported, use a JSON pointer ('#/$defs/Name')")
  node = root
  for part in fragment.split("/")[1:]:
    part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
    if isinstance(node, dict) and part in node:
      node = node[part]
    elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
      node = node[int(part)]
    else:
      _refuse(path, f"$ref {ref!r} does not resolve (no {part!r})")
  return node


# Any JSON value ({} or a schema of annotations only) as outlines-core is given it: its any-value regex is an
# alternation it leaves ungrouped inside an object's property or a prefixItems entry, which an anyOf groups.
ANY_VALUE = {"anyOf": [{}]}


MAX_SUBSCHEMAS = 20_000   # subschemas after inlining $ref: past it the regex takes minutes to build, or never


class _Normalizer:
  """One pass over a schema: checks every keyword and returns what outlines-core is given."""

  def __init__(self, root: dict):
    self.root = root
    self.refs: list[str] = []
    self.nodes = 0

  def node(self, node: Any, path: str) -> dict:
    self.nodes += 1
    if self.nodes > MAX_SUBSCHEMAS:
      _refuse(path, f"the schema expands to more than {MAX_SUBSCHEMAS:,} subschemas once its $refs are inlined: "
              "too large to compile (a $ref used twice at every level doubles it)")
    if isinstance(node, bool):
      _refuse(path, f"boolean schema {str(node).lower()} is not supported (write {{}} for any value)")
    if not isinstance(node, dict):
      _refuse(path, f"a schema must be a JSON object, got {node!r:.60}")
    keys = set(node) - ANNOTATIONS
    unsupported = sorted(keys & UNSUPPORTED)
    if unsupported:
      _refuse(path, f"keyword {unsupported[0]!r} is not supported by the structured-output compiler "
              f"(outlines-core ignores it); supported: {', '.join(sorted(SUPPORTED))}")
    unknown = sorted(keys - SUPPORTED)
    if unknown:
      _refuse(path, f"unknown keyword {unknown[0]!r}; supported: {', '.join(sorted(SUPPORTED))}")
    for single in ("$ref", "anyOf", "allOf", "oneOf"):
      if single in keys:
        if keys != {single}:
          _refuse(path, f"{single} with sibling keywords {sorted(keys - {single})}: outlines-core would "
                  f"ignore them (move them into the {single})")
        return getattr(self, single.strip("$").lower())(node[single], path)
    if "enum" in keys or "const" in keys:
      return self.constant(node, keys, path)
    if "properties" in keys:
      return self.properties(node, keys, path)
    if "prefixItems" in keys:
      return self.prefix_items(node, keys, path)
    if "type" in keys:
      return self.typed(node, keys, path)
    if keys:
      _refuse(path, f"keywords {sorted(keys)} need a type at this schema")
    return ANY_VALUE

  def ref(self, ref: Any, path: str) -> dict:
    if ref in self.refs:
      _refuse(path, f"recursive $ref {ref!r} is not supported (outlines-core cuts it and drops properties)")
    self.refs.append(ref)
    try:
      return self.node(_resolve(self.root, ref, path), f"{path} -> {ref}")
    finally:
      self.refs.pop()

  def _list(self, value: Any, key: str, path: str) -> list:
    if not isinstance(value, list) or not value:
      _refuse(path, f"{key} must be a non-empty list, got {value!r:.60}")
    return value

  def anyof(self, value: Any, path: str) -> dict:
    subs = self._list(value, "anyOf", path)
    return {"anyOf": [self.node(s, f"{path}/anyOf/{i}") for i, s in enumerate(subs)]}

  def allof(self, value: Any, path: str) -> dict:
    subs = self._list(value, "allOf", path)
    if len(subs) != 1:
      _refuse(path, f"allOf of {len(subs)} schemas is not supported (outlines-core concatenates them)")
    return self.node(subs[0], f"{path}/allOf/0")

  def oneof(self, value: Any, path: str) -> dict:
    subs = self._list(value, "oneOf", path)
    if len(subs) != 1:
      _refuse(path, f"oneOf of {len(subs)} schemas is not supported (outlines-core would generate values "
              "matching several); use anyOf when the branches exclude each other")
    return self.node(subs[0], f"{path}/oneOf/0")

  def constant(self, node: dict, keys: set, path: str) -> dict:
    if keys - {"enum", "const", "type"} or {"enum", "const"} <= keys:
      _refuse(path, f"enum / const with {sorted(keys - {'type'})}: only one of enum, const (and a type)")
    values = [node["const"]] if "const" in keys else self._list(node["enum"], "enum", path)
    types = _types(node, path) if "type" in keys else None
    for v in values:
      _check_constant(v, path)
      if types is not None and not _conforms(v, types):
        _refuse(path, f"value {v!r:.40} is not of type {node['type']!r}")
    return {"const": values[0]} if "const" in keys else {"enum": list(values)}

  def properties(self, node: dict, keys: set, path: str) -> dict:
    extra = keys - {"properties", "required", "type", "additionalProperties"}
    if extra:
      _refuse(path, f"keyword {sorted(extra)[0]!r} next to properties is not supported (outlines-core "
              "ignores it there)")
    if "type" in keys and "object" not in _types(node, path):
      _refuse(path, f"properties with type {node['type']!r}: the value generated is an object")
    props = node["properties"]
    if not isinstance(props, dict):
      _refuse(path, f"properties must be an object, got {props!r:.60}")
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
      _refuse(path, f"required must be a list of property names, got {required!r:.60}")
    missing = [r for r in required if r not in props]
    if missing:
      _refuse(path, f"required property {missing[0]!r} is not in properties (it would never be generated)")
    for name in props:
      if any(c in name for c in '"\\') or any(ord(c) < 0x20 for c in name):
        _refuse(path, f"property name {name!r}: names needing JSON escapes are not supported")
    self.unused(node, "additionalProperties", path)        # no property but these is generated
    out = {"properties": {k: self.node(v, f"{path}/properties/{k}") for k, v in props.items()}}
    if required:
      out["required"] = list(dict.fromkeys(required))
    return self.or_other_types(out, node, "object", path)

  def unused(self, node: dict, key: str, path: str) -> None:
    """A subschema that never applies to what is generated (the items past prefixItems, the properties
    besides `properties`): still checked, so that nothing in it is ignored unseen."""
    if key in node and not isinstance(node[key], bool):
      self.node(node[key], f"{path}/{key}")

  def or_other_types(self, out: dict, node: dict, generated: str, path: str) -> dict:
    """`out` (a value of type `generated`), or any other type the node's type list names."""
    others = [t for t in _types(node, path) if t != generated] if "type" in node else []
    return {"anyOf": [out] + [{"type": t} for t in others]} if others else out

  def prefix_items(self, node: dict, keys: set, path: str) -> dict:
    extra = keys - {"prefixItems", "type", "items", "minItems", "maxItems"}
    if extra:
      _refuse(path, f"keyword {sorted(extra)[0]!r} next to prefixItems is not supported")
    if "type" in keys and "array" not in _types(node, path):
      _refuse(path, f"prefixItems with type {node['type']!r}: the value generated is an array")
    subs = self._list(node["prefixItems"], "prefixItems", path)
    lo, hi = _count(node, "minItems", path), _count(node, "maxItems", path)
    if (lo is not None and lo > len(subs)) or (hi is not None and hi < len(subs)):
      _refuse(path, f"prefixItems of {len(subs)} with minItems {lo} / maxItems {hi}: outlines-core generates "
              f"exactly {len(subs)} items")
    self.unused(node, "items", path)                      # no item past the prefix is generated
    out = {"prefixItems": [self.node(s, f"{path}/prefixItems/{i}") for i, s in enumerate(subs)]}
    return self.or_other_types(out, node, "array", path)

  def typed(self, node: dict, keys: set, path: str) -> dict:
    types = _types(node, path)
    allowed = frozenset().union(*(TYPE_KEYWORDS[t] for t in types))
    stray = sorted(keys - allowed - {"type"})
    if stray:
      _refuse(path, f"keyword {stray[0]!r} does not apply to type {node['type']!r}")
    out: dict[str, Any] = {"type": node["type"]}
    if "string" in types:
      given = [k for k in ("minLength", "maxLength", "pattern", "format") if k in keys]
      if len({"length" if k.endswith("Length") else k for k in given}) > 1:
        _refuse(path, f"{' and '.join(given)} together: outlines-core honours only one of a length bound, a "
                "pattern and a format")
      _bounds(node, "minLength", "maxLength", path)
      out.update({k: node[k] for k in ("minLength", "maxLength") if k in keys})
      if "pattern" in keys:
        out["pattern"] = self.pattern(node["pattern"], path)
      if "format" in keys:
        if node["format"] not in FORMAT_PATTERNS:
          _refuse(path, f"format {node['format']!r} is not supported (supported: {', '.join(FORMAT_PATTERNS)})")
        out["pattern"] = FORMAT_PATTERNS[node["format"]]
    if "array" in types:
      if node.get("uniqueItems", False) is not False:
        _refuse(path, "uniqueItems: true is not supported (outlines-core ignores it)")
      _bounds(node, "minItems", "maxItems", path)
      out.update({k: node[k] for k in ("minItems", "maxItems") if k in keys})
      if "items" in keys:
        out["items"] = self.node(node["items"], f"{path}/items")
    if "object" in types:
      if node.get("required"):
        _refuse(path, "required without properties is not supported (the required keys would not be generated)")
      _bounds(node, "minProperties", "maxProperties", path)
      if _count(node, "minProperties", path) not in (None, 0, 1):
        _refuse(path, "minProperties above 1 is not supported (outlines-core only tells empty from non-empty)")
      if _count(node, "maxProperties", path) not in (None, 0):
        _refuse(path, "maxProperties above 0 is not supported (outlines-core ignores it)")
      out.update({k: node[k] for k in ("minProperties", "maxProperties") if k in keys})
      extra = node.get("additionalProperties", True)
      if extra is False:
        _refuse(path, "additionalProperties: false without properties is not supported (write "
                "{\"const\": {}} for the empty object)")
      if extra is not True:
        out["additionalProperties"] = self.node(extra, f"{path}/additionalProperties")
    return out

  @staticmethod
  def pattern(p: Any, path: str) -> str:
    if not isinstance(p, str):
      _refuse(path, f"pattern must be a string, got {p!r:.60}")
    try:
      return json_string_pattern(p)
    except ConstraintError as e:
      if "cannot compile" not in str(e):
        _refuse(path, str(e))
      _refuse(path, f"pattern {p!r} is not a regex outlines-core compiles (Rust syntax: no look-around, no "
              f"backreferences): {e}")


def normalize_schema(schema: Any) -> dict:
  """`schema` (a dict, or its JSON text) checked keyword by keyword -> the schema outlines-core is given.
  Raises ConstraintError naming the first keyword or value that cannot be honoured exactly."""
  if isinstance(schema, (str, bytes)):
    try:
      schema = json.loads(schema)
    except ValueError as e:
      raise ConstraintError(f"JSON schema is not valid JSON: {e}") from e
  if not isinstance(schema, (dict, bool)):
    raise ConstraintError(f"a JSON schema must be a JSON object, got {schema!r:.60}")
  try:                      # as JSON would carry it (keys strings); a value JSON has no form for is refused
    schema = json.loads(json.dumps(schema, allow_nan=False))
  except (TypeError, ValueError) as e:
    raise ConstraintError(f"the JSON schema holds a value JSON cannot: {e}") from None
  return _Normalizer(schema).node(schema, "#")       # (a boolean one is refused there, as when nested)


def schema_regex(normalized: dict) -> str:
  """The regex outlines-core generates for a normalized schema (`normalize_schema`)."""
  try:
    return build_regex_from_schema(json.dumps(normalized))
  except (ValueError, TypeError) as e:
    raise ConstraintError(f"outlines-core cannot compile the JSON schema: {e}") from e
