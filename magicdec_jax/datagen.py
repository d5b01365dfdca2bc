"""Resumable, crash-safe offline generation: JSONL prompts in, one JSONL record per (id, sample) out.

Why this shape: long offline jobs get killed. Generation runs on `stream.generate_stream` (continuous
batching: a finished row's slot is refilled at once), and each record is written whole, flushed and
fsynced as soon as its sample finishes; on start a torn tail (a SIGKILL mid-write) is truncated away and
every (id, sample) already in the output is skipped, so a resumed run ends with each exactly once. A
sample's random stream depends only on (seed, id, sample index) (`stream_id`) and its own round count, so
what a record holds never depends on which run, slot or neighbours produced it.

Input formats: native lines `{"id", "prompt" | "messages"}`, each with its own options by their
`options.RequestOptions` names (NATIVE_OPTIONS), and OpenAI batch request lines (openai_batch.py: each
request with its own max_tokens, stop, n, seed, temperature, top_p, response_format; one output line per
choice in the batch output shape, bad requests as error lines). Both become RequestOptions, checked there.
Requests with their own temperature / top_p share one `generate_stream` (per-row sampling: the settings
are data in the loop); the loop compiles the log-probability setting in, so requests are grouped by it,
each group its own stream (plan and executables); the summary says how many groups ran.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any

from tqdm import tqdm

from magicdec_jax import engine, openai_batch, row_features, sampling
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.model import Model
from magicdec_jax.options import FIELDS, OptionError, RequestOptions, check_count
from magicdec_jax.plan import DecodePlan, bucket, eos_ids, make_plan
from magicdec_jax.row_features import Run
from magicdec_jax.settings import DecodeSettings, decode_settings
from magicdec_jax.datagen_files import (DatagenError, atomic_write, check_config, open_output,
                                       repair_output, shard_path, split, write_errors, write_line)
from magicdec_jax.stream import Request, generate_stream, with_features

# settings that only steer gamma / tree = "auto": the fingerprint holds the draft and tree auto chose instead
AUTO_INPUTS = ("gamma", "hardware", "acceptance", "auto_fallback", "learn_acceptance")
INPUT_FORMATS = ("auto", "native", "openai")


@dataclasses.dataclass
class Item:
  line: int          # 1-based input line
  id: Any            # the record's id (str or int)
  key: str           # json.dumps(id): distinguishes 1 from "1"
  ids: list[int]     # prompt token ids (after chat rendering and truncation)
  truncated: int     # tokens dropped from the left
  options: Any = None    # an OpenAI request's own options (openai_batch.OpenAIOptions), or a native
                          #   record's RequestOptions (native_options; None: the run's)


NATIVE_FIELDS = ("id", "prompt", "messages")
# a record's own options: every RequestOptions field but those a native record cannot honour (its samples are
# the run's num_samples_per_prompt; its output has no log-probabilities)
NATIVE_OPTIONS = tuple(f for f in FIELDS if f not in ("num_samples", "logprobs", "top_logprobs"))


def native_options(rec: dict, max_new_tokens: int, run: Run | None = None) -> RequestOptions | None:
  """A native record's own options (NATIVE_OPTIONS; None when it has none), checked as RequestOptions
  (and against the run's budget and the registered row features; with `run`, their own checks: a
  constraint that cannot compile); a field that is neither an option nor NATIVE_FIELDS is refused by name."""
  unknown = sorted(set(rec) - set(NATIVE_FIELDS) - set(NATIVE_OPTIONS))
  if unknown:
    raise DatagenError(f"unknown field(s) {', '.join(map(repr, unknown))} (a record holds "
                       f"{', '.join(NATIVE_FIELDS)} and its own {', '.join(NATIVE_OPTIONS)})")
  own = {k: rec[k] for k in NATIVE_OPTIONS if rec.get(k) is not None}
  if not own:
    return None
  try:
    opts = RequestOptions(**own)
    opts.check_budget(max_new_tokens)
    row_features.check_served(opts, run)
  except OptionError as e:
    raise DatagenError(e.render(f"'{e.field}'")) from None
  return opts


def stream_id(record_id, sample: int) -> int:
  """A stable 31-bit random-stream id for (id, sample), independent of Python's hash seed."""
  digest = hashlib.sha256(f"{json.dumps(record_id)}\x00{sample}".encode()).digest()
  return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _prompt_text(model: Model, rec: dict, chat: bool, render_chat) -> str:
  if "messages" in rec:
    msgs = rec["messages"]
    if isinstance(msgs, list) and any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in msgs):
      raise DatagenError("a message's 'content' is a list of content parts, which are not supported: give "
                         "its text as a string")
    if not isinstance(msgs, list) or not msgs or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in msgs):
      raise DatagenError("'messages' must be a non-empty list of {\"role\": str, \"content\": str}")
    if not any(m["content"].strip() for m in msgs):
      raise DatagenError("empty prompt (every message is empty)")
    try:
      return render_chat(model, msgs)
    except ValueError as e:                     # an unknown role, or the template's own refusal
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
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DatagenError(f"invalid UTF-8 at byte {e.start}") from None
      try:
        rec = json.loads(text)
      except json.JSONDecodeError as e:
        raise DatagenError(f"malformed JSON ({e.msg} at column {e.colno})") from None
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
      ids = list(model.tokenizer.encode(_prompt_text(model, rec, chat and fmt.renders_chat, render_chat)).ids)
      if not ids:
        raise DatagenError("empty prompt (no tokens)")
      cut = 0
      if len(ids) > limit:
        if truncate != "left":
          raise DatagenError(f"prompt has {len(ids)} tokens; with max_new_tokens={max_new_tokens} the "
                             f"model's context of {model.config.max_position_embeddings} allows {limit} "
                             "(use --truncate=left)")
        cut = len(ids) - limit
        ids = ids[cut:]
      items.append(Item(n, rid, key, ids, cut, options))
    except DatagenError as e:
      errors.append({"line": n, "id": rid, "reason": str(e),
                     "text": raw[:200].decode("utf-8", errors="replace")})
  return items, errors


