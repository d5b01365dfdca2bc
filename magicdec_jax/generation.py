"""One-call entry points over the engine: `generate` (a fixed batch of prompts), `logits`, `prompt_logprobs`.

They build a plan for the call's shapes and settings, run the engine's prefill and decode steps once and
turn the result into host lists; continuous batching lives in stream.py and datagen.py, which drive the
same engine.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from magicdec_jax import compile as compiling
from magicdec_jax import row_features
from magicdec_jax.engine import Engine, GenerateResult, check_shrink_batch, stream_keys
from magicdec_jax.model import Model, full_forward
from magicdec_jax.options import OptionError, RequestOptions, check_stream_ids
from magicdec_jax.plan import eos_ids, make_plan
from magicdec_jax.prompts import pad_prompts, prompt_ids
from magicdec_jax.row_features import Run
from magicdec_jax.sampling import ROW_FIELDS
from magicdec_jax.settings import DecodeSettings, decode_settings

LONG_OUTPUT = 1024        # generate(progress=None) shows a progress bar from this many new tokens


def with_row_sampling(st: DecodeSettings, rows: Sequence[Mapping[str, Any]] | None, n: int):
  """(settings, RequestOptions [n] or None) for `row_sampling`: one dict per prompt of its own temperature
  / top_k / top_p / min_p over the run's, each checked as a request's options are; the settings turn
  per_row_sampling on. None: (st, None)."""
  if rows is None:
    return st, None
  rows = list(rows)
  if len(rows) != n:
    raise ValueError(f"row_sampling has {len(rows)} entries for {n} prompts")
  out = []
  for i, r in enumerate(rows):
    if not isinstance(r, Mapping) or set(r) - set(ROW_FIELDS):
      raise ValueError(f"row_sampling[{i}] must be a dict of {ROW_FIELDS}, got {r!r:.80}")
    try:
      out.append(RequestOptions(**r))
    except OptionError as e:
      raise ValueError(f"row_sampling[{i}]: {e}") from None
  return st.replace(per_row_sampling=True), out


def with_constraint(st: DecodeSettings, rows: list[RequestOptions] | None, n: int, model: Model,
                    **given) -> tuple[DecodeSettings, list[RequestOptions] | None]:
  """(settings, RequestOptions [n] or None) with `given` (json_schema / regex / choices; None: unset)
  set on every row and the constraint row feature compiled in; the constraint checked against the model's
  tokenizer first (ValueError naming the field). Nothing given: (st, rows)."""
  given = {k: v for k, v in given.items() if v is not None}
  if not given:
    return st, rows
  try:
    rows = [dataclasses.replace(o, **given) for o in rows] if rows is not None else [RequestOptions(**given)] * n
  except OptionError as e:
    raise ValueError(str(e)) from None
  feature = row_features.REGISTRY["constraint"]
  run = Run(st.sampler, model.config.vocab_size, model.tokenizer, eos=eos_ids(model.config, st.eos_token_id))
  try:
    row_features.check_served(rows[0], run)
  except OptionError as e:
    raise ValueError(str(e)) from None
  return (st if feature.enabled(st) else feature.enable(st)), rows


def padded(options: Sequence[RequestOptions] | None, b: int) -> list[RequestOptions] | None:
  """options [n] padded to b rows with the run's own settings (None stays None)."""
  return None if options is None else list(options) + [RequestOptions()] * (b - len(options))


