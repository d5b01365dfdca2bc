"""One request's own options, declared once and validated once.

Every way a request comes in converts into `RequestOptions`: the Python API (`request.Request`, whose option
fields are these, declared here), native datagen records (their option fields by the same names) and OpenAI
batch bodies (openai_batch.py maps the body's names). Types and ranges are checked here, when the options
are made; what needs the run (a budget no larger than the run's, token ids inside its vocabulary, a
registered row feature for a field) is checked by the caller that knows the run (`check_budget` here,
stream.py, row_features). A bad value raises `OptionError`, which names the field and the value and
renders itself in the words of the way in: Python keywords (`top_p must be in (0, 1], got 1.5`), JSON
record fields (`'top_p' must be a number in (0, 1], got 1.5`) or an OpenAI body path (`body.top_p ...`).

None means "the run's" for every field. A field that only a row feature serves (FEATURE_FIELDS: sampling,
structured output) is carried to that feature when a request is inserted (row_features/); one no
registered feature serves is refused by name, never ignored.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np

MAX_TOP_LOGPROBS = 20    # the most alternatives per position top_logprobs may ask for (OpenAI's limit)
SEED_LIMIT = 2**32       # seeds are uint32 PRNG seeds

# fields a row feature serves, by the feature's kind (the message when none is registered for one)
FEATURE_FIELDS = {"temperature": "per-row sampling", "top_k": "per-row sampling", "top_p": "per-row sampling",
                  "min_p": "per-row sampling", "json_schema": "structured output", "regex": "structured output",
                  "choices": "structured output"}
CONSTRAINT_FIELDS = ("json_schema", "regex", "choices")      # at most one per request


class OptionError(ValueError):
  """A bad option: `field` (the RequestOptions name), `value`, what it must be (`kind`, e.g. "a number",
  and `limits`, e.g. "in (0, 1]"; `note` a reason). str(): the Python API's words; `render` another's."""

  def __init__(self, field: str, value: Any, kind: str, limits: str = "", note: str = "",
               type_error: bool = False, message: str | None = None):
    self.field, self.value, self.kind, self.limits, self.note = field, value, kind, limits, note
    self.type_error, self.custom = type_error, message
    super().__init__(self.render(field, json_values=False))

  def render(self, label: str, json_values: bool = True) -> str:
    """The message with the field called `label` (e.g. "'top_p'" or "body.top_p"); json_values: the value
    as JSON and the whole requirement (kind and limits) spelled out, as for a record's field. The Python
    form says the kind where the value is of the wrong type or the field takes integers, else the limits."""
    if self.custom is not None:
      return f"{label}: {self.custom}"
    if json_values or self.kind == "an integer" or not self.limits:
      what = f"{self.kind} {self.limits}".strip()
    else:
      what = self.kind if self.type_error else self.limits
    note = f" ({self.note})" if self.note else ""
    return f"{label} must be {what}{note}, got {_show(self.value, json_values)}"


def _show(v: Any, as_json: bool) -> str:
  if not as_json:
    return repr(v)
  try:
    return json.dumps(v)
  except (TypeError, ValueError):
    return repr(v)


def is_int(v) -> bool:
  """An integer (Python's or numpy's), not a bool, a float or a string that reads as one."""
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


# A sampled temperature's range: float32 holds 1 / temperature (1e-30 already samples the argmax but for
# exact ties; 0 asks for greedy decoding).
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-30, 1e30
# field -> (kind, type check, limits, range check); range checks see values that passed the type check
NUMBER_CHECKS = {
    "max_new_tokens": ("an integer", is_int, ">= 1", lambda v: v >= 1),
    "seed": ("an integer", is_int, "in [0, 2**32)", lambda v: 0 <= v < SEED_LIMIT),
    "num_samples": ("an integer", is_int, ">= 1", lambda v: v >= 1),
    "temperature": ("a finite number", _is_number, f"in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] or 0 (greedy)",
                    lambda v: v == 0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE),
    "top_k": ("an integer", is_int, ">= 0", lambda v: v >= 0),
    "top_p": ("a number", _is_number, "in (0, 1]", lambda v: 0 < v <= 1),
    "min_p": ("a number", _is_number, "in [0, 1]", lambda v: 0 <= v <= 1),
    "top_logprobs": ("an integer", is_int, f"in [0, {MAX_TOP_LOGPROBS}]", lambda v: 0 <= v <= MAX_TOP_LOGPROBS),
}


def check_number(name: str, value: Any) -> None:
  """OptionError unless `value` (not None) is of the kind and inside the limits of number field `name` (one
  of NUMBER_FIELDS): the one place these ranges are written (Sampling and DecodeSettings check by it too)."""
  kind, is_kind, limits, in_range = NUMBER_CHECKS[name]
  if not is_kind(value):
    raise OptionError(name, value, kind, limits, type_error=True)
  if not in_range(value):
    raise OptionError(name, value, kind, limits)


NUMBER_FIELDS = tuple(NUMBER_CHECKS)


def check_count(what: str, value: Any, least: int, most: int | None = None) -> None:
  """ValueError naming `what` unless `value` is an integer (not a bool or a float) >= least (and <= most):
  the check of every count an entry point takes (batch sizes, budgets, a draft's sink and window)."""
  if not is_int(value) or value < least or (most is not None and value > most):
    bounds = f">= {least}" if most is None else f"in [{least}, {most}]"
    raise ValueError(f"{what} must be an integer {bounds}, got {value!r}")


def check_stream_ids(ids: Any) -> list[int]:
  """Random-stream ids as given (a non-empty list of integers in [0, 2**32)) -> ints; ValueError naming
  stream_ids otherwise (a float or a negative id was truncated or overflowed deep in the PRNG)."""
  if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray, range)) or len(ids) == 0 or \
      not all(is_int(s) and 0 <= s < SEED_LIMIT for s in ids):
    raise ValueError(f"stream_ids must be a non-empty list of integers in [0, 2**32), got {ids!r:.80}")
  return [int(s) for s in ids]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptionFields:
  """The option fields, declared once (None: the run's). `RequestOptions` validates them; `request.Request`
  carries them as the user wrote them (checked when the stream reads the request)."""
  max_new_tokens: int | None = None        # at most the run's (which sizes the buffers)
  seed: int | None = None                  # in [0, 2**32): the PRNG seed of this request's streams
  num_samples: int | None = None           # samples of this request
  stop: Sequence[str] | str | None = None  # strings ending the output at their first occurrence
  stop_token_ids: Sequence[int] | None = None   # ids ending it as EOS does
  keep_stop: bool | None = None            # keep the stop's text (default: cut before it)
  temperature: float | None = None         # per-row sampling (a row feature): 0 = greedy
  top_k: int | None = None
  top_p: float | None = None
  min_p: float | None = None
  logprobs: bool | None = None             # compiled into the loop: must match the run's where set
  top_logprobs: int | None = None
  json_schema: Any = None                  # structured output (a row feature): a JSON schema (dict or JSON text)
  regex: str | None = None                 # ... or a regular expression the output must match
  choices: Sequence[str] | None = None     # ... or one of these strings


