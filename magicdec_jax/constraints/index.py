"""outlines-core's `Index` driven so that it is exact and fast.

Exact: outlines-core drops a token that ends one byte past a full match without completing another (after
"a" under `a(bc)?` it would refuse "b"). So the regex R is compiled as `PREFIX (?:R) SENTINEL`, with the
sentinel (U+10FFFF) reachable only as a virtual token: no proper prefix of a text is then a full match,
every continuation is kept, and a state accepts iff the sentinel from it reaches a final state. Tokens
holding the sentinel's lead byte (characters U+100000-U+10FFFF) are never allowed under a constraint.

Fast: the leading NUL keeps regex-automata's unanchored search automaton (built too, never used) small
for regexes that do not match NUL (JSON never does): the JSON-object regex builds in milliseconds instead
of seconds. And the tokens are first reduced to one per byte-class signature: bytes whose columns agree in
a byte-level index of the same regex move every state alike, so tokens with equal sequences of byte classes
behave alike in every state, and only one of each is walked by the token index.

Virtual token ids (beyond the vocabulary V): V the sentinel, V + 1 outlines-core's EOS, V + 2 the prefix.
"""
from __future__ import annotations

import functools

import numpy as np
from outlines_core import Index, Vocabulary

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.vocabulary import TokenVocabulary

SENTINEL = "\U0010FFFF"
SENTINEL_LEAD = SENTINEL.encode()[0]
PREFIX = b"\x00"


def escape(text: str) -> str:
  """`text` as a Rust regex matching exactly it: letters, digits and '_' as themselves, every other
  character as a \\x{...} escape (unambiguous whatever the character)."""
  return "".join(c if c.isascii() and (c.isalnum() or c == "_") else f"\\x{{{ord(c):x}}}" for c in text)


def wrap(regex: str) -> str:
  """The regex outlines-core compiles for R: PREFIX (?:R) SENTINEL."""
  return f"\\x00(?:{regex}){escape(SENTINEL)}"


@functools.lru_cache(maxsize=1)
def _byte_vocabulary() -> Vocabulary:
  """Every single byte but the sentinel's lead byte (ids = byte values), the sentinel (256), EOS (257)."""
  table = {bytes([b]): [b] for b in range(256) if b != SENTINEL_LEAD}
  table[SENTINEL.encode()] = [256]
  return Vocabulary(257, table)


def byte_index(regex: str) -> Index:
  """The index of wrap(regex) over single bytes; ConstraintError when outlines-core cannot compile it."""
  try:
    return Index(wrap(regex), _byte_vocabulary())
  except ValueError as e:
    raise ConstraintError(f"cannot compile the constraint: {e}") from e


def byte_classes(index: Index) -> np.ndarray:
  """[256] uint8: class of each byte; bytes of one class lead every state of the byte index alike."""
  transitions = index.get_transitions()
  columns = np.full((256, len(transitions)), -1, np.int64)
  for j, moves in enumerate(transitions.values()):
    for b, d in moves.items():
      if b < 256:
        columns[b, j] = d
  _, inverse = np.unique(columns, axis=0, return_inverse=True)
  return inverse.reshape(-1).astype(np.uint8)


def token_index(regex: str, vocabulary: TokenVocabulary) -> tuple[Index, np.ndarray, np.ndarray]:
  """(index of wrap(regex) over one representative token per byte-class signature, rep [V] int64: each
  token's representative (-1: never allowed), group [V] int64: tokens each representative stands for)."""
  classes = byte_classes(byte_index(regex)).tobytes()
  ids, pieces = vocabulary.candidates
  v = vocabulary.vocab_size
  rep = np.full(v, -1, np.int64)
  first: dict[bytes, int] = {}
  table: dict[bytes, list[int]] = {}
  for i, b in zip(ids.tolist(), pieces):
    if SENTINEL_LEAD in b:
      continue
    sig = b.translate(classes)
    r = first.setdefault(sig, i)
    rep[i] = r
    if r == i:
      table[b] = [i]
  table[SENTINEL.encode()] = [v]
  table.setdefault(PREFIX, []).append(v + 2)
  group = np.bincount(rep[rep >= 0], minlength=v).astype(np.int64)
  try:
    return Index(wrap(regex), Vocabulary(v + 1, table)), rep, group
  except ValueError as e:
    raise ConstraintError(f"cannot compile the constraint over this vocabulary: {e}") from e
