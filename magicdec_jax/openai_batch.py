"""OpenAI batch files for datagen: a request line -> the native record plus its own options; a finished
choice or a bad request -> an output line in the OpenAI batch output shape.

Why a module of its own: datagen.py keeps the run (parsing, resume, crash safety); this one only knows the
format. Input lines are `{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}`; the body's options convert into `options.RequestOptions` (which checks their types and
ranges once for every way in; an error names the body field), and this module adds only the format's own
limits (temperature <= 2, n <= 128, up to 4 stops) and shapes (response_format). Anything unknown is
refused naming the field, never silently ignored. A request with n choices gives one output line per
choice (its `choices[0].index`), written as the choice finishes, so a crash loses at most the choice
being written and a resume regenerates only the missing (custom_id, index) pairs.
"""
from __future__ import annotations

import codecs
import dataclasses
import functools
import hashlib
import json
from typing import Any

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.spec import response_format_schema
from magicdec_jax.constraints.vocabulary import token_bytes
from magicdec_jax.options import SEED_LIMIT, OptionError, RequestOptions

URLS = {"/v1/chat/completions": ("messages", "chat.completion", "chatcmpl-"),
        "/v1/completions": ("prompt", "text_completion", "cmpl-")}
TOP_FIELDS = {"custom_id", "method", "url", "body"}
# body field -> the RequestOptions field it sets (response_format: one of json_schema / regex / choices)
BODY_OPTIONS = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                "temperature": "temperature", "top_p": "top_p", "stop": "stop", "n": "num_samples", "seed": "seed",
                "logprobs": "logprobs", "top_logprobs": "top_logprobs", "response_format": "json_schema"}
BODY_FIELDS = {"messages", "prompt", "model"} | set(BODY_OPTIONS)
FORMAT_LIMITS = {"temperature": 2.0, "n": 128}   # the format's own upper limits, beyond the options' ranges
MAX_STOPS = 4                  # as the OpenAI API


class RequestError(ValueError):
  """A bad request; `field` names the offending field (None: the line as a whole)."""

  def __init__(self, message: str, field: str | None = None):
    super().__init__(message)
    self.field = field


@dataclasses.dataclass(frozen=True)
class OpenAIOptions:
  """A request line's own options: its url (the shape of its output) and its RequestOptions (n is its
  num_samples, max_tokens its max_new_tokens). options[body_field] reads one by its body name."""
  url: str
  request: RequestOptions

  def __getitem__(self, body_field: str) -> Any:
    return self.url if body_field == "url" else getattr(self.request, BODY_OPTIONS[body_field])


def is_openai(first: dict) -> bool:
  """Whether a parsed input line is meant as an OpenAI batch request: it has one of the format's own
  top-level fields ("custom_id", "method", "url", "body"), which native records never have."""
  return isinstance(first, dict) and bool(TOP_FIELDS & set(first))


def body_error(e: OptionError, body: dict) -> RequestError:
  """An options error in the body's words (body.<field>), naming the body field that set the option."""
  names = [k for k, v in BODY_OPTIONS.items() if v == e.field and body.get(k) is not None]
  if e.field in ("json_schema", "regex", "choices"):
    names = ["response_format"]
  name = names[0] if names else e.field
  return RequestError(e.render(f"body.{name}"), name)


def _response_format(rf: Any) -> dict[str, Any]:
  """response_format -> the options it sets (constraints.response_format_schema): {"type": "text"} none,
  "json_object" any JSON object, "json_schema" its json_schema.schema."""
  try:
    schema = response_format_schema(rf)
  except ConstraintError as e:
    raise RequestError(f"body.{e}", "response_format") from None
  return {} if schema is None else {"json_schema": schema}


def _check_unused(body: dict, name: str, max_new_tokens: int) -> None:
  """RequestError naming body.<name> unless its value would pass as an option: a field the request's other
  fields override is still checked, not ignored with a bad value."""
  try:
    RequestOptions(**{BODY_OPTIONS[name]: body[name]}).check_budget(max_new_tokens)
  except OptionError as e:
    raise RequestError(e.render(f"body.{name}"), name) from None


