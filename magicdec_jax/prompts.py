"""Prompts in every form the API takes -> validated token-id lists (before anything is traced).

Strings (through the model's tokenizer), lists of token ids (ragged is fine), or an integer array [B, T]
with `lengths` [B] or an HF-style `attention_mask` [B, T] (padding on either side). Every error names the
prompt and the bad value.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.model import Model
from magicdec_jax.options import is_int


def tokenize_prompts(model: Model, prompts, *, first: int = 0, label: str = "prompt") -> list[list[int]]:
  """Strings (needs a tokenizer) or lists of token ids -> validated lists of ids; errors name a prompt as
  f"{label} {index}" (index from `first`)."""
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
    raise ValueError(f"prompts must be a non-empty list of strings or of token-id lists, got {prompts!r:.80}")
  out = []
  vocab = model.config.vocab_size
  for i, p in enumerate(prompts, first):
    if isinstance(p, str):
      if model.tokenizer is None:
        raise ValueError(f"{label} {i} is text but model {model.name!r} has no tokenizer; pass token ids")
      ids = tok_lib.encode(model.tokenizer, p)
    else:
      if _is_array(p) and p.ndim == 1 and np.issubdtype(p.dtype, np.integer):
        ids = np.asarray(p).tolist()
      elif isinstance(p, Sequence) and not isinstance(p, bytes):
        wrong = [t for t in p if not (is_int(t) or _integer_scalar(t))]
        if wrong:
          raise ValueError(f"{label} {i}: token ids must be integers, got {wrong[0]!r} "
                           f"({type(wrong[0]).__name__})")
        ids = [int(t) for t in p]
      else:
        raise ValueError(f"{label} {i} must be a string or a list of token ids, got {p!r:.80}")
    if not ids:
      raise ValueError(f"{label} {i} is empty")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
      raise ValueError(f"{label} {i} has token id {bad[0]} outside the vocabulary [0, {vocab})")
    out.append(ids)
  return out


def _integer_scalar(x) -> bool:
  return _is_array(x) and x.ndim == 0 and np.issubdtype(x.dtype, np.integer)


def _is_array(x) -> bool:
  return isinstance(x, (np.ndarray, jax.Array))


def _int_array(name: str, x, shape: tuple) -> np.ndarray:
  a = np.asarray(x)
  if a.dtype != np.bool_ and not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
  if a.shape != shape:
    raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
  return a


def array_prompts(model: Model, ids, lengths=None, attention_mask=None) -> list[list[int]]:
  """An integer array [B, T] (+ optional `lengths` [B] or `attention_mask` [B, T]) -> validated id lists."""
  a = np.asarray(ids)
  if a.ndim != 2 or 0 in a.shape:
    raise ValueError(f"token-id array prompts must be 2-D [B, T] with B, T >= 1, got shape {a.shape}")
  if not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"token-id array prompts must have an integer dtype, got {a.dtype}")
  b, t = a.shape
  if lengths is not None and attention_mask is not None:
    raise ValueError("pass lengths or attention_mask, not both")
  spans = [(0, t)] * b
  if lengths is not None:
    n = _int_array("lengths", lengths, (b,))
    if n.dtype == np.bool_:
      raise ValueError("lengths must be an integer array, got dtype bool")
    bad = np.flatnonzero((n < 1) | (n > t))
    if bad.size:
      raise ValueError(f"lengths[{bad[0]}]={n[bad[0]]} is outside [1, {t}] (T = the array's width)")
    spans = [(0, int(k)) for k in n]
  elif attention_mask is not None:
    m = _int_array("attention_mask", attention_mask, (b, t))
    if m.dtype != np.bool_ and not np.isin(m, (0, 1)).all():
      raise ValueError(f"attention_mask must hold only 0 and 1, found {m[~np.isin(m, (0, 1))][0]}")
    m = m.astype(bool)
    spans = []
    for i, row in enumerate(m):
      k = int(row.sum())
      if k == 0:
        raise ValueError(f"attention_mask row {i} is all padding (an empty prompt)")
      start = int(np.argmax(row))
      if not row[start:start + k].all() or (start != 0 and start + k != t):
        raise ValueError(f"attention_mask row {i} is not one contiguous run of ones at the right or the left "
                         f"end (ones at {np.flatnonzero(row).tolist()[:8]}...)")
      spans.append((start, start + k))
  vocab = model.config.vocab_size
  out = []
  for i, (s, e) in enumerate(spans):
    row = a[i, s:e]
    bad = np.flatnonzero((row < 0) | (row >= vocab))
    if bad.size:
      raise ValueError(f"prompt {i} has token id {row[bad[0]]} (at [{i}, {s + bad[0]}]) outside the "
                       f"vocabulary [0, {vocab})")
    out.append(row.astype(np.int64).tolist())
  return out


def prompt_ids(model: Model, prompts, lengths=None, attention_mask=None) -> list[list[int]]:
  """Strings, token-id lists or an integer array [B, T] (with lengths / attention_mask) -> id lists."""
  if _is_array(prompts):
    return array_prompts(model, prompts, lengths, attention_mask)
  if lengths is not None or attention_mask is not None:
    raise ValueError("lengths / attention_mask apply to array prompts [B, T] only; lists are already ragged")
  return tokenize_prompts(model, prompts)


def pad_prompts(ids: Sequence[Sequence[int]], rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Token-id prompts -> right-padded tokens [rows, width] int32 and lengths [rows] int32 (padding rows:
  one token, so every row has a position to decode from)."""
  tokens = np.zeros((rows, width), np.int32)
  lengths = np.ones((rows,), np.int32)
  for i, p in enumerate(ids):
    tokens[i, :len(p)] = p
    lengths[i] = len(p)
  return tokens, lengths