def plan_over(model: Model, st: DecodeSettings, items: list[Item], batch_size: int, mesh,
              device_memory: int | None = None) -> DecodePlan:
  """The run's plan, made over every input record (so a resumed run plans the same): gamma / tree = "auto"
  resolved to the draft it keeps and its schedule. The thresholds stay as planned (no learning from the
  run's own acceptance, which would make the schedule, and under rejection sampling the samples, depend
  on timing)."""
  ids = [it.ids for it in items] or [[0]]
  return make_plan(model, st.replace(learn_acceptance=False), batch=batch_size, shortest=min(len(i) for i in ids),
              longest=max(len(i) for i in ids), mesh=mesh, device_memory=device_memory)


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
    check_config(output_path, fingerprint(model, used, **fmt.job(chat=chat, truncate=truncate,
                                                                 num_samples=num_samples)))
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


def _record(it: Item, sample: int, res) -> str:
  toks, reason, rs = res.tokens, res.finish_reason, res.stats
  return json.dumps({
      "id": it.id, "sample": sample, "completion": res.text,
      "token_ids": toks, "finish_reason": reason, "prompt_tokens": len(it.ids), "truncated_tokens": it.truncated,
      "stats": {"new_tokens": rs["new_tokens"], "verify_steps": rs["verify_steps"],
                "accepted_tokens": rs["accepted_tokens"]}}, ensure_ascii=False) + "\n"


def _bar(todo: int, already: int, progress: bool):
  return tqdm(total=todo + already, initial=already, unit="rec", disable=not progress, dynamic_ncols=True)


def _generate_jobs(model, streams, line, out_f, bar) -> dict:
  """streams: (requests, generate_stream keywords) each, run one after another; a request's tag is (item,
  its missing sample indices), and the requests of a stream are sorted by prompt bucket (consumed lazily,
  the cache grows bucket by bucket). line(item, sample, result) -> the output line, written, flushed and
  fsynced as its sample finishes."""
  tot = dict(records=0, tokens=0, steps=0, accepted=0, drafted=0, gen_s=0.0, row_rounds=0, active=0, groups=0)
  for requests, gen in streams:
    stream = generate_stream(model, requests, **gen)
    for res in stream:
      it, samples = res.tag
      write_line(out_f, line(it, samples[res.sample], res))
      tot["records"] += 1
      tot["tokens"] += len(res.tokens)
      tot["steps"] += res.stats["verify_steps"]
      tot["accepted"] += res.stats["accepted_tokens"]
      tot["drafted"] += res.stats["drafted_tokens"]     # the row's own (a schedule's plain rounds draft none)
      st = stream.stats
      bar.update(1)
      bar.set_postfix(tok_s=f"{st['tokens_per_s'] or 0:.1f}", util=f"{st['slot_utilization'] or 0:.2f}",
                      acc="-" if not tot["drafted"] else f"{tot['accepted'] / tot['drafted']:.2f}",
                      refresh=False)      # drawn at tqdm's pace, not once per record
    st = stream.stats
    tot["gen_s"] += st["prefill_s"] + st["insert_s"] + st["decode_s"]
    tot["row_rounds"] += st["row_rounds"]
    tot["active"] += st["active_row_rounds"]
    tot["groups"] += st["records"] > 0 or st["decode_calls"] > 0
  bar.close()
  tot["slot_utilization"] = tot["active"] / tot["row_rounds"] if tot["row_rounds"] else None
  return tot


