"""run.py's flag validation (as functions, on a fresh FlagValues), bench output, acceptance profiling.

Expected messages are written by hand; bench output is checked for structure (valid JSON, real PNGs);
acceptance profiling is checked against cases with a known answer (draft == target -> rank 0 always)
and the windowed draft against a plain full forward when the window covers everything.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from absl import app, flags

from magicdec_jax.measure import acceptance
from magicdec_jax.cli import bench as cli_bench, build as cli_build, flags as cli_flags, modes as cli_modes
from magicdec_jax import testing
from magicdec_jax.drafts import ModelDraft, StreamingDraft
from magicdec_jax.model import full_forward

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def tiny():
  return testing.random_tiny_model(0)


def parse(argv):
  fv = cli_modes.define_flags(flags.FlagValues())
  fv(["run.py"] + argv)
  return fv


def check(argv):
  cli_modes.validate(parse(argv))


PARSE_ERRORS = [  # single-flag ranges: absl rejects them while parsing, naming the flag and the range
    (["--gamma=0"], "flag --gamma=0: is not an integer in the range [1, 64] or 'auto'"),
    (["--top_p=1.5"], "--top_p=1.5: 1.5 is not a number in the range"),
    (["--temperature=-1"], "--temperature=-1"),
    (["--window=0"], "--window=0"),
    (["--sink=-1"], "--sink=-1"),
    (["--max_new_tokens=0"], "--max_new_tokens=0"),
    (["--batch_size=0"], "--batch_size=0"),
    (["--num_samples_per_prompt=0"], "--num_samples_per_prompt=0"),
    (["--mode=train"], "--mode=train: value should be one of"),
    (["--draft=eagle"], "--draft=eagle: value should be one of"),
    (["--on_error=ignore"], "--on_error=ignore"),
    (["--truncate=right"], "--truncate=right"),
    (["--alpha=2"], "--alpha=2"),
    (["--seed=x"], "--seed=x"),
]


@pytest.mark.parametrize("argv,fragment", PARSE_ERRORS, ids=[a[0] for a, _ in PARSE_ERRORS])
def test_parse_errors_name_flag_and_range(argv, fragment):
  with pytest.raises(flags.IllegalFlagValueError) as e:
    parse(argv)
  assert fragment in str(e.value)


def usage_cases(tmp_path):
  good = tmp_path / "in.jsonl"
  good.write_text('{"id": 1, "prompt": "hi"}\n')
  bad_tree = tmp_path / "tree.json"
  bad_tree.write_text("{not json")
  return [
      (["--mode=generate"], "exactly one of --prompt"),
      (["--mode=generate", "--prompt=a", f"--prompts_file={good}"], "exactly one of --prompt"),
      (["--mode=generate", "--prompts_file=/nonexistent/p.txt"], "--prompts_file=/nonexistent/p.txt: no such file"),
      (["--mode=generate", "--prompt= "], "--prompt: empty prompt"),
      (["--mode=datagen", f"--output={tmp_path}/o.jsonl"], "--mode=datagen needs --input"),
      (["--mode=datagen", f"--input={good}"], "--mode=datagen needs --output"),
      (["--mode=datagen", "--input=/nonexistent.jsonl", f"--output={tmp_path}/o.jsonl"], "no such file"),
      (["--mode=datagen", f"--input={good}", "--output=/nonexistent/dir/o.jsonl"], "does not exist"),
      (["--mode=datagen", f"--input={good}", f"--output={tmp_path}"], "is a directory"),
      (["--mode=datagen", f"--input={good}", f"--output={good}"], "same file"),
      (["--mode=bench", "--batches=1,x"], "--batches=1,x: expected comma-separated integers"),
      (["--mode=bench", "--contexts=8"], "--contexts=8: each value must be an integer >= 16"),
      (["--mode=bench", "--gammas=0"], "--gammas=0: each value must be an integer >= 1"),
      (["--mode=bench", "--draft=none"], "--draft=none is not allowed"),
      (["--mode=bench", "--tree=sequoia16"], "--tree is for --mode=generate"),
      (["--mode=bench", "--mesh=data:2"], "--mesh is for --mode=generate|datagen|distill, not --mode=bench"),
      (["--mesh=data:2"], "--mesh is for --mode=generate|datagen|distill, not --mode=demo"),
      (["--mode=plan", "--device_memory_gb=8"], "--device_memory_gb is for --mode=generate|datagen"),
      (["--mode=bench", "--bench_preset=long_context"], None),
      (["--draft=none"], "--mode=demo compares against a draft"),
      (["--draft=lookup"], "--mode=demo compares the StreamingLLM self-draft (--draft=streaming), got --draft=lookup"),
      (["--prompt_tokens=512", "--shared_tokens=512"], "--shared_tokens=512 must be below --prompt_tokens=512"),
      (["--prompt_tokens=512", "--shared_tokens=256", "--draft_weights=none", "--demo_repeats=1"], None),
      (["--mode=generate", "--prompt=a", "--draft=lookup", "--draft_weights=int8"],
       "--draft_weights=int8 is for --draft=streaming, snapkv, model"),
      (["--mode=generate", "--prompt=a", "--draft_weights=bfloat16"], None),
      (["--mode=generate", "--prompt=a", "--distill_compute=bfloat16"],
       "--distill_compute=bfloat16 is for --mode=distill --draft=feature"),
      (["--mode=convert", "--src=a"], "--mode=convert needs --dst"),
      (["--mode=plan", "--draft=snapkv", "--sink=8"], "--sink is for --draft=streaming|model|feature"),
      (["--mode=plan", "--draft=lookup", "--window=8"], "--window is for --draft=streaming|snapkv|model|feature"),
      (["--mode=generate", "--prompt=a", "--draft=none", "--budget=8"], "--budget is for --draft=snapkv"),
      (["--mode=generate", "--prompt=a", "--lookup_ngram=2"], "--lookup_ngram is for --draft=lookup"),
      (["--mode=plan", "--draft=snapkv", "--window=8", "--budget=8"], None),
      (["--mode=plan", "--draft=model"], "--draft=model needs --draft_model"),
      (["--mode=plan", "--draft=model", "--draft_layers=2"], None),
      (["--mode=plan", "--acceptance_file=/nonexistent.json"], "no such file"),
      (["--mode=profile_acceptance"], "--mode=profile_acceptance needs --output"),
      (["--mode=profile_acceptance", f"--output={tmp_path}/a.json", "--draft=snapkv"], "--draft=streaming or"),
      (["--draft_layers=2"], "only apply to --draft=model"),
      (["--mode=generate", "--prompt=a", "--tree=sequoia99"], "--tree=sequoia99: not 'auto', a shipped tree"),
      (["--mode=generate", "--prompt=a", f"--tree={bad_tree}"], "not a valid tree JSON file"),
      (["--mode=generate", "--prompt=a", "--tree=chain4", "--draft=none"], "--tree needs a draft"),
      (["--mode=generate", "--prompt=a", "--gamma=2", "--draft=none"], "--gamma=2 needs a draft"),
      (["--mode=generate", "--prompt=a", "--tree=sequoia16"], None),
      (["--mode=generate", "--prompt=a", "--tree=chain4", "--gamma=2"],
       "--gamma=2 and --tree=chain4: the tree is what is speculated"),
      (["--gamma=20", "--numerics=invariant"], "--gamma=20: fixed-shape numerics verify at most 16 tokens"),
      (["--gamma=20", "--numerics=fast"], None),
      (["--prompt=hi"], "--prompt is for --mode=generate, not --mode=demo"),
      (["--mode=datagen", f"--input={good}", f"--output={tmp_path}/o.jsonl", "--json_schema={}"],
       "--json_schema is for --mode=generate, not --mode=datagen"),
      (["--mode=generate", "--prompt=hi", "--batches=1,2"], "--batches is for --mode=bench|plan|calibrate"),
      (["--mode=plan", "--chat"], "--chat is for --mode=generate|datagen|profile_acceptance"),
      (["--mode=datagen", "--input=x.jsonl", "--output=y.jsonl", "--shrink_batch"], "--shrink_batch is for"),
      (["--mode=generate", "--prompt=hi", "--shrink_batch", "--mesh=data:1"], "without --mesh"),
      (["--mode=generate", "--prompt=hi", "--shrink_batch"], None),
      (["--tree=sequoia16"], "--tree is for --mode=generate|datagen, not --mode=demo"),
      (["--mode=plan", "--gamma=5"], "--gamma is for --mode=demo|generate|datagen, not --mode=plan"),
      (["--mode=calibrate", f"--output={tmp_path}/p.json", "--temperature=0.7"], "--temperature is for"),
      (["--mode=calibrate", f"--output={tmp_path}/p.json", "--draft=lookup", "--calibrate_draft_tokens=1,2"],
       "--draft=lookup has none to time"),
      (["--mode=calibrate", f"--output={tmp_path}/p.json", "--draft=none", "--calibrate_draft_tokens=1"],
       "--draft=none has none to time"),
      (["--mode=calibrate", f"--output={tmp_path}/p.json", "--calibrate_draft_tokens=1,2"], None),
      (["--mode=profile_acceptance", f"--output={tmp_path}/a.json", "--max_new_tokens=8"], "--max_new_tokens is for"),
      (["--top_p=0.9"], "--top_p is for --mode=generate|bench|datagen|profile_acceptance, not --mode=demo"),
      # flags a mode would have ignored, and values it would have failed on after loading and measuring
      (["--mode=plan", "--model=random-tiny"], "--model=random-tiny is not read by --mode=plan"),
      (["--mode=convert", "--src=a", f"--dst={tmp_path}/c", "--sink=8"], "--sink=8 is not read by --mode=convert"),
      (["--mode=convert", "--src=a", f"--dst={tmp_path}/c", "--noprogress"], "--progress=False is not read by"),
      (["--mode=convert", "--src=a", f"--dst={tmp_path}/c", f"--compilation_cache_dir={tmp_path}/cc"],
       f"--compilation_cache_dir={tmp_path}/cc is not read by --mode=convert"),
      (["--mode=distill", f"--distill_data={good}", f"--distill_out={tmp_path}/d", "--draft_layers=1",
        "--draft=lookup"], "--mode=distill trains a draft model or a feature head"),
      (["--mode=distill", f"--distill_data={good}", f"--distill_out={tmp_path}/d", "--draft_layers=1",
        "--draft_weights=int8"], "--draft_weights=int8 is not read by --mode=distill"),
      (["--mode=distill", f"--distill_data={good}", f"--distill_out={tmp_path}/d", "--draft=feature",
        "--distill_loss=kl"], "--distill_loss=kl is for a draft model"),
      (["--mode=bench", "--gammas=2,100"], "--gammas=2,100: 100 is not in [1, 64]"),
      (["--mode=bench", "--gammas=2,17", "--numerics=invariant"], "--numerics is for"),
      (["--mode=bench", f"--output_dir={good}"], "exists and is not a directory"),
      (["--mode=bench", "--sampling=invariant"], "--sampling is for"),
      (["--mode=bench", "--min_p=0.5"], "--min_p is for"),
      (["--mode=bench", "--gamma=5"], "--gamma is for"),
      (["--mode=bench", "--hardware=h100"], None),
      (["--mode=profile_acceptance", f"--output={tmp_path}/a.json", "--draft_weights=int4"],
       "--draft_weights=int4: acceptance is profiled on the draft's network in its own precision"),
      ([], None),
  ]


def test_device_memory_must_be_positive():
  with pytest.raises(flags.IllegalFlagValueError, match="device_memory_gb.*0.0 is not number >= 1e-09"):
    parse(["--mode=generate", "--prompt=hi", "--device_memory_gb=0"])


def test_usage_errors(tmp_path):
  for argv, fragment in usage_cases(tmp_path):
    if fragment is None:
      check(argv)
      continue
    with pytest.raises(app.UsageError) as e:
      check(argv)
    assert fragment in str(e.value), (argv, str(e.value))


def test_every_flag_read_by_some_modes_only_is_listed_by_each():
  """A flag that only mode modules read (not run.py or the common helpers in cli/flags.py, cli/build.py,
  cli/draft_flags.py) is in the OWN_FLAGS of exactly the modes whose module reads it, so modes.validate refuses
  it elsewhere; read as source text (`fv.NAME`, `fv["NAME"]` or the name as a string)."""
  import re
  cli = os.path.join(ROOT, "magicdec_jax", "cli")
  source = lambda name: open(os.path.join(cli, name + ".py"), encoding="utf-8").read()   # noqa: E731
  common = "\n".join(line for f in ("flags", "build", "draft_flags") for line in source(f).splitlines()
                     if "DEFINE_" not in line)
  common += open(os.path.join(ROOT, "run.py"), encoding="utf-8").read().replace("FLAGS.", "fv.")
  pattern = r"fv\.{0}\b|fv\[[\"']{0}[\"']\]|(?<![\[\w])[\"']{0}[\"'](?!\])"   # (not a dict key: p["batch"])
  reads = lambda text, flag: re.search(pattern.format(flag), text) is not None   # noqa: E731
  listed = cli_modes.flag_modes()
  for flag in parse([]):
    if flag == "mode" or reads(common, flag):
      continue
    readers = tuple(m for m in cli_modes.MODES if reads(source(m), flag))
    if readers and len(readers) < len(cli_modes.MODES):
      assert set(listed.get(flag, ())) == set(readers), (flag, readers, listed.get(flag))
  for flag, modes in listed.items():
    assert all(reads(source(m), flag) for m in modes), (flag, modes)


def test_draft_layers_range_checked_against_model():
  fv = parse(["--draft=model", "--draft_layers=3"])
  with pytest.raises(app.UsageError, match=r"--draft_layers=3: the draft model has only 2 layers \(allowed: 1..2\)"):
    cli_build.build_draft(fv, tiny())
  d = cli_build.build_draft(parse(["--draft=model", "--draft_layers=1", "--sink=2", "--window=8"]), tiny())
  assert isinstance(d, ModelDraft) and d.model.config.num_layers == 1 and d.spec.window == 8


def test_cli_help_and_bad_flag_subprocess():
  r = subprocess.run([sys.executable, "run.py", "--helpshort"], capture_output=True, text=True, cwd=ROOT,
                     timeout=120)
  assert r.returncode in (0, 1)                          # absl exits 1 after --help
  for name in ("--mode", "--draft", "--gamma", "--num_samples_per_prompt", "--on_error", "--truncate",
               "--batches", "--model_shape", "--width", "--mesh", "--[no]chat", "--tree"):
    assert name in r.stdout, name
  r = subprocess.run([sys.executable, "run.py", "--mode=datagen", "--input=/nope.jsonl", "--output=/tmp/x.jsonl"],
                     capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 1 and "--input=/nope.jsonl: no such file" in r.stderr
  assert "loading" not in r.stderr                      # rejected before any model load
  assert len(r.stderr.strip().splitlines()) <= 3, r.stderr   # its reason, not absl's whole help


def test_cli_errors_after_loading_are_one_line():
  """A bad request found once the model is loaded (here a budget beyond the context) ends the process with
  the ValueError's message and exit 1, not a traceback; --verbosity=1 shows the traceback."""
  argv = [sys.executable, "run.py", "--mode=generate", "--model=random-tiny", "--prompt=Hi", "--max_new_tokens=100000"]
  r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert "magicdec: prompt 0: 2 prompt tokens + max_new_tokens=100000 exceed the model's context" in r.stderr
  r = subprocess.run(argv + ["--verbosity=1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 1 and "Traceback" in r.stderr and "ValueError: prompt 0:" in r.stderr


def test_the_cli_starts_without_scipy_or_orbax():
  """Importing run.py (every mode's code and flags) loads neither scipy nor orbax: they are imported where a fit
  or a checkpoint needs them, which takes a third off a process's start (docs/measurements.md#notes-start-up)."""
  r = subprocess.run([sys.executable, "-c", "import sys, run; print(sorted({m.split('.')[0] for m in sys.modules}"
                      " & {'scipy', 'orbax', 'magicdec_jax'}))"], capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip().splitlines()[-1] == "['magicdec_jax']", r.stdout


@pytest.mark.slow
def test_bench_writes_json_and_png(tmp_path):
  out = cli_bench.run_bench(tiny(), StreamingDraft(sink=2, window=8), batches=[2], contexts=[20, 32],
                            gammas=[2, 3], output_dir=str(tmp_path), log=lambda m: None,
                            gen=dict(max_new_tokens=8))
  with open(out["json"]) as f:
    res = json.load(f)
  assert [(p["batch"], p["context"]) for p in res["points"]] == [(2, 20), (2, 32)]
  for p in res["points"]:
    assert p["ar"]["new_tokens"] == 8 * p["batch"]
    for f in p["spec"]:      # greedy: every gamma decodes what AR decodes (AR = generate: test_prefilled.py)
      assert f["new_tokens"] == 8 * p["batch"] and f["identical_to_ar"]
      assert f["decode_speedup"] > 0 and 0 <= f["acceptance_rate"] <= 1
  assert res["crossover"]["2"]["label"].startswith("predicted")
  assert "not measured" in res["notes"]
  assert [os.path.basename(p) for p in out["plots"]] == ["speedup_vs_context.png"]
  with open(out["plots"][0], "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_profiling_a_self_draft_skips_windows_it_sees_whole_and_refuses_weight_copies():
  """A window no longer than sink + window + 16 is all inside the target's own draft's cache: its acceptance
  would be 1 by construction, so it is skipped (none left: ValueError); a draft with a weight copy is not
  profiled as its full-precision network."""
  m = tiny()
  rng = np.random.default_rng(1)
  short, long = rng.integers(0, 256, 40).tolist(), rng.integers(0, 256, 80).tolist()
  with pytest.raises(ValueError, match="no window is longer than the draft's sink \\+ window \\+ 16 = 42"):
    acceptance.profile(m, StreamingDraft(sink=2, window=24), [short], width=2)
  out = acceptance.profile(m, StreamingDraft(sink=2, window=24), [short, long], width=2)
  assert out["windows_profiled"] == 1 and out["positions"] == 80 - 1 - 26
  with pytest.raises(ValueError, match="not on a weight copy"):
    acceptance.profile(m, StreamingDraft(sink=2, window=24, weights="int8"), [long], width=2)


def test_windowed_logits_full_window_equals_full_forward():
  m = tiny()
  toks = np.random.default_rng(0).integers(0, 256, (1, 48))
  ref = np.asarray(full_forward(m.params, m.config, toks))
  got = np.asarray(acceptance.windowed_logits(m.params, m.config, toks, 0, 48))
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  cut = np.asarray(acceptance.windowed_logits(m.params, m.config, toks, 2, 8))
  np.testing.assert_allclose(cut[0, :8], ref[0, :8], rtol=1e-5, atol=1e-5)   # window not yet cutting
  assert np.abs(cut[0, 20:] - ref[0, 20:]).max() > 1e-3                       # window cuts later


def test_acceptance_ranks_known_answers():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(40, 16))
  # greedy: draft ranks a token list by hand; the target's argmax is placed at known ranks.
  target = np.zeros((4, 16))
  target[np.arange(4), [15, 14, 0, 3]] = 1.0
  draft = np.tile(np.arange(16.0), (4, 1))         # draft top order: 15, 14, 13, ...
  assert acceptance.greedy_ranks(target, draft, 4).tolist() == [0, 1, -1, -1]
  assert acceptance.greedy_ranks(target, draft, 16).tolist() == [0, 1, 15, 12]
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  assert (acceptance.sampled_ranks(p, p, 4, rng) == 0).all()          # q == p: the first child always
  disjoint_q = np.roll(np.eye(16), 1, axis=1)[:4] * 0.5 + np.roll(np.eye(16), 2, axis=1)[:4] * 0.5
  one_hot_p = np.eye(16)[:4]
  assert (acceptance.sampled_ranks(one_hot_p, disjoint_q, 4, rng) == -1).all()   # no overlap: never
  m = tiny()
  windows = [rng.integers(0, 256, 48).tolist()]
  with pytest.raises(ValueError, match="no window is longer"):    # the window holds every position: draft == target
    acceptance.profile(m, StreamingDraft(sink=0, window=48), windows, width=3)


def test_mesh_flag():
  """--mesh builds an Auto (data, model) mesh over this process's device(s), once; a bad spec is a
  UsageError naming the flag value and the reason."""
  n = len(jax.local_devices())
  fv = parse([f"--mesh=data:1,model:{n}"])
  mesh = cli_build.setup_mesh(fv)
  assert dict(mesh.shape) == {"data": 1, "model": n} and cli_build.setup_mesh(fv) is mesh
  assert cli_build.setup_mesh(parse([])) is None
  for bad, reason in (("data:2,modle:4", "unknown axis 'modle'"), (f"data:1,model:{n + 1}", "but there are")):
    with pytest.raises(app.UsageError, match=f"--mesh={bad}: .*{reason}"):
      cli_build.setup_mesh(parse([f"--mesh={bad}"]))


def test_prompts_file_reads_a_marked_file_and_refuses_settings_it_would_ignore(tmp_path):
  """A byte-order mark is not part of the first prompt; a record's own settings are refused by name (only
  datagen reads them), an id is a label; a record with both or neither of prompt / messages is refused."""
  from magicdec_jax.cli.build import read_prompts_file
  marked = tmp_path / "bom.jsonl"
  marked.write_bytes(b'\xef\xbb\xbf{"prompt": "hello"}\n'
                     b'{"id": 2, "messages": [{"role": "user", "content": "x"}]}\nplain\n')
  assert read_prompts_file(str(marked)) == ["hello", [{"role": "user", "content": "x"}], "plain"]
  for line, words in (('{"prompt": "a", "max_new_tokens": 8, "stop": "."}',
                       "field(s) 'max_new_tokens', 'stop' are not read"),
                      ('{"prompt": "a", "messages": []}', "needs one 'prompt'"), ('{"id": 1}', "needs one 'prompt'"),
                      ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}',
                       "message 0: 'content' is a list of content parts, which are not supported"),
                      ('{"messages": [{"role": "user", "content": 3}]}', "message 0: 'content' must be a string")):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(app.UsageError, match=f"--prompts_file={bad} line 2: {re.escape(words)}"):
      read_prompts_file(str(bad))
  bad.write_text('{"prompt": "a", "tools": []}\n')          # (datagen refuses tools too: no pointer there)
  with pytest.raises(app.UsageError, match=r"line 1: field\(s\) 'tools' are not read here$"):
    read_prompts_file(str(bad))
