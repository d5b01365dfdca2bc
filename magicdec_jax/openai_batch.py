"""OpenAI batch files for datagen: a request line -> the native record plus its own options; a finished
choice or a bad request -> an output line in the OpenAI batch output shape.

Why a module of its own: datagen.py keeps the run (parsing, resume, crash safety); this one only knows the
format. Input lines are `{"custom_id", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions",
"body": {...}}`; every body field is checked here (type and range), and anything unknown is refused naming
the field, never silently ignored. A request with n choices gives one output line per choice (its
`choices[0].index`), written as the choice finishes, so a crash loses at most the choice being written and a
resume regenerates only the missing (custom_id, index) pairs.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

URLS = {"/v1/chat/completions": ("messages", "chat.completion", "chatcmpl-"),
        "/v1/completions": ("prompt", "text_completion", "cmpl-")}
TOP_FIELDS = {"custom_id", "method", "url", "body"}
BODY_FIELDS = {"messages", "prompt", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
               "stop", "n", "seed", "logprobs", "top_logprobs"}
MAX_STOPS = 4                  # as the OpenAI API
SEED_MOD = 2**32               # a seed is reduced modulo this (the loop's PRNG seed is a uint32)


class RequestError(ValueError):
  """A bad request; `field` names the offending field (None: the line as a whole)."""

  def __init__(self, message: str, field: str | None = None):
    super().__init__(message)
    self.field = field


def is_openai(first: dict) -> bool:
  """Whether a parsed first input line is an OpenAI batch request (it has "custom_id" and "body")."""
  return isinstance(first, dict) and "custom_id" in first and "body" in first


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
  v = body.get(name)
  if v is None:
    return None
  if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise RequestError(f"body.{name} must be an integer {rng}, got {json.dumps(v)}", name)
  return v


def _float(body: dict, name: str, lo: float, hi: float) -> float | None:
  v = body.get(name)
  if v is None:
    return None
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
    raise RequestError(f"body.{name} must be a number in [{lo}, {hi}], got {json.dumps(v)}", name)
  return float(v)


def to_native(rec: dict, *, max_new_tokens: int) -> tuple[dict, dict]:
  """One parsed request line -> (native record {"id", "prompt" | "messages"}, options): options hold
  url, max_new_tokens, temperature / top_p (None: the run's), stop (list of str), n, seed, logprobs,
  top_logprobs. Raises RequestError naming the field."""
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
  max_tokens = _int(body, "max_tokens", 1)
  mct = _int(body, "max_completion_tokens", 1)
  if max_tokens is None:
    max_tokens = mct
  name = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
  if max_tokens is not None and max_tokens > max_new_tokens:
    raise RequestError(f"body.{name}={max_tokens} is over the run's max_new_tokens={max_new_tokens} "
                       "(which sizes the buffers; raise --max_new_tokens)", name)
  stop = body.get("stop")
  if isinstance(stop, str):
    stop = [stop]
  if stop is not None and (not isinstance(stop, list) or len(stop) > MAX_STOPS
                           or not all(isinstance(s, str) and s for s in stop)):
    raise RequestError(f"body.stop must be a non-empty string or a list of up to {MAX_STOPS} of them, "
                       f"got {json.dumps(stop)}", "stop")
  seed = body.get("seed")
  if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
    raise RequestError(f"body.seed must be an integer, got {json.dumps(seed)}", "seed")
  logprobs = body.get("logprobs")
  if logprobs is not None and not isinstance(logprobs, bool):
    raise RequestError(f"body.logprobs must be true or false, got {json.dumps(logprobs)}", "logprobs")
  top = _int(body, "top_logprobs", 0, 20)
  if top and not logprobs:
    raise RequestError("body.top_logprobs needs body.logprobs = true", "top_logprobs")
  options = dict(url=url, max_new_tokens=max_tokens, temperature=_float(body, "temperature", 0.0, 2.0),
                 top_p=_float(body, "top_p", 0.0, 1.0), stop=stop, n=_int(body, "n", 1, 128) or 1,
                 seed=None if seed is None else seed % SEED_MOD, logprobs=bool(logprobs), top_logprobs=top or 0)
  if options["top_p"] == 0.0:
    raise RequestError("body.top_p must be > 0, got 0", "top_p")
  return {"id": cid, key: body[key]}, options


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
  content = []
  for i, (t, p) in enumerate(zip(res.tokens, lp)):
    entry = {"token": model.tokenizer.decode([t], skip_special_tokens=False), "logprob": float(p)}
    if top is not None:
      entry["top_logprobs"] = [{"token": model.tokenizer.decode([int(a)], skip_special_tokens=False),
                                "logprob": float(b)} for a, b in top[i]]
    content.append(entry)
  if chat:
    return {"content": content}
  return {"tokens": [c["token"] for c in content], "token_logprobs": [c["logprob"] for c in content],
          "top_logprobs": None if top is None else [{e["token"]: e["logprob"] for e in c["top_logprobs"]}
                                                   for c in content]}


def output_line(model, custom_id: str, options: dict, prompt_tokens: int, index: int, res, text: str) -> str:
  """The batch output line of one finished choice (its completion text already cut at EOS / a stop)."""
  _, obj, prefix = URLS[options["url"]]
  chat = obj == "chat.completion"
  h = _hash(custom_id, index)
  choice = {"index": index}
  choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
  choice["finish_reason"] = finish_reason(res.finish_reason)
  choice["logprobs"] = _logprobs(res, model, chat) if options.get("logprobs") else None
  n_new = len(res.tokens)
  body = {"id": prefix + h, "object": obj, "model": model.name, "choices": [choice],
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