FIELDS = tuple(f.name for f in dataclasses.fields(OptionFields))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestOptions(OptionFields):
  """One request's options, validated when made (OptionError naming the field); sequences are stored as
  tuples (stop a tuple of strings), json_schema as a dict."""

  def __post_init__(self):
    for name in NUMBER_FIELDS:
      if getattr(self, name) is not None:
        check_number(name, getattr(self, name))
    for name in ("keep_stop", "logprobs"):
      v = getattr(self, name)
      if v is not None and not isinstance(v, bool):
        raise OptionError(name, v, "True or False", type_error=True)
    stop = self.stop
    if stop is not None:
      stop = (stop,) if isinstance(stop, str) else stop
      if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise OptionError("stop", self.stop, "a non-empty string or a list of them", type_error=True)
      object.__setattr__(self, "stop", tuple(stop))
    if self.stop_token_ids is not None:
      ids = self.stop_token_ids
      if not isinstance(ids, (list, tuple, np.ndarray)) or not all(is_int(t) and t >= 0 for t in ids):
        raise OptionError("stop_token_ids", ids, "a list of token ids (integers >= 0)", type_error=True)
      object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ids))
    if self.top_logprobs and self.logprobs is False:
      raise OptionError("top_logprobs", self.top_logprobs, "", message="needs logprobs")
    self._check_constraint()

  def _check_constraint(self):
    given = [n for n in CONSTRAINT_FIELDS if getattr(self, n) is not None]
    if len(given) > 1:
      raise OptionError(given[1], getattr(self, given[1]), "",
                        message=f"give one of {', '.join(CONSTRAINT_FIELDS)}, not {' and '.join(given)}")
    for name in ("stop", "stop_token_ids"):
      if given and getattr(self, name):        # (a constrained output ends where its constraint is met)
        raise OptionError(name, getattr(self, name), "", message=f"not with {given[0]}: a stop would cut the "
                          "constrained output before it is complete, reported as finished all the same")
    schema = self.json_schema
    note = ""
    if isinstance(schema, str):
      try:
        schema = json.loads(schema)
      except ValueError as e:
        schema, note = None, f"not JSON: {e}"
    if self.json_schema is not None and not isinstance(schema, dict):
      raise OptionError("json_schema", self.json_schema, "a JSON schema, an object or its JSON text",
                        note=note, type_error=True)
    if schema is not None:
      object.__setattr__(self, "json_schema", schema)
    if self.regex is not None and not (isinstance(self.regex, str) and self.regex):
      raise OptionError("regex", self.regex, "a non-empty string", type_error=True)
    ch = self.choices
    if ch is not None:
      if not isinstance(ch, (list, tuple)) or not ch or not all(isinstance(c, str) and c for c in ch):
        raise OptionError("choices", ch, "a non-empty list of non-empty strings", type_error=True)
      object.__setattr__(self, "choices", tuple(ch))

  @classmethod
  def of(cls, source: OptionFields) -> "RequestOptions":
    """The options a `request.Request` (or any OptionFields) carries, validated."""
    return cls(**{name: getattr(source, name) for name in FIELDS})

  def given(self) -> dict[str, Any]:
    """The fields set (not None), by name."""
    return {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}

  def check_budget(self, run_max_new_tokens: int) -> None:
    """OptionError where max_new_tokens is over the run's (which sizes the loop's buffers)."""
    v = self.max_new_tokens
    if v is not None and v > run_max_new_tokens:
      raise OptionError("max_new_tokens", v, "an integer", f"in [1, {run_max_new_tokens}]",
                        note="the run's max_new_tokens sizes the buffers")
