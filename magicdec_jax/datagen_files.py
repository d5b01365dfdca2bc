"""datagen's files: crash-safe writes, the torn-tail repair, the resume check, per-process shards and their merge.

Why: a killed job must lose at most the record being written, and a resumed one must produce what the first
would have; every write here is flushed and fsynced, and every whole-file write goes through a rename.
"""
from __future__ import annotations

import json
import os

from magicdec_jax import openai_batch


class DatagenError(ValueError):
  """Bad input, output or settings; the message says which and where."""


def _record_keys(line: bytes) -> list[tuple[str, int]]:
  """The (key, sample) pairs a whole output line holds; ValueError (or KeyError, ...) if it is not a record."""
  rec = json.loads(line.decode("utf-8"))
  if "custom_id" in rec:
    return openai_batch.record_keys(rec)
  if not isinstance(rec.get("token_ids"), list):
    raise ValueError("no token_ids")
  return [(json.dumps(rec["id"]), int(rec["sample"]))]


def repair_output(path: str) -> tuple[set[tuple[str, int]], int]:
  """Truncate `path` to its longest prefix of complete valid records -> (done (key, sample) set, bytes cut).
  Only a torn last line is cut: a bad line with others after it (which no crash leaves: a record is one
  write) is a DatagenError naming it, so that no record past it is thrown away unseen. The file is read a
  line at a time (a resume holds the keys, not the output)."""
  if not os.path.exists(path):
    return set(), 0
  done, good_end, number = set(), 0, 0
  with open(path, "rb") as f:
    for line in f:
      number += 1
      if not line.endswith(b"\n"):            # a torn tail
        break
      try:
        keys = _record_keys(line[:-1])
        if any(k in done for k in keys):
          raise ValueError("a key already written")
      except (ValueError, KeyError, TypeError, AttributeError):
        after = sum(1 for rest in f if rest.endswith(b"\n"))
        if after:
          raise DatagenError(f"{path}: line {number} is not a whole, new record, and {after} line(s) follow "
                             "it: not a torn last line; fix or remove that line (or use another output)") from None
        break
      done.update(keys)
      good_end += len(line)
  cut = os.path.getsize(path) - good_end
  if cut:
    with open(path, "r+b") as f:
      f.truncate(good_end)
      f.flush()
      os.fsync(f.fileno())
  return done, cut


def atomic_write(path: str, text: str):
  """`path` holds `text` (written beside it, fsynced, then renamed over it)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_line(out_f, line: str):
  """Append one output line, flushed and fsynced (a record is on disk when its sample is reported)."""
  out_f.write(line.encode("utf-8"))
  out_f.flush()
  os.fsync(out_f.fileno())


def _read_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _differences(old: dict | None, new: dict | None) -> list[str]:
  """The keys whose values differ between two settings dicts (a missing one counts as empty)."""
  old, new = old or {}, new or {}
  return [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def write_errors(path: str, errors: list) -> None:
  """The bad input lines ({'line', 'id', 'reason', 'text'}) as JSON lines at `path`."""
  atomic_write(path, "".join(json.dumps(e) + "\n" for e in errors))


def check_config(path: str, config: dict, resolved: tuple[str, ...] = (), why: str = ""):
  """Refuse to resume an output produced with different generation settings, naming each difference;
  `why` is added where one of the `resolved` keys (settings chosen for the run, not given) differs."""
  cpath = path + ".config.json"
  config = json.loads(json.dumps(config))        # as it reads back from the file (tuples become lists)
  if os.path.exists(path) and os.path.getsize(path) > 0 and (old := _read_json(cpath)) is not None:
    diff = _differences(old, config)
    if diff:
      changes = ", ".join(f"{k}: {old.get(k)!r} -> {config.get(k)!r}" for k in diff)
      note = f" ({why})" if why and set(diff) & set(resolved) else ""
      raise DatagenError(f"{path} was produced with different settings ({changes}){note}; use another "
                         "--output or delete it")
  atomic_write(cpath, json.dumps(config, indent=1) + "\n")


def open_output(path: str):
  """`path` opened for appending bytes (DatagenError naming it when it cannot be written)."""
  try:
    return open(path, "ab")
  except OSError as e:
    raise DatagenError(f"cannot write output {path}: {e.strerror or e}") from None


# ---- multi-host: per-process shards ----------------------------------------------------------------------

def shard_path(output: str, index: int, count: int) -> str:
  """Where process `index` of `count` writes its part of `output`."""
  return f"{output}.shard-{index:05d}-of-{count:05d}"


def split(items: list, index: int, count: int) -> list:
  """This process's share of `items`: every count-th one, starting at `index`."""
  return items[index::count]