@dataclasses.dataclass
class Job:
  """What a format's generate step needs: the run as planned and the output as found."""
  model: Model
  settings: DecodeSettings
  plan: DecodePlan                # planned over every input record (plan_over)
  items: list                     # [Item] this process's valid records
  errors: list                    # [dict] bad lines ({'line', 'id', 'reason', 'text'})
  done: set                       # (key, sample) already in the output
  out_f: Any                      # the output, opened for appending
  progress: bool
  num_samples: int                # native: samples per record (OpenAI requests carry their own n)
  stream_kw: dict                 # generate_stream's batch_size / refill_at
  plan_kw: dict                   # plan_over's mesh / device_memory (OpenAI: a plan per group)

  def missing(self, it: Item, samples: int) -> list[int]:
    """The sample indices of `it` not yet in the output."""
    return [s for s in range(samples) if (it.key, s) not in self.done]


def _by_bucket(jobs):
  """(item, missing samples) pairs with something missing, by prompt bucket then input line."""
  return sorted((j for j in jobs if j[1]), key=lambda j: (bucket(len(j[0].ids)), j[0].line))


class NativeFormat:
  """Native lines {"id", "prompt" | "messages", own options}: one record per (id, sample); bad lines fail the
  run (on_error="fail") or go to <output>.errors.jsonl ("skip")."""
  name, id_field, renders_chat = "native", "id", True

  def check_processes(self, count: int) -> None:
    """Any process count: each process takes its share and writes its shard."""

  @staticmethod
  def line_id(rec) -> Any:
    return None

  @staticmethod
  def to_native(rec, max_new_tokens: int, run: Run):
    return rec, None

  @staticmethod
  def options(rec: dict, given, max_new_tokens: int, run: Run) -> RequestOptions | None:
    return native_options(rec, max_new_tokens, run)

  @staticmethod
  def refuse_bad_lines(input_path: str, errors: list, on_error: str, err_path: str) -> None:
    """on_error="fail": a DatagenError naming the first bad lines; every one is written to err_path."""
    if errors and on_error == "fail":
      write_errors(err_path, errors)
      shown = "; ".join(f"line {e['line']}: {e['reason']}" for e in errors[:5])
      more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
      raise DatagenError(f"{input_path}: {len(errors)} bad line(s): {shown}{more}; all in {err_path}")

  @staticmethod
  def record_bad_lines(err_path: str, errors: list, on_error: str) -> None:
    if on_error == "skip":
      write_errors(err_path, errors)

  @staticmethod
  def settings(st: DecodeSettings, items: list, model: Model) -> DecodeSettings:
    """The run's settings with the row features the records' own options need compiled in."""
    own = [it.options for it in items if it.options]
    return with_features(st, own, model) if own else st

  @staticmethod
  def job(chat: bool, truncate: str, num_samples: int) -> dict:
    return dict(chat=chat, truncate=truncate, num_samples=num_samples)

  @staticmethod
  def generate(job: Job) -> dict:
    """Every missing (id, sample) in one stream, written as it finishes."""
    jobs = _by_bucket((it, job.missing(it, job.num_samples)) for it in job.items)
    requests = [Request.of(it.ids, it.options or RequestOptions(), tag=(it, samples),
                           stream_ids=[stream_id(it.id, s) for s in samples]) for it, samples in jobs]
    bar = _bar(sum(len(j[1]) for j in jobs), len(job.done), job.progress)
    return _generate_jobs(job.model, [(requests, dict(job.stream_kw, decode_plan=job.plan))],
                          _record, job.out_f, bar)

  @staticmethod
  def records_done(done: set) -> set:
    return done

  @staticmethod
  def summary(stats: dict) -> dict:
    return {}


