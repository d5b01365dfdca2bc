"""Resumable, crash-safe offline generation: JSONL prompts in, one JSONL record per (id, sample) out.

Why this shape: long offline jobs get killed. Generation runs on `stream.generate_stream` (continuous
batching: a finished row's slot is refilled at once), and each record is written whole, flushed and
fsynced as soon as its sample finishes; on start a torn tail (a SIGKILL mid-write) is truncated away and
every (id, sample) already in the output is skipped, so a resumed run ends with each exactly once. A
sample's random stream depends only on (seed, id, sample index) (`datagen_formats.stream_id`) and its own
round count, so what a record holds never depends on which run, slot or neighbours produced it.

Input formats (datagen_formats.py): native lines `{"id", "prompt" | "messages"}`, each with its own
options by their `options.RequestOptions` names, and OpenAI batch request lines (openai_batch.py: each
request with its own max_tokens, stop, n, seed, temperature, top_p, response_format; one output line per
choice in the batch output shape, bad requests as error lines). Both become RequestOptions, checked there.
Requests with their own temperature / top_p share one `generate_stream` (per-row sampling: the settings
are data in the loop); the loop compiles the log-probability setting in, so requests are grouped by it,
each group its own stream (plan and executables); the summary says how many groups ran.
"""
from __future__ import annotations

import json
import os
import time

from magicdec_jax import engine, openai_batch, sampling
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.datagen_files import (DatagenError, atomic_write, check_config, open_output,
                                       repair_output, shard_path, split)
from magicdec_jax.datagen_formats import FORMATS, Item, Job, plan_over
from magicdec_jax.model import Model
from magicdec_jax.options import check_count
from magicdec_jax.plan import DecodePlan, eos_ids
from magicdec_jax.row_features import Run
from magicdec_jax.settings import DecodeSettings, decode_settings

# settings that only steer gamma / tree = "auto": the fingerprint holds the draft and tree auto chose instead
AUTO_INPUTS = ("gamma", "hardware", "acceptance", "auto_fallback", "learn_acceptance")
INPUT_FORMATS = ("auto", "native", "openai")


def _prompt_text(model: Model, rec: dict, chat: bool, render_chat) -> str:
  if "messages" in rec:
    msgs = rec["messages"]
    try:
      tok_lib.check_messages(msgs)             # (before the empty check, which reads each content)
    except ValueError as e:
      raise DatagenError(str(e)) from e
    if not any(m["content"].strip() for m in msgs):
      raise DatagenError("empty prompt (every message is empty)")
    try:
      return render_chat(model, msgs)
    except ValueError as e:                     # the template's own refusal
      raise DatagenError(str(e)) from e
  p = rec["prompt"]
  if not isinstance(p, str):
    raise DatagenError(f"'prompt' must be a string, got {type(p).__name__}")
  if not p.strip():
    raise DatagenError("empty prompt")
  return render_chat(model, [{"role": "user", "content": p}]) if chat else p


def detect_format(path: str) -> str:
  """"openai" if the first line of `path` that parses as JSON is meant as an OpenAI batch request
  (openai_batch.is_openai), else "native"; lines that do not parse are passed over, so that a torn or
  malformed first request does not make every other line of the file a native record's error."""
  try:
    with open(path, "rb") as f:
      for raw in f:
        try:
          return "openai" if openai_batch.is_openai(json.loads(raw)) else "native"
        except ValueError:            # blank, not JSON or not UTF-8
          continue
  except OSError as e:
    raise DatagenError(f"cannot read input {path}: {e.strerror or e}") from None
  return "native"


