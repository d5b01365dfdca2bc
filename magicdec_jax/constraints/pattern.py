"""Regex patterns made ready for the automaton, which matches the whole text anyway: anchors at the ends of
the pattern's top-level alternatives dropped (any other refused by name), and a JSON Schema `pattern` read
as ECMA-262 reads it (`\\d` is [0-9], `.` no line break) over the string's characters, restricted to those
a JSON string holds unescaped (`"` and `\\` written escaped), so that every text it allows is valid JSON.
"""
from __future__ import annotations

import re

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.index import PREFIX, byte_index

SPECIAL = r"\x{0}-\x{1f}\x{22}\x{5c}"        # characters a JSON string holds only escaped
_SPACE = r" \t\n\x{b}\f\r\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}"
ECMA = {"d": "0-9", "w": "A-Za-z0-9_", "s": _SPACE}                 # ECMA-262's classes, ASCII digits / words
_FLAGS = re.compile(r"\(\?([a-zA-Z-]*)(\)|:)")


def _escape_end(p: str, i: int) -> int:
  """The index past the escape starting at p[i] == '\\'."""
  if i + 1 >= len(p):
    raise ConstraintError(f"pattern {p!r:.80} ends in a lone backslash")
  c = p[i + 1]
  if c in "xuUpP" and p[i + 2:i + 3] == "{":
    end = p.find("}", i + 2)
    return len(p) if end < 0 else end + 1
  return i + {"x": 4, "u": 6, "U": 10, "p": 3, "P": 3}.get(c, 2)


def _class_end(p: str, i: int, ecma: bool = False) -> int:
  """The index past the character class starting at p[i] == '[': nested classes included (Rust's syntax),
  or with `ecma` none (ECMA-262 and Python's re, which validates JSON: a '[' inside is a member)."""
  j, depth = i + 1, 1
  j += p[j:j + 1] == "^"
  j += p[j:j + 1] == "]"                       # a leading ']' is a member
  while j < len(p):
    if p[j] == "\\":
      j = _escape_end(p, j)
      continue
    depth += {"[": 0 if ecma else 1, "]": -1}.get(p[j], 0)
    j += 1
    if depth == 0:
      return j
  raise ConstraintError(f"pattern {p!r:.80}: unterminated character class")


def tokens(p: str, ecma: bool = False) -> list[tuple[str, str, int]]:
  """p as (text, kind, group depth) tokens; kinds: esc, class, open, flags, close, alt, start, end, dot, lit.
  ecma: classes as ECMA-262 reads them (no nesting), and no Unicode property escapes (Python's re, which
  validates a JSON Schema pattern, has none)."""
  out, i, depth = [], 0, 0
  while i < len(p):
    c, kind = p[i], "lit"
    if c == "\\":
      j = _escape_end(p, i)
      kind = {"\\A": "start", "\\z": "end", "\\Z": "end"}.get(p[i:j], "esc")
      if ecma and p[i + 1] in "pP":
        raise ConstraintError(f"pattern {p!r:.80}: the Unicode property escape {p[i:j]} is not supported")
    elif c == "[":
      j, kind = _class_end(p, i, ecma), "class"
    elif c == "(":
      m = _FLAGS.match(p, i)
      if m and "x" in m.group(1).split("-")[0]:
        raise ConstraintError(f"pattern {p!r:.80}: verbose mode (x flag) is not supported; write the pattern "
                              "without its spaces and comments")
      j = m.end() if m else i + 1 + (len(re.match(r"\?(P?<[A-Za-z_]\w*>|[=!]|<[=!])?", p[i + 1:]).group())
                                     if p[i + 1:i + 2] == "?" else 0)
      kind = "flags" if m and m.group(2) == ")" else "open"
    else:
      j = i + 1
      kind = {")": "close", "|": "alt", "^": "start", "$": "end", ".": "dot"}.get(c, "lit")
    depth -= kind == "close"
    out.append((p[i:j], kind, depth))
    depth += kind == "open"
    i = j
  return out


def _alternatives(toks: list) -> list[list]:
  alts = [[]]
  for t in toks:
    if t[1] == "alt" and t[2] == 0:
      alts.append([])
    else:
      alts[-1].append(t)
  return alts


