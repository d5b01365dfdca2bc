"""A stream's requests and results: `Request` (a prompt and its own options), `StreamResult` (a finished
sample), how a list of requests is checked and which row features it turns on, and the default stream ids of
samples past the run's count.

Why a module of their own: every way a request comes in (the Python API, datagen's records, OpenAI batch
bodies) builds these, and the stream's host loop (stream.py) only consumes them.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

from magicdec_jax import row_features
from magicdec_jax.model import Model
from magicdec_jax.options import OptionFields, RequestOptions
from magicdec_jax.row_features import Run
from magicdec_jax.settings import DecodeSettings


@dataclasses.dataclass(frozen=True)
class Request(OptionFields):
  """One prompt (text or token ids), and its own options as keywords (options.OptionFields; None: the
  run's), checked when the stream reads the request (a bad one is refused naming its index and field).

  stream_ids: one random-stream id per sample (default: request i gets i * num_samples + s for sample s,
  so with one sample the ids of `generate`; samples past the Generator's num_samples get 2**31 + a hash
  of (i, s)); with `seed` the default is 0 .. n-1, so sample s is `generate([prompt] * n, seed=seed)`'s
  row s and depends on (seed, stream id) only. max_new_tokens: at most the run's (which sizes the
  buffers). seed: in [0, 2**32), the PRNG seed of this request's streams (the run's seed otherwise).
  num_samples: samples of this request (default the Generator's; len(stream_ids) when given).
  stop: strings that end the output at their first occurrence in the decoded text (the tokens up to and
  including the one completing it are kept; the text is cut before it, or after it with keep_stop);
  stop_token_ids: ids that end it as EOS does (the text is cut before the id's text unless keep_stop);
  finish_reason "stop". temperature / top_k / top_p / min_p: this request's sampling (None: the run's; a
  request that sets any needs a stream planned with per_row_sampling, which a list of requests gets by
  itself). logprobs / top_logprobs: compiled into the loop, so where set they must be the run's.
  json_schema / regex / choices (at most one): structured output (the constraint row feature, which a
  list of requests turns on by itself): the output matches the JSON schema, the regex (Rust syntax, the
  whole text) or one of the strings; a row that completes its constraint ends with finish reason "stop".
  A constraint the library cannot compile is refused naming the request and the reason.
  tag: returned untouched.
  """
  prompt: Any
  stream_ids: Sequence[int] | None = None
  tag: Any = None

  @classmethod
  def of(cls, prompt: Any, options: RequestOptions, **kw) -> "Request":
    """A request for `prompt` with these options (kw: stream_ids, tag)."""
    return cls(prompt, **kw, **options.given())


def with_features(st: DecodeSettings, options: Sequence[RequestOptions], model: Model) -> DecodeSettings:
  """`st` with every row feature some of these requests need compiled in (a list of requests turns
  per-row sampling on by itself, as it would any registered feature)."""
  run = Run(dataclasses.replace(st.sampler, per_row=False), model.config.vocab_size, model.tokenizer)
  for name in row_features.wanted(options, run):
    feature = row_features.REGISTRY[name]
    if not feature.enabled(st):
      st = feature.enable(st)
  return st


def request_options(requests: Sequence) -> list[RequestOptions]:
  """The checked options of each `Request` of a list (ValueError naming the request's index)."""
  out = []
  for i, r in enumerate(requests):
    if isinstance(r, Request):
      try:
        out.append(RequestOptions.of(r))
      except ValueError as e:
        raise ValueError(f"request {i}: {e}") from None
  return out


@dataclasses.dataclass
class StreamResult:
  index: int                 # the request's position in `requests`
  sample: int                # position in the request's stream ids
  stream_id: int
  tag: Any
  tokens: list[int]          # new token ids
  text: str | None
  finish_reason: str         # "eos" | "length" | "stop" (a stop string or stop token id)
  stats: dict[str, Any]      # engine.row_stat figures
  logprobs: list[float] | None = None    # each new token's log-probability (settings.logprobs)
  top_logprobs: list[list[tuple[int, float]]] | None = None   # per token: (id, log-prob), most likely first


def overflow_stream(index: int, sample: int) -> int:
  """The default stream id of sample `sample` of request `index` past the Generator's num_samples: 2**31
  plus 31 bits of a hash of (index, sample) (never a default id below 2**31, nor a padding row's)."""
  digest = hashlib.sha256(f"{index}\x00{sample}".encode()).digest()
  return 2**31 + (int.from_bytes(digest[:4], "big") & 0x7FFFFFFF)