class OpenAIFormat(NativeFormat):
  """OpenAI batch request lines: each request's own max_tokens / stop / n / seed / temperature / top_p /
  response_format (openai_batch.py); one output line per choice in the batch output shape; bad requests
  become error lines in the output whatever on_error says; one process."""
  name, id_field, renders_chat = "openai", "custom_id", False

  def check_processes(self, count: int) -> None:
    if count > 1:
      raise DatagenError("OpenAI batch files run on one process (process_count=1)")

  @staticmethod
  def line_id(rec) -> Any:
    return rec["custom_id"] if isinstance(rec, dict) and isinstance(rec.get("custom_id"), str) else None

  @staticmethod
  def to_native(rec, max_new_tokens: int, run: Run):
    native, options = openai_batch.to_native(rec, max_new_tokens=max_new_tokens)
    try:
      row_features.check_served(options.request, run)
    except OptionError as e:
      raise openai_batch.body_error(e, rec["body"]) from None
    return native, options

  @staticmethod
  def options(rec: dict, given, max_new_tokens: int, run: Run):
    return given

  @staticmethod
  def refuse_bad_lines(input_path: str, errors: list, on_error: str, err_path: str) -> None:
    """Never: a bad request is an error line in the output."""

  @staticmethod
  def record_bad_lines(err_path: str, errors: list, on_error: str) -> None:
    """Nothing beside the output: generate writes the error lines into it."""

  @staticmethod
  def settings(st: DecodeSettings, items: list, model: Model) -> DecodeSettings:
    """The run's settings with the row features every request's options need compiled in (so that the
    resume fingerprint knows when requests sample, and with that whether the draft shapes the samples)."""
    own = [it.options.request for it in items]
    return with_features(st, own, model) if own else st

  @staticmethod
  def job(chat: bool, truncate: str, num_samples: int) -> dict:
    """The job's own options; chat and num_samples are each request's (its url, its n), so a run-wide value
    is refused rather than ignored."""
    if chat:
      raise DatagenError("chat is for native records: an OpenAI batch request's url says whether it is a chat")
    if num_samples != 1:
      raise DatagenError(f"num_samples={num_samples}: an OpenAI batch request asks for its own (body.n)")
    return dict(input_format="openai", truncate=truncate)

  @staticmethod
  def generate(job: Job) -> dict:
    """OpenAI batch requests: error lines for the bad ones not yet written, then every missing (custom_id,
    choice) in one stream per log-probability setting (its own plan and executables); requests with their
    own temperature / top_p share it, their settings data in the loop (per_row_sampling). A request with a
    seed draws choice s from stream id s with that seed (two requests with the same seed, prompt and
    settings give the same choices); without one, from stream_id(custom_id, s) with the run's seed."""
    model, done, out_f = job.model, job.done, job.out_f
    n_err = 0
    for e in job.errors:
      if ("error", f"batch_req_line_{e['line']}") not in done:
        write_line(out_f, openai_batch.error_line(e["line"], e["id"], e["reason"]))
        n_err += 1
    groups: dict[tuple, list] = {}
    for it in job.items:
      groups.setdefault((it.options.request.logprobs, it.options.request.top_logprobs), []).append(it)
    streams, todo = [], 0
    for (lp, top), group in sorted(groups.items()):
      jobs = _by_bucket((it, job.missing(it, it.options.request.num_samples)) for it in group)
      if not jobs:
        continue
      todo += sum(len(s) for _, s in jobs)
      reqs = []
      for it, s in jobs:
        o = dataclasses.replace(it.options.request, num_samples=None)    # its missing choices: stream_ids
        reqs.append(Request.of(it.ids, o, tag=(it, s),
                               stream_ids=[x if o.seed is not None else stream_id(it.id, x) for x in s]))
      g_st = job.settings.replace(logprobs=lp, top_logprobs=top)    # (the features: settings)
      try:
        used = plan_over(model, g_st, group, batch_size=job.stream_kw["batch_size"], **job.plan_kw)
      except ValueError as e:
        raise DatagenError(str(e)) from None
      streams.append((reqs, dict(job.stream_kw, decode_plan=used)))

    def line(it, s, res):
      return openai_batch.output_line(model, it.id, it.options, len(it.ids), s, res, res.text, int(time.time()))
    tot = _generate_jobs(model, streams, line, out_f, _bar(todo, len(done), job.progress))
    tot["error_lines"] = n_err
    return tot

  @staticmethod
  def records_done(done: set) -> set:
    return {k for k in done if k[0] != "error"}

  @staticmethod
  def summary(stats: dict) -> dict:
    return {"error_lines_written": stats["error_lines"]}


FORMATS = {"native": NativeFormat(), "openai": OpenAIFormat()}
