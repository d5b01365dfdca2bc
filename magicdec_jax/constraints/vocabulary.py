"""A model's tokens as the exact bytes decoding emits for them, the vocabulary a constraint compiles against.

Byte-level BPE (GPT-2 / LLaMA-3 / Qwen / SmolLM2 and the test byte tokenizer) stores each byte as one
printable character: the inverse table gives the bytes. SentencePiece-style decoders (Metaspace, or a
Sequence of Replace / ByteFallback / Fuse / Strip) give "<0xHH>" tokens their byte and "▁" a space; a
decoder's Strip of the text's first character is not modelled (a token's bytes are what it emits
mid-text). Non-special added tokens are their content. Special tokens are never allowed, except the EOS ids,
which the automaton allows exactly where the output may end. Token ids of the model's vocabulary that the
tokenizer lacks are never allowed.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import threading
from typing import Sequence

import numpy as np

from magicdec_jax.constraints.errors import ConstraintError

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SEQUENCE_STEPS = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"}


@functools.lru_cache(maxsize=1)
def byte_level_table() -> dict[str, int]:
  """GPT-2's byte -> printable character table, inverted: character -> byte."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
      list(range(ord("®"), ord("ÿ") + 1))
  cs, extra = bs[:], 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + extra)
      extra += 1
  return {chr(c): b for b, c in zip(bs, cs)}


@dataclasses.dataclass(frozen=True, eq=False)
class TokenVocabulary:
  """token_bytes[i]: token i's bytes, None where it is never allowed (special, empty, missing).
  eos_ids: the tokens allowed exactly where the output may end. vocab_size: the logits' width (>= the
  tokenizer's size). fingerprint: a digest of all of it (the compile cache's key)."""
  token_bytes: tuple[bytes | None, ...]       # [V]
  eos_ids: tuple[int, ...]
  vocab_size: int
  fingerprint: str

  @functools.cached_property
  def candidates(self) -> tuple[np.ndarray, list[bytes]]:
    """(ids [T] int64, their bytes): the tokens a constraint may allow."""
    ids = [i for i, b in enumerate(self.token_bytes) if b is not None]
    return np.asarray(ids, np.int64), [self.token_bytes[i] for i in ids]


def _decoder_steps(tokenizer) -> list[dict]:
  dec = tokenizer.decoder
  if dec is None:
    raise ConstraintError("the tokenizer has no decoder: the bytes of its tokens are unknown")
  state = json.loads(dec.__getstate__())
  steps = state["decoders"] if state.get("type") == "Sequence" else [state]
  kinds = [s.get("type") for s in steps]
  if kinds == ["ByteLevel"] or all(k in _SEQUENCE_STEPS for k in kinds):
    return steps
  raise ConstraintError(f"tokenizer decoder {'/'.join(map(str, kinds))} is not supported for constrained "
                        "decoding (byte-level BPE and SentencePiece-style decoders are)")


def _piece_bytes(piece: str, steps: list[dict]) -> bytes | None:
  """A vocabulary piece's bytes under the decoder steps (None: a character byte-level cannot map)."""
  if steps[0]["type"] == "ByteLevel":
    table = byte_level_table()
    try:
      return bytes(table[c] for c in piece)
    except KeyError:
      return None
  kinds = {s["type"] for s in steps}
  m = _BYTE_TOKEN.fullmatch(piece)
  if m and "ByteFallback" in kinds:
    return bytes([int(m.group(1), 16)])
  for s in steps:
    if s["type"] == "Replace":
      pattern = s["pattern"].get("String")
      if pattern is None:
        raise ConstraintError("tokenizer decoder Replace with a regex pattern is not supported")
      piece = piece.replace(pattern, s["content"])
    elif s["type"] == "Metaspace":
      piece = piece.replace(s.get("replacement", "\u2581"), " ")
  return piece.encode("utf-8")


@functools.lru_cache(maxsize=8)
def _byte_reading(tokenizer) -> tuple[list[dict] | None, frozenset]:
  """(its decoder steps, None where they are not modelled; its added tokens' ids), once per tokenizer."""
  try:
    steps = _decoder_steps(tokenizer)
  except ConstraintError:
    steps = None
  return steps, frozenset(tokenizer.get_added_tokens_decoder())


def token_bytes(tokenizer, token_id: int) -> bytes:
  """The bytes decoding emits for `token_id` mid-text: a byte-level piece's bytes (part of a character,
  perhaps), else its text's UTF-8 (added and special tokens, decoders not modelled here). Why: a token's
  text alone loses the bytes of a character split across tokens, which OpenAI's `bytes` field keeps."""
  steps, added = _byte_reading(tokenizer)
  piece = tokenizer.id_to_token(int(token_id))
  raw = None if piece is None or steps is None or int(token_id) in added else _piece_bytes(piece, steps)
  return raw if raw is not None else tokenizer.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")


def build_vocabulary(tokenizer, eos_ids: Sequence[int], vocab_size: int | None = None) -> TokenVocabulary:
  """`tokenizer` (a `tokenizers.Tokenizer`) -> its TokenVocabulary; vocab_size defaults to the tokenizer's
  size. Not cached: `token_vocabulary` is."""
  size = tokenizer.get_vocab_size(with_added_tokens=True)
  vocab_size = size if vocab_size is None else int(vocab_size)
  eos = tuple(dict.fromkeys(int(e) for e in eos_ids))
  if not eos:
    raise ConstraintError("constrained decoding needs an EOS token id (the output's end)")
  if any(not 0 <= e < vocab_size for e in eos):
    raise ConstraintError(f"EOS ids {eos} outside the vocabulary of {vocab_size}")
  steps = _decoder_steps(tokenizer)
  added = tokenizer.get_added_tokens_decoder()
  out: list[bytes | None] = [None] * vocab_size
  for piece, i in tokenizer.get_vocab(with_added_tokens=False).items():
    if i < vocab_size and i not in added:
      out[i] = _piece_bytes(piece, steps)
  for i, tok in added.items():
    if i < vocab_size and not tok.special:
      out[i] = tok.content.encode("utf-8")
  for i in eos:
    out[i] = None
  out = [b if b else None for b in out]
  digest = hashlib.sha256(repr((eos, vocab_size)).encode())
  for b in out:
    digest.update(b"\x00" if b is None else len(b).to_bytes(2, "little") + b)
  return TokenVocabulary(tuple(out), eos, vocab_size, digest.hexdigest()[:32])


_CACHE: dict[tuple, tuple[object, TokenVocabulary]] = {}
_LOCK = threading.Lock()
CACHE_SIZE = 8


def token_vocabulary(tokenizer, eos_ids: Sequence[int], vocab_size: int | None = None) -> TokenVocabulary:
  """`build_vocabulary`, once per (tokenizer object, eos ids, vocab size) in this process."""
  key = (id(tokenizer), tuple(int(e) for e in eos_ids), vocab_size)
  with _LOCK:
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is tokenizer:
      return hit[1]
  vocab = build_vocabulary(tokenizer, eos_ids, vocab_size)
  with _LOCK:
    if len(_CACHE) >= CACHE_SIZE:
      _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (tokenizer, vocab)       # the tokenizer kept alive: its id is not reused while cached
  return vocab
