"""A datagen run's input formats, each one object with the same verbs: native records and OpenAI batch requests.

Why: the run (datagen.run) reads, plans, resumes and summarises the same way for both; what differs — a
line's options, what a bad line does, whether the run may be split over processes, how records are grouped
into streams and written — is each format's, so the run branches on none of it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from typing import Any

from tqdm import tqdm

from magicdec_jax import openai_batch, row_features
from magicdec_jax.datagen_files import DatagenError, write_errors, write_line
from magicdec_jax.model import Model
from magicdec_jax.options import FIELDS, OptionError, RequestOptions
from magicdec_jax.plan import DecodePlan, bucket, make_plan
from magicdec_jax.row_features import Run
from magicdec_jax.settings import DecodeSettings
from magicdec_jax.request import Request, with_features
from magicdec_jax.stream import generate_stream


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


def plan_over(model: Model, st: DecodeSettings, items: list[Item], batch_size: int, mesh,
              device_memory: int | None = None) -> DecodePlan:
  """The run's plan, made over every input record (so a resumed run plans the same): gamma / tree = "auto"
  resolved to the draft it keeps and its schedule. The thresholds stay as planned (no learning from the
  run's own acceptance, which would make the schedule, and under rejection sampling the samples, depend
  on timing)."""
  ids = [it.ids for it in items] or [[0]]
  return make_plan(model, st.replace(learn_acceptance=False), batch=batch_size, shortest=min(len(i) for i in ids),
              longest=max(len(i) for i in ids), mesh=mesh, device_memory=device_memory)


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
  def request(options) -> RequestOptions | None:
    """A record's own RequestOptions (None: the run's) from what `options` returned."""
    return options

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
  def request(options) -> RequestOptions:
    return options.request

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
    tot = _generate_jobs(model, streams, line, out_f, _bar(todo, len(done) + n_err, job.progress))
    tot["error_lines"] = n_err
    return tot

  @staticmethod
  def records_done(done: set) -> set:
    return {k for k in done if k[0] != "error"}

  @staticmethod
  def summary(stats: dict) -> dict:
    return {"error_lines_written": stats["error_lines"]}


FORMATS = {"native": NativeFormat(), "openai": OpenAIFormat()}
