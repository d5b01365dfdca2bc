"""Training data for draft distillation: token windows from datagen JSONL or plain text, in a fixed order.

Sources (one or more paths, read in the order given):
* `*.jsonl` — records written by `run.py --mode=datagen` (`token_ids`: the completion the target generated;
  an optional `prompt` / `text` string is tokenized and put in front), OpenAI batch output lines (datagen's
  OpenAI format: each choice's completion text, tokenized; error lines hold none), or any JSONL whose
  records carry a `text` string. Every line is checked; the first bad one raises a `ValueError` naming file and line.
* anything else — a UTF-8 plain text file, tokenized whole.

Documents are joined into one token stream (an EOS id between documents when the model has one) and cut
into non-overlapping windows of `seq_len` tokens. `batch_indices(n, batch, step, seed)` gives the windows
of a training step: the windows are shuffled per epoch by a generator seeded with (seed, epoch), and step
s takes flat positions s*batch .. s*batch+batch-1 of that endless sequence, so the batch of any step is a
pure function of (seed, step) — what makes a resumed run see exactly the data an uninterrupted one sees.
"""
from __future__ import annotations

import json
import os

import numpy as np


def _jsonl_docs(path: str, tokenizer, vocab_size: int) -> list[list[int]]:
  docs = []
  with open(path, "rb") as f:
    for n, raw in enumerate(f, 1):
      if not raw.strip():
        continue
      where = f"{path} line {n}"
      try:
        rec = json.loads(raw.decode("utf-8"))
      except UnicodeDecodeError as e:
        raise ValueError(f"{where}: invalid UTF-8 at byte {e.start}") from None
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: malformed JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
      if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
      if "custom_id" in rec and "response" in rec:          # an OpenAI batch output line (datagen's OpenAI format)
        docs += [d for d in _openai_docs(rec, where, tokenizer, vocab_size) if d]
        continue
      ids: list[int] = []
      lead = rec.get("prompt", rec.get("text") if "token_ids" in rec else None)
      if lead is not None:
        if not isinstance(lead, str):
          raise ValueError(f"{where}: 'prompt'/'text' must be a string")
        if tokenizer is None:
          raise ValueError(f"{where}: text needs a tokenizer and the target model has none")
        ids += list(tokenizer.encode(lead).ids)
      if "token_ids" in rec:
        toks = rec["token_ids"]
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
          raise ValueError(f"{where}: 'token_ids' must be a list of integers")
        ids += toks
      elif "text" in rec:
        if not isinstance(rec["text"], str):
          raise ValueError(f"{where}: 'text' must be a string")
        if tokenizer is None:
          raise ValueError(f"{where}: text needs a tokenizer and the target model has none")
        ids += list(tokenizer.encode(rec["text"]).ids)
      else:
        raise ValueError(f"{where}: needs 'token_ids' (a datagen record) or 'text'")
      _check_ids(ids, where, vocab_size)
      if ids:
        docs.append(ids)
  return docs


def _check_ids(ids: list[int], where: str, vocab_size: int) -> None:
  bad = [t for t in ids if not 0 <= t < vocab_size]
  if bad:
    raise ValueError(f"{where}: token id {bad[0]} outside the model's vocabulary of {vocab_size} "
                     "(data generated with another tokenizer?)")


def _openai_docs(rec: dict, where: str, tokenizer, vocab_size: int) -> list[list[int]]:
  """An OpenAI batch output line's documents: each choice's completion text (`text`, or a chat choice's
  `message.content`), tokenized; an error line (no completion) gives none."""
  if rec.get("error") is not None:
    return []
  try:
    choices = rec["response"]["body"]["choices"]
    texts = [c["message"]["content"] if "message" in c else c["text"] for c in choices]
  except (KeyError, TypeError) as e:
    raise ValueError(f"{where}: an OpenAI batch output line without response.body.choices[].text or "
                     f".message.content ({e!r})") from None
  if not all(isinstance(t, str) for t in texts):
    raise ValueError(f"{where}: a choice's completion text must be a string")
  if tokenizer is None:
    raise ValueError(f"{where}: text needs a tokenizer and the target model has none")
  docs = [list(tokenizer.encode(t).ids) for t in texts]
  for d in docs:
    _check_ids(d, where, vocab_size)
  return docs


def _text_doc(path: str, tokenizer) -> list[int]:
  if tokenizer is None:
    raise ValueError(f"{path}: plain text needs a tokenizer and the target model has none")
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
  return list(tokenizer.encode(text).ids) if text.strip() else []


def load_windows(paths, tokenizer, vocab_size: int, seq_len: int, eos_id: int | None = None) -> np.ndarray:
  """paths -> int32 [N, seq_len] windows (ValueError on missing, empty or malformed input)."""
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  paths = [os.fspath(p) for p in paths]
  if not paths:
    raise ValueError("no distillation data given")
  stream: list[int] = []
  for p in paths:
    if not os.path.isfile(p):
      raise ValueError(f"distillation data {p!r}: no such file")
    docs = _jsonl_docs(p, tokenizer, vocab_size) if p.endswith(".jsonl") else [_text_doc(p, tokenizer)]
    docs = [d for d in docs if d]
    if not docs:
      raise ValueError(f"distillation data {p!r} is empty (no tokens)")
    for d in docs:
      stream += d
      if eos_id is not None:
        stream.append(eos_id)
  n = len(stream) // seq_len
  if n < 1:
    raise ValueError(f"distillation data has {len(stream)} tokens, fewer than one window of "
                     f"seq_len={seq_len}")
  return np.asarray(stream[:n * seq_len], np.int32).reshape(n, seq_len)


def batch_indices(num_windows: int, batch: int, step: int, seed: int) -> np.ndarray:
  """Window indices [batch] of training step `step` (0-based): a pure function of (seed, step)."""
  out = np.empty(batch, np.int64)
  for j in range(batch):
    flat = step * batch + j
    epoch, i = divmod(flat, num_windows)
    out[j] = _permutation(num_windows, seed, epoch)[i]
  return out


_PERM_CACHE: dict = {}


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
  key = (n, seed, epoch)
  if key not in _PERM_CACHE:
    if len(_PERM_CACHE) > 8:
      _PERM_CACHE.clear()
    _PERM_CACHE[key] = np.random.default_rng([seed, epoch]).permutation(n)
  return _PERM_CACHE[key]