def parse_input(path: str, model: Model, *, max_new_tokens: int, truncate: str = "none", chat: bool = False,
                render_chat=None, input_format: str = "native", eos: tuple[int, ...] | None = None
                ) -> tuple[list[Item], list[dict]]:
  """Read and validate every line -> (items, errors). Errors are {'line', 'id', 'reason', 'text'}.
  input_format "openai": each line an OpenAI batch request (openai_batch.to_native; 'id' is its
  custom_id, its options in Item.options). eos: the run's stop ids (None: the model's), which a
  constraint is compiled with when its line is read (a bad one is an error line)."""
  fmt = FORMATS[input_format]
  if render_chat is None:
    render_chat = tok_lib.chat_prompt
  if model.tokenizer is None:
    raise DatagenError(f"model {model.name!r} has no tokenizer; datagen needs text prompts tokenized")
  try:
    with open(path, "rb") as f:
      raw_lines = f.read().split(b"\n")
  except OSError as e:
    raise DatagenError(f"cannot read input {path}: {e.strerror or e}") from None
  limit = model.config.max_position_embeddings - max_new_tokens
  if limit < 1:
    raise DatagenError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's context "
                       f"of {model.config.max_position_embeddings}")
  run = Run(sampling.Sampling(), model.config.vocab_size, model.tokenizer,
            eos=tuple(model.config.eos_token_ids if eos is None else eos))
  items, errors, seen = [], [], {}
  for n, raw in enumerate(raw_lines, 1):
    if not raw.strip():
      continue
    rid = None
    try:
      try:
        text = raw.decode("utf-8-sig" if n == 1 else "utf-8")      # (a byte-order mark opening the file)
      except UnicodeDecodeError as e:
        raise DatagenError(f"invalid UTF-8 at byte {e.start}") from None
      try:
        rec = json.loads(text)
      except json.JSONDecodeError as e:
        raise DatagenError(f"malformed JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
      try:
        rec, options = fmt.to_native(rec, max_new_tokens, run)
      except openai_batch.RequestError as e:
        rid = fmt.line_id(rec)
        raise DatagenError(str(e)) from None
      if not isinstance(rec, dict):
        raise DatagenError(f"expected a JSON object, got {type(rec).__name__}")
      if "id" not in rec:
        raise DatagenError("missing 'id'")
      rid = rec["id"]
      if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise DatagenError(f"'id' must be a non-empty string or an integer, got {json.dumps(rid)}")
      key = json.dumps(rid)
      if key in seen:
        raise DatagenError(f"duplicate {fmt.id_field} {key} (first on line {seen[key]})")
      if ("prompt" in rec) == ("messages" in rec):
        raise DatagenError("needs exactly one of 'prompt' or 'messages'")
      seen[key] = n
      options = fmt.options(rec, options, max_new_tokens, run)
      ids = tok_lib.encode(model.tokenizer, _prompt_text(model, rec, chat and fmt.renders_chat, render_chat))
      if not ids:
        raise DatagenError("empty prompt (no tokens)")
      own = getattr(fmt.request(options), "max_new_tokens", None) or max_new_tokens
      cut = 0
      room = model.config.max_position_embeddings - own       # the record's own budget, as a stream's request
      if len(ids) > room:
        if truncate != "left":
          raise DatagenError(f"prompt has {len(ids)} tokens; with max_new_tokens={own} the "
                             f"model's context of {model.config.max_position_embeddings} allows {room} "
                             "(use --truncate=left)")
        cut = len(ids) - room
        ids = ids[cut:]
      items.append(Item(n, rid, key, ids, cut, options))
    except DatagenError as e:
      errors.append({"line": n, "id": rid, "reason": str(e),
                     "text": raw[:200].decode("utf-8", errors="replace")})
  return items, errors


def fingerprint(model: Model, used: DecodePlan, **job) -> dict:
  """What shapes a record's samples: the model, the sampler, the settings as planned (draft, tree and
  schedule as resolved, where they change the samples: rejection sampling, a tree or fast numerics), and
  the job's own options. Greedy and invariant sampling of a chain with invariant numerics give plain
  decoding's tokens bit for bit with any draft, so such a run may resume with another
  (DecodePlan.draft_shapes_samples)."""
  skip = AUTO_INPUTS + (() if used.draft_shapes_samples else ("draft", "tree", "schedule"))
  fp = {k: v for k, v in used.fingerprint().items() if k not in skip}
  return {"model": model.name, "sampler": sampling.SAMPLER[used.settings.sampling], **fp, **job}


def run(model: Model, input_path: str, output_path: str, *, settings: DecodeSettings | None = None,
        batch_size: int = 4, refill_at: int = 1, num_samples: int = 1, on_error: str = "fail",
        truncate: str = "none", chat: bool = False, progress: bool = True, process_index: int = 0,
        process_count: int = 1, mesh=None, device_memory: int | None = None, input_format: str = "auto",
        **kwargs) -> dict:
  """Generate every missing (id, sample) of `input_path` into `output_path`; returns the summary dict.

  Decoding settings as `generate`'s: settings= (a DecodeSettings) and/or its fields as keywords
  (max_new_tokens, draft, gamma, tree, temperature, top_k, top_p, seed, ...). batch_size: decode slots;
  refill_at: finished rows that send the loop back to refill them (batch_size: static batching). An
  output already holding records is resumed only if everything that shapes its samples is the same
  (`fingerprint`, with "auto" resolved to the draft and tree it picks); otherwise DatagenError names
  what differs. With process_count > 1 this process takes every process_count-th record from
  process_index and writes shard_path(output_path, ...) (merged by merge_shards once every process is done).
  input_format: "native", "openai" (OpenAI batch request lines: their own max_tokens / stop / n / seed /
  temperature / top_p; bad requests become error lines in the output, whatever on_error says) or "auto"
  (by the first line: detect_format).
  """
  try:
    st = decode_settings(settings, **kwargs)
  except ValueError as e:
    raise DatagenError(str(e)) from None
  try:
    for name, v in (("batch_size", batch_size), ("refill_at", refill_at), ("num_samples", num_samples)):
      check_count(name, v, 1)
  except ValueError as e:
    raise DatagenError(str(e)) from None
  batch_size, refill_at, num_samples = int(batch_size), int(refill_at), int(num_samples)
  if not isinstance(progress, bool) or not isinstance(chat, bool):
    raise DatagenError(f"progress and chat must be True or False, got {progress!r}, {chat!r}")
  if process_count > 1:
    output_path = shard_path(output_path, process_index, process_count)
  if on_error not in ("fail", "skip") or truncate not in ("none", "left"):
    raise DatagenError(f"on_error must be fail|skip and truncate none|left, got {on_error!r}, {truncate!r}")
  if os.path.abspath(input_path) == os.path.abspath(output_path):
    raise DatagenError("input and output are the same file")
  if input_format not in INPUT_FORMATS:
    raise DatagenError(f"input_format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
  fmt = FORMATS[detect_format(input_path) if input_format == "auto" else input_format]
  fmt.check_processes(process_count)
  t_start = time.perf_counter()
  existed = os.path.exists(output_path)
  out_f = open_output(output_path)   # fail early on an unwritable path
  try:
    items, errors = parse_input(input_path, model, max_new_tokens=st.max_new_tokens, truncate=truncate, chat=chat,
                                input_format=fmt.name, eos=eos_ids(model.config, st.eos_token_id))
    fmt.refuse_bad_lines(input_path, errors, on_error, output_path + ".errors.jsonl")
    st = fmt.settings(st, items, model)
    try:
      used = plan_over(model, st, items, batch_size, mesh, device_memory)
    except ValueError as e:
      raise DatagenError(str(e)) from None
    if process_count > 1:
      items = split(items, process_index, process_count)
      errors = errors if process_index == 0 else []    # bad lines are reported once, by process 0
    fmt.record_bad_lines(output_path + ".errors.jsonl", errors, on_error)
    auto = "auto" in (st.gamma, st.tree)
    check_config(output_path, fingerprint(model, used, **fmt.job(chat=chat, truncate=truncate,
                                                                 num_samples=num_samples)),
                 resolved=("draft", "tree", "schedule"),
                 why="the cost model resolves gamma / tree = 'auto' for the batch size among the rest: resume "
                     "with the first run's batch size, hardware and acceptance" if auto else "")
    out_f.close()
    done, cut = repair_output(output_path)
    out_f = open_output(output_path)
    job = Job(model, st, used, items, errors, done, out_f, progress, num_samples,
              dict(batch_size=batch_size, refill_at=refill_at), dict(mesh=mesh, device_memory=device_memory))
    stats = fmt.generate(job)
  except DatagenError:
    if not existed and os.path.getsize(output_path) == 0:    # refused before any record: leave no file
      os.remove(output_path)
    raise
  finally:
    out_f.close()
  wall = time.perf_counter() - t_start
  done = fmt.records_done(done)
  rate, mean = engine.acceptance(stats["accepted"], stats["drafted"], stats["steps"])
  summary = {
      "input": input_path, "output": output_path, "records_total": len(done) + stats["records"],
      "records_written": stats["records"], "records_skipped_existing": len(done),
      "bad_lines": len(errors), "torn_bytes_repaired": cut, "new_tokens": stats["tokens"],
      "wall_s": wall, "generate_s": stats["gen_s"], "slot_utilization": stats["slot_utilization"],
      "tokens_per_s": stats["tokens"] / stats["gen_s"] if stats["gen_s"] > 0 else None,
      "verify_steps": stats["steps"], "accepted_tokens": stats["accepted"],
      "acceptance_rate": rate, "mean_accepted_length": mean, "input_format": fmt.name,
      "sampling_groups": stats["groups"], **fmt.summary(stats),
  }
  atomic_write(output_path + ".summary.json", json.dumps(summary, indent=1) + "\n")
  return summary