def input_order(input_path: str) -> dict[str, int]:
  """json.dumps(id) -> position in the input (ids only; bad lines are skipped)."""
  order = {}
  with open(input_path, "rb") as f:
    for n, raw in enumerate(f):
      try:
        rec = json.loads(raw)
        order.setdefault(json.dumps(rec["id"]), n)
      except (ValueError, KeyError, TypeError):
        continue
  return order


# the counts of a run's summary that add up over the shards (the merged summary's; each shard's is kept whole)
SUMMED = ("records_written", "records_skipped_existing", "torn_bytes_repaired", "new_tokens", "verify_steps",
          "accepted_tokens")


def merge_shards(output: str, input_path: str, count: int) -> dict:
  """Concatenate the `count` shards of `output` into `output`, in input order then sample, with their error
  lines into `output`.errors.jsonl; returns a summary (the shards' SUMMED counts added up, and each shard's
  own summary). Each shard is first repaired (a torn tail dropped).
  DatagenError: a shard missing, unfinished (no summary: a run writes it last), produced with other settings
  than shard 0, or holding fewer records than its own run's summary says it wrote (cut, or still running)."""
  records, per_shard, bad, errors, shard_summaries = {}, [], 0, [], []
  config = _read_json(shard_path(output, 0, count) + ".config.json")
  for i in range(count):
    path = shard_path(output, i, count)
    if not os.path.exists(path):
      raise DatagenError(f"merge: shard {path} is missing (did process {i} finish?)")
    diff = _differences(config, _read_json(path + ".config.json"))
    if diff:
      raise DatagenError(f"merge: shard {path} was produced with other settings than shard 0 ({', '.join(diff)})")
    repair_output(path)
    n = 0
    with open(path, encoding="utf-8") as f:
      for line in f:                          # (whole records: repaired above)
        records.setdefault(_record_keys(line.encode("utf-8"))[0], line)
        n += 1
    summary = _read_json(path + ".summary.json")
    if summary is None:
      raise DatagenError(f"merge: shard {path} has no {os.path.basename(path)}.summary.json: its run has not "
                         f"finished (run process {i} again; it resumes)")
    if n < summary.get("records_total", 0):
      raise DatagenError(f"merge: shard {path} holds {n} records, its run's summary says {summary['records_total']} "
                         "(cut, or its process still running?)")
    bad += summary.get("bad_lines", 0)
    shard_summaries.append(summary)
    if os.path.exists(path + ".errors.jsonl"):
      with open(path + ".errors.jsonl", encoding="utf-8") as f:
        errors.append(f.read())
    per_shard.append(n)
  order = input_order(input_path)
  keys = sorted(records, key=lambda k: (order.get(k[0], len(order)), k[0], k[1]))
  atomic_write(output, "".join(records[k] for k in keys))
  if config is not None:
    atomic_write(output + ".config.json", json.dumps(config, indent=1) + "\n")
  if errors:
    atomic_write(output + ".errors.jsonl", "".join(errors))
  summed = {k: sum(sh.get(k) or 0 for sh in shard_summaries) for k in SUMMED}
  summary = {"input": input_path, "output": output, "records_total": len(keys), "bad_lines": bad, **summed,
             "input_format": shard_summaries[0].get("input_format"), "shards": count,
             "records_per_shard": per_shard, "shard_summaries": shard_summaries}
  atomic_write(output + ".summary.json", json.dumps(summary, indent=1) + "\n")
  return summary
