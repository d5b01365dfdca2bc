"""run.py --mode=calibrate / --mode=plan with a profile / --hardware validation / profile_acceptance --input,
and generate(gamma="auto", hardware=PROFILE, acceptance=VECTOR). Random tiny model: ~40 s of CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from absl import app, flags

from magicdec_jax import generation
from magicdec_jax.cli import modes as cli_modes
from magicdec_jax import testing
from magicdec_jax.drafts import StreamingDraft

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def check(argv):
  fv = cli_modes.define_flags(flags.FlagValues())
  fv(["run.py"] + argv)
  cli_modes.validate(fv)


def run(*argv, timeout=300):
  r = subprocess.run([sys.executable, "run.py", "--progress=false", *argv], capture_output=True, text=True,
                     cwd=ROOT, timeout=timeout, env=ENV)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout


def test_hardware_flag_validation(tmp_path):
  for argv, frag in [(["--mode=plan", "--hardware=tpu9"], "expected one of cpu"),
                     (["--mode=plan", "--hardware=/nope.json"], "no such file"),
                     (["--mode=calibrate"], "--mode=calibrate needs --output")]:
    with pytest.raises(app.UsageError, match=frag):
      check(argv)
  bad = tmp_path / "acc.json"
  bad.write_text(json.dumps({"acceptance_vector": [0.5]}))
  with pytest.raises(app.UsageError, match="not a hardware profile"):
    check(["--mode=plan", f"--hardware={bad}"])
  check(["--mode=plan", "--hardware=a100"])


@pytest.mark.slow
def test_calibrate_plan_profile_acceptance_and_auto(tmp_path):
  prof = tmp_path / "profile.json"
  out = json.loads(run("--mode=calibrate", "--model=random-tiny", "--batches=1,2", "--contexts=64,256",
                       "--window=16", "--calibrate_repeats=1", "--calibrate_passes=1", f"--output={prof}"))
  p = json.loads(prof.read_text())
  assert p["format"] == "magicdec-hardware-profile/1" and p["device"] and p["jax_version"] and p["date"]
  roles = {m["role"] for m in p["measurements"]}
  assert roles == {"ar", "verify", "draft_self", "draft_self_bfloat16"}   # a float32 target: the bf16 copy too
  assert set(p["fit"]["narrow"]) == {"bfloat16"}
  assert all(m["seconds"] > 0 for m in p["measurements"]) and len(p["fit"]["coef"]) == 8
  assert out["measured_steps"] == len(p["measurements"])

  text = run("--mode=plan", f"--hardware={prof}", "--batches=1,8", "--contexts=4096,32768")
  assert "ds_speedup" in text and "S_inflection" in text and "gamma=6" in text
  text = run("--mode=plan", "--hardware=h100")
  assert "131072" in text and "    64 " in text and "S_inflection" in text       # the plan's own grid

  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text("\n".join(json.dumps({"prompt": "the quick brown fox jumps over the lazy dog " * (3 + i)})
                               for i in range(3)) + "\n")
  acc = tmp_path / "acc.json"
  run("--mode=profile_acceptance", "--model=random-tiny", f"--input={prompts}", "--window=8", "--sink=2",
      f"--output={acc}")
  a = json.loads(acc.read_text())
  assert a["source"] == str(prompts) and len(a["acceptance_vector"]) == 8 and a["positions"] > 0

  model = testing.random_tiny_model(0)
  res = generation.generate(model, [[1, 2, 3] * 20] * 2, max_new_tokens=8, draft=StreamingDraft(2, 16),
                        gamma="auto", hardware=str(prof), acceptance=str(acc))
  assert res.stats["auto_plan"]["hardware"].endswith("(fitted)") and len(res.tokens[0]) == 8
