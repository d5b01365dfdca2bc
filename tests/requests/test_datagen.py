"""datagen: bad input, resume after a torn write, exactly-once after SIGKILL, and SmolLM2 output == generate.

References are independent of datagen: plain `generation.generate` (autoregressive) for content, an
uninterrupted run for the kill test, and hand-written expectations for every bad-input message.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from magicdec_jax import datagen, datagen_formats, datagen_files, generation, prefilled
from magicdec_jax.cli import flags as cli_flags
from magicdec_jax import testing
from magicdec_jax.drafts import StreamingDraft

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEN = dict(max_new_tokens=8, draft=StreamingDraft(sink=2, window=8), gamma=2, temperature=1.0, seed=3)


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)     # what run.py --model=random-tiny loads


def write(path, lines):
  with open(path, "wb") as f:
    for line in lines:
      f.write(line if isinstance(line, bytes) else (json.dumps(line) if not isinstance(line, str) else line)
              .encode("utf-8"))
      f.write(b"\n")
  return str(path)


def read_records(path):
  with open(path) as f:
    return [json.loads(l) for l in f]


def as_set(records):
  return {json.dumps({k: r[k] for k in ("id", "sample", "token_ids", "completion", "finish_reason")},
                     sort_keys=True) for r in records}


GOOD = [{"id": f"r{i}", "prompt": f"Line {i}: to be or not to be"} for i in range(5)]

BAD_CASES = [
    # (name, lines, expected fragment of the error, on the line number)
    ("malformed_json", [GOOD[0], '{"id": "x", "prompt": "oops"'], "malformed JSON", 2),
    ("unterminated", [GOOD[0], '{"id": "x", "prompt": "oops'],
     "malformed JSON (Unterminated string starting at column 23)", 2),
    ("invalid_utf8", [GOOD[0], GOOD[1], b'{"id": "u", "prompt": "caf\xe9"}'], "invalid UTF-8", 3),
    ("missing_id", [{"prompt": "no id here"}], "missing 'id'", 1),
    ("duplicate_id", [GOOD[0], GOOD[1], {"id": "r0", "prompt": "again"}], "duplicate id \"r0\" (first on line 1)", 3),
    ("empty_prompt", [GOOD[0], {"id": "e", "prompt": "   "}], "empty prompt", 2),
    ("empty_messages", [{"id": "m", "messages": [{"role": "user", "content": ""}]}], "empty prompt", 1),
    ("bad_messages", [{"id": "m", "messages": "hi"}], "'messages' must be", 1),
    ("content_parts", [{"id": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}],
     "a list of content parts, which are not supported", 1),
    ("unknown_role", [GOOD[0], {"id": "m", "messages": [{"role": "sytem", "content": "hi"}]}],
     "message 0: role 'sytem' is not one of", 2),
    ("not_object", [GOOD[0], "[1, 2]"], "expected a JSON object", 2),
    ("both_fields", [{"id": "b", "prompt": "a", "messages": []}], "exactly one of 'prompt' or 'messages'", 1),
    ("bad_id_type", [{"id": None, "prompt": "a"}], "'id' must be", 1),
    ("too_long", [GOOD[0], {"id": "long", "prompt": "x" * 5000}], "(use --truncate=left)", 2),
]


@pytest.mark.parametrize("name,lines,fragment,line", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_fails_before_generating(tmp_path, name, lines, fragment, line):
  inp = write(tmp_path / "in.jsonl", lines)
  out = str(tmp_path / "out.jsonl")
  with pytest.raises(datagen.DatagenError) as e:
    datagen.run(tiny(), inp, out, **GEN)
  assert fragment in str(e.value) and f"line {line}:" in str(e.value), str(e.value)
  assert not os.path.exists(out)                                    # no record, and no empty file either
  assert f"all in {out}.errors.jsonl" in str(e.value) and [r["line"] for r in read_records(out + ".errors.jsonl")] \
      == [line]


@pytest.mark.parametrize("out_name,fragment", [("missing_dir/out.jsonl", "cannot write output"),
                                               (".", "cannot write output")])
def test_unwritable_output(tmp_path, out_name, fragment):
  inp = write(tmp_path / "in.jsonl", GOOD[:1])
  with pytest.raises(datagen.DatagenError, match=fragment):
    datagen.run(tiny(), inp, str(tmp_path / out_name), **GEN)


def test_skip_mode_resume_and_torn_tail(tmp_path):
  bad = ['{"id": "x", "prompt": ', {"id": "r1", "prompt": "dup"}, {"id": "long", "prompt": "y" * 5000},
         {"id": "cut", "prompt": "z" * 5000}]
  inp = write(tmp_path / "in.jsonl", GOOD[:3] + bad[:3] + GOOD[3:])
  ref_out = str(tmp_path / "ref.jsonl")
  kw = dict(GEN, max_new_tokens=8, batch_size=2, num_samples=2, on_error="skip", progress=False)
  s = datagen.run(tiny(), inp, ref_out, **kw)
  ref = read_records(ref_out)
  assert s["records_written"] == 10 and s["bad_lines"] == 3 and len(ref) == 10
  errs = read_records(ref_out + ".errors.jsonl")
  assert [(e["line"], e["reason"].split(" (")[0]) for e in errs] == [
      (4, "malformed JSON"), (5, "duplicate id \"r1\""), (6, "prompt has 5000 tokens; with max_new_tokens=8 "
                                                           "the model's context of 4096 allows 4088")]
  assert {(r["id"], r["sample"]) for r in ref} == {(f"r{i}", s) for i in range(5) for s in range(2)}
  assert json.load(open(ref_out + ".summary.json"))["records_total"] == 10

  # Same run, interrupted: keep 3 whole records plus a torn fourth, then resume.
  out = str(tmp_path / "out.jsonl")
  with open(ref_out, "rb") as f:
    lines = f.read().split(b"\n")
  with open(out, "wb") as f:
    f.write(b"\n".join(lines[:3]) + b"\n" + lines[3][:17])
  with open(ref_out + ".config.json") as src, open(out + ".config.json", "w") as dst:
    dst.write(src.read())
  s2 = datagen.run(tiny(), inp, out, **kw)
  assert s2["torn_bytes_repaired"] == 17 and s2["records_skipped_existing"] == 3 and s2["records_written"] == 7
  got = read_records(out)
  assert len(got) == 10 and as_set(got) == as_set(ref)
  # A rerun with the same arguments does nothing; different settings are refused.
  assert datagen.run(tiny(), inp, out, **kw)["records_written"] == 0
  with pytest.raises(datagen.DatagenError, match="different settings"):
    datagen.run(tiny(), inp, out, **dict(kw, seed=99))


def test_a_rerun_with_a_constraint_and_a_schedule_resumes(tmp_path):
  """Settings holding tuples (a constraint's row feature, a schedule) read back from the config file as
  lists: the same command again is a resume, not "different settings"."""
  schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
  inp = write(tmp_path / "in.jsonl", GOOD[:2] + [{"id": "j", "prompt": "give json", "json_schema": schema}])
  out = str(tmp_path / "out.jsonl")
  kw = dict(GEN, gamma="auto", schedule=[(0, 2), (64, 3)], max_new_tokens=16, batch_size=2, progress=False)
  assert datagen.run(tiny(), inp, out, **kw)["records_written"] == 3
  first = open(out, "rb").read()
  assert datagen.run(tiny(), inp, out, **kw)["records_written"] == 0
  assert open(out, "rb").read() == first


def test_two_process_shards_merge_into_the_one_process_output(tmp_path):
  """Two processes' shards, merged: the records and the config of one single-process run, in input order
  then sample (a single process writes them as rows finish); a missing shard is an error naming it."""
  inp = write(tmp_path / "in.jsonl", GOOD)
  kw = dict(GEN, batch_size=2, num_samples=2, progress=False)
  ref_out = str(tmp_path / "ref.jsonl")
  datagen.run(tiny(), inp, ref_out, **kw)
  out = str(tmp_path / "out.jsonl")
  datagen.run(tiny(), inp, out, process_index=0, process_count=2, **kw)
  with pytest.raises(datagen.DatagenError, match="shard-00001-of-00002 is missing"):
    datagen_files.merge_shards(out, inp, 2)
  datagen.run(tiny(), inp, out, process_index=1, process_count=2, **kw)
  summary = datagen_files.merge_shards(out, inp, 2)
  ref, got = read_records(ref_out), read_records(out)
  assert summary["records_total"] == 10 and summary["records_per_shard"] == [6, 4]
  assert [(r["id"], r["sample"]) for r in got] == [(f"r{i}", s) for i in range(5) for s in range(2)]
  assert sorted(json.dumps(r, sort_keys=True) for r in got) == sorted(json.dumps(r, sort_keys=True) for r in ref)
  assert json.load(open(out + ".config.json")) == json.load(open(ref_out + ".config.json"))
  assert json.load(open(out + ".summary.json")) == summary and summary["bad_lines"] == 0
  one = json.load(open(ref_out + ".summary.json"))           # counts that add up: as one process's
  for k in ("records_written", "new_tokens", "records_skipped_existing"):
    assert summary[k] == one[k], k
  assert [s["records_written"] for s in summary["shard_summaries"]] == [6, 4]
  # A shard cut short, or made with other settings, is refused by name rather than merged.
  shard = datagen_files.shard_path(out, 1, 2)
  whole, config = open(shard, "rb").read(), open(shard + ".config.json").read()
  open(shard, "wb").write(whole[:whole.rindex(b"\n", 0, len(whole) - 1) + 1])
  with pytest.raises(datagen.DatagenError, match="holds 3 records, its run's summary says 4"):
    datagen_files.merge_shards(out, inp, 2)
  os.rename(shard + ".summary.json", shard + ".summary.moved")      # a run killed before it finished
  with pytest.raises(datagen.DatagenError, match="shard-00001-of-00002 has no .*summary.json: its run has not"):
    datagen_files.merge_shards(out, inp, 2)
  os.rename(shard + ".summary.moved", shard + ".summary.json")
  open(shard, "wb").write(whole)
  open(shard + ".config.json", "w").write(json.dumps(dict(json.loads(config), seed=4)))
  with pytest.raises(datagen.DatagenError, match=r"other settings than shard 0 \(seed\)"):
    datagen_files.merge_shards(out, inp, 2)
  # Bad lines (reported by process 0) reach the merged summary and errors file.
  inp = write(tmp_path / "in2.jsonl", GOOD[:3] + ['{"id": "x", "prompt": '])
  out = str(tmp_path / "out2.jsonl")
  for i in range(2):
    datagen.run(tiny(), inp, out, process_index=i, process_count=2, on_error="skip", **kw)
  assert datagen_files.merge_shards(out, inp, 2)["bad_lines"] == 1
  assert [e["line"] for e in read_records(out + ".errors.jsonl")] == [4]


def test_truncate_left_keeps_last_tokens(tmp_path):
  inp = write(tmp_path / "in.jsonl", [{"id": 1, "prompt": "abc" * 10}])
  items, errors = datagen.parse_input(inp, tiny(), max_new_tokens=4096 - 12, truncate="left")
  assert not errors and items[0].truncated == 18 and items[0].ids == tiny().tokenizer.encode("abc" * 4).ids


def test_stream_id_stable():
  assert datagen_formats.stream_id("a", 0) == datagen_formats.stream_id("a", 0) != datagen_formats.stream_id("a", 1)
  assert datagen_formats.stream_id(1, 0) != datagen_formats.stream_id("1", 0)
  assert all(0 <= datagen_formats.stream_id(i, s) < 2**31 for i in range(50) for s in range(3))


@pytest.mark.heavy
@pytest.mark.parametrize("sampling", ["rejection", "invariant"])
def test_kill9_then_resume_exactly_once(tmp_path, sampling):
  """Killed mid-run under continuous batching (3 slots, refill after every finished row, 2 samples a
  prompt), resumed: the same records as one uninterrupted static-batching run (2 slots, refill_at = 2).
  Invariant sampling: the killed run drafts with a streaming draft, the resumed one with prompt lookup,
  and the reference decodes plainly (no draft): the draft cannot change an invariant data set."""
  prompts, samples = 32, 2
  n = prompts * samples
  inp = write(tmp_path / "in.jsonl", [{"id": i, "prompt": f"Record {i} says hello"} for i in range(prompts)])
  out = str(tmp_path / "out.jsonl")
  args = [sys.executable, os.path.join(ROOT, "run.py"), "--mode=datagen", "--model=random-tiny",
          f"--input={inp}", f"--output={out}", "--batch_size=3", "--refill_at=1", "--max_new_tokens=8",
          f"--num_samples_per_prompt={samples}", "--gamma=2", "--sink=2", "--window=8", "--temperature=1",
          "--seed=3", "--noprogress", f"--sampling={sampling}"]
  proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(out) and os.path.getsize(out) > 0 and open(out, "rb").read().count(b"\n") >= 2:
      break
    time.sleep(0.05)
  assert proc.poll() is None, f"datagen finished before it could be killed: {proc.stderr.read()[-2000:]}"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  partial = open(out, "rb").read()
  assert 0 < partial.count(b"\n") < n
  if sampling == "invariant":
    args = [a for a in args if not a.startswith(("--sink", "--window"))] + ["--draft=lookup"]
  resumed = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=240)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  got = read_records(out)
  # The reference: an uninterrupted run in this process (same random-tiny weights, same settings).
  ref_out = str(tmp_path / "ref.jsonl")
  ref_gen = dict(GEN, draft=None, gamma=None) if sampling == "invariant" else GEN
  datagen.run(tiny(), inp, ref_out, batch_size=2, refill_at=2, num_samples=samples, progress=False,
              sampling=sampling, **ref_gen)
  ref = read_records(ref_out)
  assert len(got) == n and len({(r["id"], r["sample"]) for r in got}) == n
  assert as_set(got) == as_set(ref)


# slow: on the 2-vCPU Intel VM of 2026-11-24 the default suite took 96 min (CI allows 90); run with -m slow
@pytest.mark.slow
def test_smollm2_datagen_equals_generate(tmp_path):
  from magicdec_jax import checkpoints
  try:
    checkpoints.known_model_path("smollm2-135m")
  except ValueError as e:
    pytest.skip(str(e))
  model = checkpoints.load_model("smollm2-135m")
  recs = [{"id": "p0", "prompt": "The quick brown fox"},
          {"id": "p1", "messages": [{"role": "user", "content": "Name a colour."}]},
          {"id": "p2", "prompt": "Once upon a time, in a land far away,"}]
  inp = write(tmp_path / "in.jsonl", recs)
  out = str(tmp_path / "out.jsonl")
  datagen.run(model, inp, out, max_new_tokens=8, batch_size=4, progress=False,
              draft=StreamingDraft(sink=4, window=16), gamma=3)
  got = {r["id"]: r for r in read_records(out)}
  texts = [recs[0]["prompt"], cli_flags.render_chat(model, recs[1]["messages"]), recs[2]["prompt"]]
  ref = generation.generate(model, texts, max_new_tokens=8)            # plain autoregressive, greedy
  for r, toks, reason in zip(recs, ref.tokens, ref.finish_reasons):
    assert got[r["id"]]["token_ids"] == toks and got[r["id"]]["finish_reason"] == reason
    body = toks[:-1] if reason == "eos" else toks
    assert got[r["id"]]["completion"] == model.tokenizer.decode(body, skip_special_tokens=False)


def test_numpy_integer_counts_run_as_python_ones(tmp_path):
  """A count read from an array is an integer too: the same output, and a data set whose JSON still writes."""
  (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "abc"}\n')
  outs = []
  for kind in (int, np.int64):
    out = tmp_path / f"out-{kind.__name__}.jsonl"
    datagen.run(tiny(), str(tmp_path / "in.jsonl"), str(out), max_new_tokens=kind(4), batch_size=kind(2),
                num_samples=kind(2), refill_at=kind(1), progress=False)
    outs.append([{k: v for k, v in json.loads(line).items() if k != "seconds"}
                 for line in out.read_text().splitlines()])
    pre = prefilled.prefill(tiny(), [[5, 6, 7]], max_new_tokens=kind(4), chunk=kind(16), progress=False)
    outs.append(prefilled.decode(tiny(), pre).tokens)
  assert outs[0] == outs[2] and outs[1] == outs[3]


def test_a_bad_line_before_others_is_named_not_cut_with_them(tmp_path):
  """A crash tears only the last line; a bad line with records after it stops the resume, naming it, and
  the file is left as it was (before, the repair cut it and every record after it, silently)."""
  rec = lambda i: json.dumps({"id": f"r{i}", "sample": 0, "token_ids": [1], "completion": "x"}) + "\n"  # noqa: E731
  path = tmp_path / "out.jsonl"
  body = (rec(0) + rec(1)[:9] + "\n" + rec(2) + rec(3)).encode()
  path.write_bytes(body)
  with pytest.raises(datagen.DatagenError, match="line 2 is not a whole, new record, and 2 line"):
    datagen_files.repair_output(str(path))
  assert path.read_bytes() == body
  path.write_bytes((rec(0) + rec(1) + rec(0) + rec(2)).encode())          # a duplicate is not new
  with pytest.raises(datagen.DatagenError, match="line 3 is not"):
    datagen_files.repair_output(str(path))
  path.write_bytes((rec(0) + rec(1) + rec(2)[:10]).encode())              # a torn tail: cut
  done, cut = datagen_files.repair_output(str(path))
  assert done == {('"r0"', 0), ('"r1"', 0)} and cut == 10 and path.read_bytes() == (rec(0) + rec(1)).encode()


def test_a_resume_refused_over_a_resolved_setting_says_why(tmp_path):
  """A setting the run resolved (gamma='auto' picks the draft and schedule for the batch size) that differs
  on resume is named with the reason; other differences are named alone."""
  out = tmp_path / "out.jsonl"
  first = {"model": "m", "draft": None, "schedule": None, "seed": 0}
  datagen_files.check_config(str(out), first)
  out.write_text('{"id": 1}\n')
  why = "resume with the first run's batch size"
  with pytest.raises(datagen_files.DatagenError, match=f"draft: None -> 'StreamingDraft.*'\\) \\({why}\\); use"):
    datagen_files.check_config(str(out), dict(first, draft="StreamingDraft(...)"), ("draft", "schedule"), why)
  with pytest.raises(datagen_files.DatagenError, match=r"seed: 0 -> 1\); use another"):
    datagen_files.check_config(str(out), dict(first, seed=1), ("draft", "schedule"), why)


def test_a_byte_order_mark_opening_the_input_is_skipped(tmp_path):
  """A UTF-8 file saved with a byte-order mark (as Windows editors write it) reads as the same records."""
  plain = write(tmp_path / "in.jsonl", GOOD[:2])
  marked = tmp_path / "bom.jsonl"
  marked.write_bytes(b"\xef\xbb\xbf" + open(plain, "rb").read())
  want = datagen.parse_input(plain, tiny(), max_new_tokens=8)
  got = datagen.parse_input(str(marked), tiny(), max_new_tokens=8)
  assert got[1] == [] and [it.id for it in got[0]] == [it.id for it in want[0]] == ["r0", "r1"]
  assert [it.ids for it in got[0]] == [it.ids for it in want[0]]


def test_a_record_whose_own_max_new_tokens_leaves_room_for_its_prompt_runs(tmp_path):
  """The context check uses the record's own max_new_tokens (native) or max_tokens (OpenAI), as a stream's
  request does: a 200-token prompt with 8 new tokens fits a 256-token context beside a run's 64. Reference:
  generate on that prompt alone."""
  model = testing.random_tiny_model(0, max_pos=256)
  prompt = "ab" * 100
  inp = write(tmp_path / "in.jsonl", [{"id": "own", "prompt": prompt, "max_new_tokens": 8},
                                      {"id": "run", "prompt": prompt}])
  items, errors = datagen.parse_input(inp, model, max_new_tokens=64)
  assert [it.id for it in items] == ["own"] and items[0].truncated == 0
  assert [e["id"] for e in errors] == ["run"] and "with max_new_tokens=64" in errors[0]["reason"]
  oa = write(tmp_path / "oa.jsonl", [{"custom_id": "c", "method": "POST", "url": "/v1/completions",
                                      "body": {"prompt": prompt, "max_tokens": 8}}])
  out = str(tmp_path / "out.jsonl")
  datagen.run(model, oa, out, max_new_tokens=64, progress=False, eos_token_id=[])
  (rec,) = read_records(out)
  want = generation.generate(model, [prompt], max_new_tokens=8, eos_token_id=[])
  assert rec["error"] is None and rec["response"]["body"]["choices"][0]["text"] == want.texts[0]