def generate(model: Model, prompts, *, settings: DecodeSettings | None = None, stream_ids: Sequence[int] | None = None,
             mesh=None, device_memory: int | None = None, lengths=None, attention_mask=None,
             shrink_batch: bool = False, progress: bool | None = None,
             row_sampling: Sequence[Mapping[str, Any]] | None = None, json_schema: Any = None, regex: str | None = None,
             choices: Sequence[str] | None = None, **kwargs) -> GenerateResult:
  """Generate up to `max_new_tokens` per prompt; speculative when `draft` is given, same distribution.

  Decoding settings: a `DecodeSettings` (settings=) and/or its fields as keywords (max_new_tokens,
  temperature, top_k, top_p, seed, eos_token_id, draft, gamma, tree, attention_impl, hardware, acceptance,
  auto_fallback, xla_options, logprobs, top_logprobs; see settings.py). draft: None (autoregressive) or a drafts.Draft
  (StreamingDraft, SnapKVDraft, ModelDraft, FeatureDraft, PromptLookupDraft); gamma: chain length, or
  "auto": adaptive speculation (schedule.py): every round of the loop picks plain decoding (with
  auto_fallback) or a chain of gamma 1..3 from the batch's current context, at thresholds the cost model
  computes (tuning/autotune.py; `hardware` names the device or is a profile JSON from `run.py
  --mode=calibrate`, `acceptance` an acceptance vector or its JSON path from `run.py
  --mode=profile_acceptance`); stats["schedule"] says what ran at which context; `schedule` forces the
  thresholds ([(from_context, gamma), ...], gamma 0: plain). tree: a trees.Tree to speculate instead of a
  chain, or "auto" (adaptive between plain decoding and the cost model's Sequoia tree).

  stream_ids: per-prompt random-stream ids (default 0..n-1); a row's samples depend only on (seed, stream
  id), never on the rest of the batch. mesh: a sharding.make_mesh mesh (same tokens as one device; place
  the params once with sharding.shard_model). device_memory: bytes per device for the memory check;
  configurations that do not fit are refused before compiling. shrink_batch: once half the rows are done,
  go on with the rest in a batch half as large, and so on (shrink.py); same tokens; not with a mesh of
  several devices.
  progress: a tqdm bar (tokens, tokens/s) while decoding, the loop returning to the host every
  engine.SEGMENT_ROUNDS rounds (same tokens); None: for max_new_tokens >= LONG_OUTPUT.

  logprobs=True: `result.logprobs[i][j]` is new token j's log-probability under the distribution it was
  drawn from (temperature 0: the model's log_softmax; else after temperature, top-k and top-p), read from
  the target's logits in the verify pass, so speculation returns plain decoding's values (to float
  rounding). top_logprobs=k (0..20, needs logprobs): `result.top_logprobs[i][j]` is that distribution's k
  most likely tokens as (id, log-prob), most likely first (tokens a top-k / top-p cut removes left out).
  Off (the default), the compiled loop is the one without them. Prompt tokens: `prompt_logprobs`.

  row_sampling: one dict per prompt of its own temperature / top_k / top_p / min_p (missing keys: the run's);
  greedy and sampled prompts then share the batch and one compiled loop (per_row_sampling).

  json_schema / regex / choices (at most one): structured output for every prompt (the constraint row
  feature: each verified and drafted position masked by the constraint's automaton; a row that completes
  its constraint ends with finish reason "stop"). Per-prompt constraints: `request.Request`.

  prompts: a list of strings or of token-id lists (ragged is fine), or an integer array [B, T] (numpy or
  jax) with `lengths` [B] or an HF-style `attention_mask` [B, T] (prompts.py).
  """
  st = decode_settings(settings, **kwargs)
  ids = prompt_ids(model, prompts, lengths=lengths, attention_mask=attention_mask)
  n = len(ids)
  st, rows_o = with_row_sampling(st, row_sampling, n)
  st, rows_o = with_constraint(st, rows_o, n, model, json_schema=json_schema, regex=regex, choices=choices)
  stream_ids = list(range(n)) if stream_ids is None else check_stream_ids(stream_ids)
  if len(stream_ids) != n:
    raise ValueError(f"stream_ids has {len(stream_ids)} entries for {n} prompts")
  longest = max(map(len, ids))
  p = make_plan(model, st, batch=n, shortest=min(map(len, ids)), longest=longest, fixed_batch=True, mesh=mesh,
                device_memory=device_memory)
  check_shrink_batch(shrink_batch, p)
  if progress not in (None, True, False):
    raise ValueError(f"progress must be True, False or None (a bar for long outputs), got {progress!r}")
  p.check_prompts(ids)
  b, p_bucket = p.batch_rows(n), p.prompt_bucket(longest)
  num_slots = p.num_slots(p_bucket)
  p.check_memory(b, num_slots, p_bucket)
  eng = Engine(model, p)
  if rows_o is not None:
    eng.fit(rows_o)
  tokens, row_lengths = (jnp.asarray(x) for x in pad_prompts(ids, b, p_bucket))
  max_new = np.zeros((b,), np.int32)
  max_new[:n] = st.max_new_tokens
  keys = stream_keys(st.seed, stream_ids, b)
  compiling.ensure_persistent_cache()
  (target, ring), prefill_s, prefill_compile_s = compiling.timed(eng.prefill, tokens, row_lengths, num_slots)
  bar = None
  if progress or (progress is None and st.max_new_tokens >= LONG_OUTPUT):
    bar = tqdm.tqdm(total=n * st.max_new_tokens, unit="tok", desc="generate", leave=False)

  def decode():
    opts = padded(rows_o, b)
    state = eng.initial_state(tokens, row_lengths, jnp.asarray(max_new), keys, target, ring,
                              None if opts is None else eng.feature_rows(opts))
    return eng.run(state, shrink_batch, bar)
  try:
    fin, decode_s, decode_compile_s = compiling.timed(decode)
  finally:
    if bar is not None:
      bar.close()
  # compilation (first call of a bucket) is reported apart from the prefill / decode times
  result = eng.result(fin, n, prefill_s, decode_s)
  result.stats.update(compile_s=prefill_compile_s + decode_compile_s, prefill_compile_s=prefill_compile_s,
                      decode_compile_s=decode_compile_s)
  return result


