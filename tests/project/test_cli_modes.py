"""The --mode registry (cli/modes.py) and the mode modules, run as run.py runs them.

References are independent of the CLI: plain autoregressive `generation.generate` for generated text, the
cost model called directly for plan tables, the files under cli/ for the registry, hand-written messages.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys

import jax
import pytest
from absl import app, flags

from magicdec_jax import generation, testing
from magicdec_jax.cli import datagen as cli_datagen, flags as cli_flags, generate as cli_generate, modes
from magicdec_jax.cli import demo as cli_demo, plan as cli_plan
from magicdec_jax.tuning import costmodel, profiles, shapes, stepfit
from magicdec_jax.tuning.draft_cost import DraftCost
from magicdec_jax.tuning.autotune import detect_hardware

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW = 12
PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the quick"


def parse(argv):
  fv = modes.define_flags(flags.FlagValues())
  fv(["run.py", "--noprogress"] + argv)
  modes.validate(fv)
  return fv


def quiet(msg):
  pass


@functools.lru_cache(maxsize=None)
def ar_text() -> str:
  """The reference: plain autoregressive greedy decoding of PROMPT by the model --model=random-tiny loads."""
  return generation.generate(testing.random_tiny_model(0), [PROMPT], max_new_tokens=NEW).texts[0]


def test_every_mode_is_registered_with_run_and_validate():
  here = os.path.join(ROOT, "magicdec_jax", "cli")
  files = {m.name for m in pkgutil.iter_modules([here])} - {"flags", "build", "modes", "draft_flags"}   # not modes
  assert set(modes.MODES) == files                          # one module per mode, each registered
  fv = modes.define_flags(flags.FlagValues())
  assert list(fv["mode"].parser.enum_values) == list(modes.MODES) and fv["mode"].default == "demo"
  for name, mod in modes.MODES.items():
    assert mod.__name__ == f"magicdec_jax.cli.{name}" and mod.__doc__, name
    assert list(inspect.signature(mod.run).parameters) == ["fv", "log"], name
    assert list(inspect.signature(mod.validate).parameters) == ["fv"], name


def test_mode_checks_live_in_the_mode_modules():
  """cli_flags.validate holds the checks common to all modes; a mode's own come from its module."""
  for argv, msg in ((["--mode=convert"], "--mode=convert needs --src"),
                    (["--mode=calibrate"], "--mode=calibrate needs --output"),
                    (["--mode=plan", "--draft=none"], "--mode=plan plans a draft; --draft=none is not allowed")):
    fv = modes.define_flags(flags.FlagValues())
    fv(["run.py"] + argv)
    cli_flags.validate(fv)                                  # nothing common is wrong
    with pytest.raises(app.UsageError, match=msg):
      modes.MODES[fv.mode].validate(fv)
  with pytest.raises(app.UsageError, match="--num_processes=2 needs --coordinator_address"):
    parse(["--mode=convert", "--src=a", "--dst=b", "--num_processes=2"])