def to_native(rec: dict, *, max_new_tokens: int) -> tuple[dict, OpenAIOptions]:
  """One parsed request line -> (native record {"id", "prompt" | "messages"}, its OpenAIOptions): url and
  the RequestOptions of max_tokens (or max_completion_tokens), temperature / top_p (None: the run's), stop,
  n (default 1), seed (reduced modulo 2**32), logprobs, top_logprobs, response_format. Raises RequestError
  naming the field."""
  if not isinstance(rec, dict):
    raise RequestError(f"expected a JSON object, got {type(rec).__name__}")
  if "custom_id" not in rec:
    raise RequestError("missing 'custom_id'", "custom_id")
  cid = rec["custom_id"]
  if not isinstance(cid, str) or not cid:
    raise RequestError(f"'custom_id' must be a non-empty string, got {json.dumps(cid)}", "custom_id")
  unknown = sorted(set(rec) - TOP_FIELDS)
  if unknown:
    raise RequestError(f"unknown field {unknown[0]!r}", unknown[0])
  if rec.get("method") != "POST":
    raise RequestError(f"'method' must be \"POST\", got {json.dumps(rec.get('method'))}", "method")
  url = rec.get("url")
  if url not in URLS:
    raise RequestError(f"'url' must be one of {', '.join(URLS)}, got {json.dumps(url)}", "url")
  if "body" not in rec:
    raise RequestError("missing 'body'", "body")
  body = rec["body"]
  if not isinstance(body, dict):
    raise RequestError(f"'body' must be an object, got {type(body).__name__}", "body")
  unknown = sorted(set(body) - BODY_FIELDS)
  if unknown:
    raise RequestError(f"unknown body field {unknown[0]!r}", unknown[0])
  key = URLS[url][0]
  other = "prompt" if key == "messages" else "messages"
  if other in body:
    raise RequestError(f"{url} takes body.{key}, not body.{other}", other)
  if key not in body:
    raise RequestError(f"missing body.{key}", key)
  if key == "prompt" and not isinstance(body["prompt"], str):
    raise RequestError(f"body.prompt must be a string, got {type(body['prompt']).__name__}", "prompt")
  served = body.get("model")          # the model the request names (informational: the run's model serves it)
  if served is not None and not isinstance(served, str):
    raise RequestError(f"body.model must be a string, got {json.dumps(served)}", "model")
  given = {name: body[name] for name in BODY_OPTIONS if body.get(name) is not None}
  own = {BODY_OPTIONS[name]: v for name, v in given.items() if name not in ("response_format", "max_tokens")}
  if "max_tokens" in given:           # max_tokens wins over max_completion_tokens (checked all the same)
    own["max_new_tokens"] = given["max_tokens"]
    if "max_completion_tokens" in given:
      _check_unused(body, "max_completion_tokens", max_new_tokens)
  if "response_format" in given:
    own.update(_response_format(given["response_format"]))
  k = given.get("logprobs")
  if key == "prompt" and isinstance(k, int) and not isinstance(k, bool):   # the completions API's form
    if "top_logprobs" in given:
      raise RequestError("body.logprobs as a number is the alternatives per token; give it or top_logprobs "
                         "(with logprobs: true), not both", "top_logprobs")
    own["logprobs"], own["top_logprobs"] = True, k
  if isinstance(own.get("seed"), int) and not isinstance(own["seed"], bool):
    own["seed"] %= SEED_LIMIT
  if own.get("temperature") == 0 and "top_p" in own:   # a greedy request's top_p changes nothing (and asks
    _check_unused(body, "top_p", max_new_tokens)        # for no per-row sampling), but a bad one is an error
    own.pop("top_p")
  own.setdefault("num_samples", 1)
  own["logprobs"] = own.get("logprobs", False)
  own.setdefault("top_logprobs", 0)
  if isinstance(own.get("stop"), list) and len(own["stop"]) > MAX_STOPS:
    raise RequestError(f"body.stop must be a non-empty string or a list of up to {MAX_STOPS} of them, "
                       f"got {json.dumps(own['stop'])}", "stop")
  try:
    options = RequestOptions(**own)
    options.check_budget(max_new_tokens)
  except OptionError as e:
    raise body_error(e, body) from None
  for name, hi in FORMAT_LIMITS.items():
    v = getattr(options, BODY_OPTIONS[name])
    if v is not None and v > hi:
      raise RequestError(f"body.{name} must be at most {hi} in this format, got {json.dumps(v)}", name)
  return {"id": cid, key: body[key]}, OpenAIOptions(url, options)


def _hash(*parts) -> str:
  return hashlib.sha256("\x00".join(json.dumps(p) for p in parts).encode()).hexdigest()[:24]