def check_context(model: Model, ids: list[list[int]]) -> list[list[int]]:
  """`ids`, or ValueError naming the first prompt longer than the model's context (whose positions the
  model was not trained for: its logits there mean nothing)."""
  ctx = model.config.max_position_embeddings
  for i, t in enumerate(ids):
    if len(t) > ctx:
      raise ValueError(f"prompt {i} has {len(t)} tokens, more than the model's context of {ctx}")
  return ids


def logits(model: Model, token_ids) -> np.ndarray:
  """A plain full forward: equal-length token-id lists [B][T] or an integer array [B, T] (numpy or jax)
  -> float32 numpy [B, T, V]."""
  ids = check_context(model, prompt_ids(model, token_ids))
  if len({len(t) for t in ids}) != 1:
    raise ValueError("logits() needs prompts of equal length")
  return np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)))


def prompt_logprobs(model: Model, token_ids) -> list[list[float]]:
  """Teacher-forced log-probabilities of prompt tokens under the model's raw distribution (log_softmax of
  the full forward's logits): prompts as `generate`'s (text, ragged token-id lists or an array) -> per
  prompt T - 1 floats, entry j that of token j + 1 given tokens 0..j (the first token has none). Ragged
  prompts are right-padded into one forward (causal: padding after a token never changes its logits)."""
  ids = check_context(model, prompt_ids(model, token_ids))
  longest = max(map(len, ids))
  tokens = np.zeros((len(ids), longest), np.int32)
  for i, t in enumerate(ids):
    tokens[i, :len(t)] = t
  logp = jax.nn.log_softmax(full_forward(model.params, model.config, jnp.asarray(tokens))[:, :-1], axis=-1)
  chosen = np.asarray(jnp.take_along_axis(logp, jnp.asarray(tokens[:, 1:, None]), axis=-1)[:, :, 0])
  return [chosen[i, :len(t) - 1].astype(float).tolist() for i, t in enumerate(ids)]