@pytest.mark.parametrize("draft", ["streaming", "lookup"])
def test_generate_gamma_auto_subprocess_prints_the_autoregressive_text(draft):
  """run.py end to end with --gamma=auto: on this tiny model and short prompt auto decodes the streaming
  draft's rows autoregressively (no draft step pays), and speculates with the free lookup draft."""
  r = subprocess.run([sys.executable, "run.py", "--mode=generate", "--model=random-tiny", "--gamma=auto",
                      f"--draft={draft}", f"--prompt={PROMPT}", f"--max_new_tokens={NEW}"],
                     capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout == ar_text() + "\n" and ar_text().strip()
  assert "--mode=generate done" in r.stderr
  if draft == "lookup":
    assert re.search(r"acceptance \d\.\d+\n", r.stderr), r.stderr      # a rate: draft rounds ran
  # what auto decided is said: plain decoding for the streaming draft, chains for the lookup one
  said = re.search(r"gamma=auto chose (.+) over contexts \d+\.\.\d+ \(predicted up to [\d.]+x on \w+\)", r.stderr)
  assert said and (said[1] == "plain decoding") == (draft == "streaming"), r.stderr


@pytest.mark.parametrize("draft", [["--draft=none"], ["--draft=lookup", "--lookup_ngram=3"]],
                         ids=["none", "lookup"])
def test_generate_in_process_prints_the_autoregressive_text(draft, capsys):
  logged = []
  cli_generate.run(parse(["--mode=generate", "--model=random-tiny", f"--prompt={PROMPT}",
                          f"--max_new_tokens={NEW}"] + draft + (["--gamma=3"] if draft != ["--draft=none"] else [])),
                     logged.append)
  assert capsys.readouterr().out == ar_text() + "\n"
  if draft[0] == "--draft=lookup":                          # the draft ran and got tokens accepted
    assert float(logged[-1].rsplit("acceptance ", 1)[1]) > 0, logged[-1]


def test_generate_json_schema_flag_gives_valid_json_and_a_bad_schema_names_the_flag(capsys, tmp_path):
  schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
  path = tmp_path / "schema.json"
  path.write_text(json.dumps(schema))
  cli_generate.run(parse(["--mode=generate", "--model=random-tiny", f"--prompt={PROMPT}", "--max_new_tokens=16",
                          "--draft=lookup", f"--json_schema=@{path}"]), quiet)
  out = capsys.readouterr().out
  assert json.loads(out)["ok"] in (True, False)          # the model's tiny vocabulary: one object and "stop"
  with pytest.raises(app.UsageError, match="--json_schema: .*minimum"):
    parse(["--mode=generate", "--model=random-tiny", "--prompt=x", '--json_schema={"type": "number", "minimum": 1}'])
  with pytest.raises(app.UsageError, match='--json_schema: a JSON schema is a JSON object, got str "string"'):
    parse(["--mode=generate", "--model=random-tiny", "--prompt=x", '--json_schema="string"'])
  path.write_text('{"type": ')
  with pytest.raises(app.UsageError, match=f"--json_schema=@{path}: not JSON"):
    parse(["--mode=generate", "--model=random-tiny", "--prompt=x", f"--json_schema=@{path}"])


def test_datagen_resume_with_changed_settings_is_refused(tmp_path, capsys):
  inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
  inp.write_text("".join(json.dumps({"id": i, "prompt": f"to be or not to be {i}"}) + "\n" for i in range(3)))
  base = ["--mode=datagen", "--model=random-tiny", f"--input={inp}", f"--output={out}", "--max_new_tokens=4",
          "--batch_size=2", "--draft=streaming", "--sink=2", "--window=8", "--gamma=2", "--temperature=1"]
  cli_datagen.run(parse(base + ["--seed=0"]), quiet)
  assert json.loads(capsys.readouterr().out)["records_written"] == 3
  done = out.read_bytes()
  plain = [a for a in base if not a.startswith(("--sink", "--window", "--gamma"))]   # (flags a plain run refuses)
  for argv, msg in ((base + ["--seed=1"], "seed: 0 -> 1"), (plain + ["--seed=0", "--draft=none"], "draft: ")):
    with pytest.raises(app.UsageError, match=f"datagen: {out} was produced with different settings \\(.*{msg}"):
      cli_datagen.run(parse(argv), quiet)
  assert out.read_bytes() == done
  cli_datagen.run(parse(base + ["--seed=0"]), quiet)      # the same settings resume (nothing left to do)
  assert out.read_bytes() == done and json.loads(capsys.readouterr().out)["records_skipped_existing"] == 3


def _plan(argv, capsys) -> str:
  cli_plan.run(parse(["--mode=plan", "--batches=1,8", "--contexts=4096,32768"] + argv), quiet)
  return capsys.readouterr().out


def _table(draft: DraftCost) -> str:
  rows = costmodel.plan_table(shapes.model_shape("llama31_8b"), detect_hardware("h100"), [1, 8], [4096, 32768],
                              draft, alpha=0.8)
  return costmodel.format_plan(rows)


def test_plan_prices_every_draft_through_its_cost_model_view(capsys):
  out = _plan(["--draft=lookup"], capsys)
  assert "draft lookup (n-grams up to 3, no network)" in out and "S_inflection" in out
  assert _table(DraftCost(0, runs_network=False)) in out
  out = _plan(["--draft=streaming", "--sink=16", "--window=512"], capsys)   # as before the registry
  assert "draft self (sink 16, window 512)" in out
  assert _table(DraftCost(16 + 512)) in out
  out = _plan(["--draft=model", "--draft_layers=4", "--sink=16", "--window=512"], capsys)
  assert _table(DraftCost(16 + 512, shapes.model_shape("llama31_8b").replace(num_layers=4))) in out
  out = _plan(["--draft=feature", "--sink=16", "--window=512"], capsys)     # no head needed to plan one
  assert "draft feature head (sink 16, window 512)" in out
  with pytest.raises(app.UsageError, match="--mode=plan with --draft=model needs --draft_layers"):
    parse(["--mode=plan", "--draft=model", "--draft_model=x"])


def test_plan_takes_one_acceptance_and_a_datasheet_only_beside_a_profile(tmp_path, capsys):
  """--alpha given replaces a profile's acceptance vector; with --acceptance_file, or --datasheet beside a
  datasheet, the flags would be ignored: refused by name."""
  hw = stepfit.FittedHardware("fake", (1e-3, 1e-5, 1e-11, 0.0, 1e-12, 0.0, 3e-10, 1e-12), memory_bytes=80e9)
  prof = profiles.save_profile({"format": profiles.PROFILE_FORMAT, "fit": hw.to_dict(), "measurements": [],
                                "device": "fake", "acceptance_vector": [0.5, 0.2]}, str(tmp_path / "p.json"))
  acc = tmp_path / "acc.json"
  acc.write_text(json.dumps({"acceptance_vector": [0.6, 0.2]}))
  for argv, frag in (([f"--hardware={prof}", f"--acceptance_file={acc}", "--alpha=0.7"],
                      "--alpha=0.7 and --acceptance_file=.*: give one"),
                     (["--hardware=a100", "--datasheet=h200"], "--datasheet=h200 .* not --hardware=a100"),
                     (["--datasheet=h200"], "--datasheet=h200 .* not --hardware=h100")):
    with pytest.raises(app.UsageError, match=frag):
      modes.validate(parse(["--mode=plan"] + argv))
  assert "acceptance vector from the profile" in _plan([f"--hardware={prof}"], capsys)
  out = _plan([f"--hardware={prof}", "--alpha=0.7"], capsys)
  assert "alpha 0.70" in out and "acceptance vector" not in out
  cfg, draft = shapes.model_shape("llama31_8b"), DraftCost(4 + 256)       # the default sink + window
  rows, ds = (costmodel.plan_table(cfg, h, [1, 8], [4096, 32768], draft, alpha=0.7)
              for h in (hw, detect_hardware("h100")))
  assert costmodel.format_plan(rows, compare=ds) in out


def test_demo_mode_passes_its_flags_and_finds_the_checkout(capsys):
  """--mode=demo's run: the given flags reach the comparison, and the recorded sweeps are read from the
  checkout (the directory run.py is in), as cli_demo.measured_crossover reads them from ROOT."""
  cli_demo.run(parse(["--model=random-tiny", "--batch_size=2", "--prompt_tokens=300", "--max_new_tokens=8",
                      "--gamma=2", "--sink=2", "--window=16", "--demo_repeats=1"]), quiet)
  out = capsys.readouterr().out
  assert "batch 2 x 300-token prompts, 8 new tokens" in out and "identical greedy tokens: True" in out
  assert "sink 2 + window 16 tokens, bfloat16 weights" in out
  assert "Structured answers" in out and "plain and MagicDec agree token for token: True" in out
  assert "MagicDec with StreamingDraft sink 2 + window 16, gamma 2:" in out   # the demo's draft, own weights
  line = cli_demo.measured_crossover(ROOT, f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}",
                                     profiles.host_cpu_model() if jax.default_backend() == "cpu" else None)
  assert cli_demo.ROOT == ROOT and (line is None or line in out)