def finish_reason(reason: str) -> str:
  """The stream's finish reason in OpenAI's words: "eos" and "stop" are "stop", "length" stays."""
  return "length" if reason == "length" else "stop"


def _logprobs(res, model, chat: bool) -> dict | None:
  lp = getattr(res, "logprobs", None)
  if lp is None:
    return None
  top = getattr(res, "top_logprobs", None)
  tok = model.tokenizer
  if not chat:                                   # /v1/completions' legacy shape
    name = functools.partial(legacy_token, tok)
    return {"tokens": [name(t) for t in res.tokens], "token_logprobs": [float(p) for _, p in zip(res.tokens, lp)],
            "top_logprobs": None if top is None else [{name(a): float(b) for a, b in alts}
                                                   for _, alts in zip(res.tokens, top)],
            "text_offset": text_offsets(tok, res.tokens)}

  def entry(t, p) -> dict:
    return {"token": tok.decode([int(t)], skip_special_tokens=False), "logprob": float(p),
            "bytes": list(token_bytes(tok, t))}

  return {"content": [dict(entry(t, p), top_logprobs=[] if top is None else [entry(a, b) for a, b in top[i]])
                      for i, (t, p) in enumerate(zip(res.tokens, lp))]}


def legacy_token(tok, t) -> str:
  """A token as /v1/completions names it: its text, or, where its bytes are part of a character (a byte
  piece of an emoji), "bytes:" and their escapes, as OpenAI writes them, so no two tokens share a name."""
  raw = token_bytes(tok, t)
  try:
    raw.decode("utf-8")
  except UnicodeDecodeError:
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
  return tok.decode([int(t)], skip_special_tokens=False)


def text_offsets(tok, tokens) -> list[int]:
  """Where each token starts in the text of `tokens`, in characters: the characters its predecessors'
  bytes complete (a token inside a character starts where that character does). A decoder that drops the
  text's leading space (SentencePiece's) shifts every offset back by it."""
  dec, offsets, n = codecs.getincrementaldecoder("utf-8")("replace"), [], 0
  for t in tokens:
    offsets.append(n)
    n += len(dec.decode(token_bytes(tok, t)))
  lead = n - len(tok.decode([int(t) for t in tokens], skip_special_tokens=False))
  return [max(0, o - max(lead, 0)) for o in offsets]


def output_line(model, custom_id: str, options: OpenAIOptions, prompt_tokens: int, index: int, res,
                text: str, created: int) -> str:
  """The batch output line of one finished choice (its completion text already cut at EOS / a stop);
  `created`: when it finished, in Unix seconds (a field OpenAI's completion objects require)."""
  _, obj, prefix = URLS[options.url]
  chat = obj == "chat.completion"
  h = _hash(custom_id, index)
  choice = {"index": index}
  choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
  choice["finish_reason"] = finish_reason(res.finish_reason)
  choice["logprobs"] = _logprobs(res, model, chat) if options.request.logprobs else None
  n_new = len(res.tokens)
  body = {"id": prefix + h, "object": obj, "created": int(created), "model": model.name, "choices": [choice],
          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_new,
                    "total_tokens": prompt_tokens + n_new}}
  return json.dumps({"id": "batch_req_" + h, "custom_id": custom_id,
                     "response": {"status_code": 200, "request_id": "req_" + h, "body": body},
                     "error": None}, ensure_ascii=False) + "\n"


def error_line(line: int, custom_id: Any, message: str, code: str = "invalid_request") -> str:
  """The batch output line of a bad request (line: its 1-based input line, which keys it on resume)."""
  return json.dumps({"id": f"batch_req_line_{line}", "custom_id": custom_id, "response": None,
                     "error": {"code": code, "message": f"line {line}: {message}"}}, ensure_ascii=False) + "\n"


def record_keys(rec: dict) -> list:
  """The resume keys an output line holds: (json.dumps(custom_id), choice index) per choice, or
  ("error", id) for an error line. ValueError / KeyError / TypeError for anything else."""
  if rec.get("error") is not None:
    if not isinstance(rec["id"], str):
      raise ValueError
    return [("error", rec["id"])]
  choices = rec["response"]["body"]["choices"]
  if not isinstance(choices, list) or not choices:
    raise ValueError
  return [(json.dumps(rec["custom_id"]), int(c["index"])) for c in choices]
