"""Stop strings and stop ids: where a row's output ends, found on the host in its decoded text."""
from __future__ import annotations

import dataclasses
from typing import Sequence


def find_stop(decode, toks: list[int], stop: Sequence[str], stop_ids, keep: bool,
              start: int = 0, eos=()) -> tuple[int, str] | None:
  """The first stop in `toks` past the first `start` tokens (already searched): (tokens kept, text) or
  None. A stop string ends the output at the token completing its first occurrence (the earliest
  completed; of those, the earliest in the text); a stop id at that id. decode: token ids -> text (None: a
  model without a tokenizer, which takes stop ids only; the text is then None).
  eos: the run's end-of-sequence ids; the row ends at one with its text not output, so stop strings are
  searched in the text before it (a stop '|' is not found in '<|im_end|>')."""
  k_id = next((i + 1 for i in range(start, len(toks)) if toks[i] in stop_ids), None)
  end = len(toks) if k_id is None else k_id
  strings_end = next((i for i in range(end) if toks[i] in eos), end)
  if stop and strings_end > start and _in_tail(decode, toks[:strings_end], stop, start) and \
      any(s in decode(toks[:strings_end]) for s in stop):
    for k in range(start + 1, strings_end + 1):
      text = decode(toks[:k])
      found = [(text.find(s), -len(s)) for s in stop if s in text]
      if found:
        pos, neg = min(found)
        return k, text[:pos - neg if keep else pos]
  if k_id is None:
    return None
  return k_id, None if decode is None else decode(toks[:k_id if keep else k_id - 1])


def _in_tail(decode, toks: list[int], stop: Sequence[str], start: int) -> bool:
  """Whether a stop string may have completed past the first `start` tokens: searched in the text of the
  tokens from TAIL_TOKENS_PER_CHAR tokens per character of the longest stop (and a margin) before `start`.
  Why: decoding the whole output at every check costs time quadratic in its length. A false alarm is
  harmless (the caller searches the whole text); none is missed, since a character spans at most 4
  tokens and decoding a suffix alters only its first characters."""
  w = max(0, start - TAIL_TOKENS_PER_CHAR * max(map(len, stop)) - TAIL_MARGIN)
  return w == 0 or any(s in decode(toks[w:]) for s in stop)


TAIL_TOKENS_PER_CHAR = 4     # UTF-8 bytes per character: byte-level tokens per character at most
TAIL_MARGIN = 16             # tokens more: a suffix's first characters (cut mid-character, a stripped
                             #   space) lie before any stop that may have completed


def cut_result(res, cut):
  """A StreamResult ended by a stop (`cut`: find_stop's (tokens kept, text); None: `res` unchanged): its
  tokens and per-token fields up to the stop, its text cut, finish reason "stop"."""
  if cut is None:
    return res
  k, text = cut
  upd = {name: getattr(res, name)[:k] for name in ("logprobs", "top_logprobs")
         if getattr(res, name, None) is not None}
  return dataclasses.replace(res, tokens=res.tokens[:k], text=text, finish_reason="stop",
                             stats={**res.stats, "new_tokens": k, "generated_tokens": len(res.tokens)}, **upd)