def strip_anchors(p: str, ecma: bool = False) -> str:
  """p without the anchors (^, \\A; $, \\z) at the ends of its top-level alternatives, which a whole-text
  match makes redundant; an anchor elsewhere (which no text past its first character can meet) is refused."""
  alts = []
  for alt in _alternatives(tokens(p, ecma)):
    lead = 0
    while lead < len(alt) and alt[lead][1] in ("start", "flags"):
      lead += 1
    tail = len(alt)
    while tail > lead and alt[tail - 1][1] == "end":
      tail -= 1
    kept = [t for t in alt[:lead] if t[1] == "flags"] + alt[lead:tail]
    inner = [t[0] for t in kept if t[1] in ("start", "end")]
    if inner:
      raise ConstraintError(f"pattern {p!r:.80}: the anchor {inner[0]!r} inside it is not supported (anchors "
                            "only at the start and end of the pattern or of a top-level alternative)")
    alts.append(kept)
  return "|".join("".join(t[0] for t in alt) for alt in alts)


def _class_body(body: str) -> str:
  """An ECMA class's members in Rust's syntax: ECMA's \\d \\w \\s (and their negations as nested classes);
  '[', '&' and '~' escaped (members in ECMA, nesting and set operators in Rust); '--' refused (a range to
  or from '-' in ECMA, a set difference in Rust)."""
  out, i = [], 0
  while i < len(body):
    if body.startswith("--", i):
      raise ConstraintError(f"character class [{body}]: '--' is not supported (escape the '-': \\-)")
    if body[i] != "\\":
      out.append("\\" + body[i] if body[i] in "[&~" else body[i])
      i += 1
      continue
    j = _escape_end(body, i)
    e = body[i + 1:j]
    if e[:1] in ("p", "P"):
      raise ConstraintError(f"character class [{body}]: the Unicode property escape \\{e} is not supported")
    out.append(ECMA[e] if e in ECMA else f"[^{ECMA[e.lower()]}]" if e.lower() in ECMA and len(e) == 1
               else e if e in ('"', "/") else body[i:j])
    i = j
  return "".join(out)


def _json_token(text: str, kind: str) -> str:
  if kind == "class":
    neg = text.startswith("[^")
    return f"[[{'^' if neg else ''}{_class_body(text[2 if neg else 1:-1])}]--[{SPECIAL}]]"
  if kind == "dot":
    return f"[[^\\n\\r\\x{{2028}}\\x{{2029}}]--[{SPECIAL}]]"
  if kind == "lit" and text == '"' or kind == "esc" and text in ('\\"', "\\\\"):   # written escaped, as JSON does:
    return "(?:\\x{5c}" + ("\\x{22}" if text.endswith('"') else "\\x{5c}") + ")"  # one atom (a quantifier's)
  if kind == "esc" and text[1:] in ECMA:
    return f"[{ECMA[text[1:]]}]" if text[1] != "s" else f"[[{_SPACE}]--[{SPECIAL}]]"
  if kind == "esc" and text[1:].lower() in ECMA and len(text) == 2:
    return f"[[^{ECMA[text[1:].lower()]}]--[{SPECIAL}]]"
  if kind == "esc" and text == "\\/":
    return "/"
  return text


def _unescaped(regex: str) -> int | None:
  """A byte the regex's texts hold where a JSON string cannot (a control character, a lone `"` or `\\`),
  by walking its byte automaton beside JSON's (after a backslash only `"` or `\\`); None: there is none."""
  index = byte_index(regex)
  moves = index.get_transitions()
  first = moves[index.get_initial_state()][PREFIX[0]]
  seen, todo = {(first, False)}, [(first, False)]
  while todo:
    state, after_backslash = todo.pop()
    for b, nxt in moves.get(state, {}).items():
      if b > 0xFF:                                        # the end: not right after a backslash
        if after_backslash:
          return 0x5C
        continue
      if b < 0x20 or (after_backslash and b not in (0x22, 0x5C)) or (not after_backslash and b == 0x22):
        return b
      pair = (nxt, not after_backslash and b == 0x5C)
      if pair not in seen:
        seen.add(pair)
        todo.append(pair)
  return None


def json_string_pattern(p: str) -> str:
  """A JSON Schema `pattern` (anchors stripped) as a Rust regex over the JSON string's text between its
  quotes: ECMA-262's character classes, only characters allowed unescaped, `"` and `\\` written escaped.
  Raises ConstraintError when the result still lets a character through that JSON holds only escaped (an
  escape such as \\n or \\x22 written in the pattern), naming it."""
  out = "(?:" + "".join(_json_token(text, kind) for text, kind, _ in tokens(strip_anchors(p, True), True)) + ")"
  bad = _unescaped(out)
  if bad is not None:
    raise ConstraintError(f"pattern {p!r:.80} lets {chr(bad)!r} into the string unescaped, which JSON does "
                          "not allow: leave it out of the pattern")
  return out
