"""Stop strings and stop ids: where a row's output ends, found on the host in its decoded text."""
from __future__ import annotations

import dataclasses
from typing import Sequence


def find_stop(decode, toks: list[int], stop: Sequence[str], stop_ids, keep: bool,
              start: int = 0) -> tuple[int, str] | None:
  """The first stop in `toks` past the first `start` tokens (already searched): (tokens kept, text) or
  None. A stop string ends the output at the token completing its first occurrence (the earliest
  completed; of those, the earliest in the text); a stop id at that id. decode: token ids -> text."""
  k_id = next((i + 1 for i in range(start, len(toks)) if toks[i] in stop_ids), None)
  end = len(toks) if k_id is None else k_id
  if stop and any(s in decode(toks[:end]) for s in stop):
    for k in range(start + 1, end + 1):
      text = decode(toks[:k])
      found = [(text.find(s), -len(s)) for s in stop if s in text]
      if found:
        pos, neg = min(found)
        return k, text[:pos - neg if keep else pos]
  if k_id is None:
    return None
  return k_id, decode(toks[:k_id if keep else k_id - 1])


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
