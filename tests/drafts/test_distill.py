"""Draft distillation (magicdec_jax.training.distill): the loss falls, resume is exact, bad input fails early, and the
trained draft loads and decodes losslessly."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import tiny_model, xla_flags
from magicdec_jax import checkpoints, drafts, generation
from magicdec_jax.cli import modes as cli_modes
from magicdec_jax import testing
from magicdec_jax.training import distill, distill_data, trainer
from magicdec_jax.model import full_forward

SEQ = 32
CFG = distill.DistillConfig(steps=24, lr=1e-2, warmup_steps=4, batch=4, seq_len=SEQ, checkpoint_every=5,
                            sink=2, window=8, seed=3, loss="kl")


def _target():
  return tiny_model(0, layers=3, attn_scale=4.0)


def _data(n=48, seed=0):
  return np.random.default_rng(seed).integers(0, 64, size=(n, SEQ)).astype(np.int32)


def _heldout():
  return [np.random.default_rng(99 + i).integers(0, 64, size=48).tolist() for i in range(3)]


def _kl64(target, draft, windows) -> float:
  """KL(target || draft) per position, float64 numpy, from the two models' logits."""
  tot, n = 0.0, 0
  for w in windows:
    arr = np.asarray([w], np.int32)
    p = np.asarray(full_forward(target.params, target.config, arr), np.float64)[0]
    q = np.asarray(full_forward(draft.params, draft.config, arr), np.float64)[0]
    lp = p - np.log(np.exp(p - p.max(-1, keepdims=True)).sum(-1, keepdims=True)) - p.max(-1, keepdims=True)
    lq = q - np.log(np.exp(q - q.max(-1, keepdims=True)).sum(-1, keepdims=True)) - q.max(-1, keepdims=True)
    tot += (np.exp(lp) * (lp - lq)).sum()
    n += len(w)
  return tot / n


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One uninterrupted run: (out dir, trained model, history)."""
  out = str(tmp_path_factory.mktemp("distill") / "full")
  target = _target()
  model, hist = distill.distill(target, distill.init_draft(target, layers=1), _data(), out, CFG,
                                eval_windows=_heldout(), progress=False)
  return out, model, hist


def test_heldout_kl_falls(trained):
  target = _target()
  before = _kl64(target, distill.init_draft(target, layers=1), _heldout())
  after = _kl64(target, trained[1], _heldout())
  assert after < 0.7 * before, (before, after)
  assert abs(distill.heldout_kl(target, trained[1], _heldout()) - after) < 1e-6
  hist = trained[2]
  assert [h["step"] for h in hist] == [0, CFG.steps] and 0 <= hist[-1]["acceptance"] <= 1


def assert_resumed_equals_uninterrupted(out: str, trained):
  """Running to the end from the checkpoints in `out` gives the uninterrupted run's params (to 1e-6)."""
  target = _target()
  model, _ = distill.distill(target, distill.init_draft(target, layers=1), _data(), out, CFG, progress=False)
  diff = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                      model.params, trained[1].params)
  assert max(jax.tree.leaves(diff)) <= 1e-6


def test_resume_after_stop_equals_uninterrupted(trained, tmp_path):
  target = _target()
  out = str(tmp_path / "resumed")
  part, _ = distill.distill(target, distill.init_draft(target, layers=1), _data(), out, CFG, progress=False,
                            stop_after=7)
  assert not os.path.exists(os.path.join(out, checkpoints.CONFIG_FILE))      # no final model yet
  assert_resumed_equals_uninterrupted(out, trained)


KILL_SCRIPT = """
import os, sys, numpy as np
sys.path[:0] = [{tests!r}, os.path.join({tests!r}, "drafts")]
from conftest import tiny_model, xla_flags
from magicdec_jax.training import distill
import test_distill as T
orig = distill.train_step
n = [0]
def killing(*a, **k):
  n[0] += 1
  if n[0] == 13:                      # mid-run, right after the async checkpoint of step 10 began
    os.kill(os.getpid(), 9)
  return orig(*a, **k)
distill.train_step = killing
t = T._target()
distill.distill(t, distill.init_draft(t, layers=1), T._data(), {out!r}, T.CFG, progress=False)
"""


def test_resume_after_kill_9(trained, tmp_path):
  out = str(tmp_path / "killed")
  tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(tests), tests]))
  r = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(tests=tests, out=out)], env=env,
                     capture_output=True, timeout=300)
  assert r.returncode == -9, r.stderr.decode()[-2000:]
  assert not os.path.exists(os.path.join(out, checkpoints.CONFIG_FILE))
  assert_resumed_equals_uninterrupted(out, trained)


MESH_SCRIPT = """
import os, sys, jax, numpy as np
sys.path[:0] = [{tests!r}, os.path.join({tests!r}, "drafts")]
from magicdec_jax import sharding
from magicdec_jax.training import distill
import test_distill as T
t, mesh = T._target(), sharding.make_mesh("data:2")
for stop in (7, None):                # stopped and resumed, batch split over the data axis
  model, _ = distill.distill(t, distill.init_draft(t, layers=1), T._data(), {out!r}, T.CFG, mesh=mesh,
                             progress=False, stop_after=stop)
np.savez({npz!r}, *[np.asarray(x) for x in jax.tree.leaves(model.params)])
"""


def test_mesh_run_equals_single_device(trained, tmp_path):
  """With a 2-device data mesh (params and optimizer state replicated, the batch split) a stopped and resumed
  run ends with the params of the single-device uninterrupted run, up to the all-reduce's summation order."""
  tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  npz = str(tmp_path / "mesh.npz")
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=2"), JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([os.path.dirname(tests), tests]))
  r = subprocess.run([sys.executable, "-c", MESH_SCRIPT.format(tests=tests, out=str(tmp_path / "mesh"), npz=npz)],
                     env=env, capture_output=True, timeout=600)
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  got = np.load(npz)
  want = jax.tree.leaves(trained[1].params)
  assert len(got.files) == len(want)
  for i, w in enumerate(want):
    np.testing.assert_allclose(got[f"arr_{i}"], np.asarray(w), rtol=1e-4, atol=1e-5)


def test_trained_dir_loads_and_decodes_losslessly(trained):
  target = _target()
  draft_model = checkpoints.load_model(trained[0])
  assert draft_model.config.num_layers == 1
  prompts = [np.random.default_rng(5).integers(0, 64, size=n).tolist() for n in (9, 20)]
  ar = generation.generate(target, prompts, max_new_tokens=12)
  sd = generation.generate(target, prompts, max_new_tokens=12, gamma=3,
                       draft=drafts.ModelDraft(draft_model, sink=2, window=8))
  assert sd.tokens == ar.tokens


def test_bad_inputs_raise_before_compiling(tmp_path, monkeypatch):
  target = _target()
  def no_step(*args, **kwargs):
    raise AssertionError("a training step ran (compiled) for bad input")
  monkeypatch.setattr(distill, "train_step", no_step)
  draft = distill.init_draft(target, layers=1)
  (tmp_path / "empty.jsonl").write_text("\n")
  with pytest.raises(ValueError, match="empty"):
    distill_data.load_windows(str(tmp_path / "empty.jsonl"), None, 64, SEQ)
  (tmp_path / "bad.jsonl").write_text(json.dumps({"token_ids": [1, 2, 3]}) + "\n{not json\n")
  with pytest.raises(ValueError, match="line 2"):
    distill_data.load_windows(str(tmp_path / "bad.jsonl"), None, 64, SEQ)
  (tmp_path / "oov.jsonl").write_text(json.dumps({"token_ids": [1, 70]}) + "\n")
  with pytest.raises(ValueError, match="line 1.*vocabulary"):
    distill_data.load_windows(str(tmp_path / "oov.jsonl"), None, 64, SEQ)
  (tmp_path / "short.jsonl").write_text(json.dumps({"token_ids": [1, 2]}) + "\n")
  with pytest.raises(ValueError, match="fewer than one window"):
    distill_data.load_windows(str(tmp_path / "short.jsonl"), None, 64, SEQ)
  other_vocab = distill.init_draft(target, config=target.config.replace(vocab_size=80, num_layers=1))
  with pytest.raises(ValueError, match="vocabulary"):
    distill.distill(target, other_vocab, _data(), str(tmp_path / "o1"), CFG, progress=False)
  bigger = distill.init_draft(target, config=target.config.replace(num_layers=4))
  with pytest.raises(ValueError, match="larger than the target"):
    distill.distill(target, bigger, _data(), str(tmp_path / "o2"), CFG, progress=False)
  (tmp_path / "afile").write_text("x")
  with pytest.raises(ValueError, match="does not exist|not a directory"):
    distill.distill(target, draft, _data(), str(tmp_path / "afile" / "out"), CFG, progress=False)
  with pytest.raises(ValueError, match="seq_len"):
    distill.distill(target, draft, _data()[:, :16], str(tmp_path / "o3"), CFG, progress=False)
  for kw, words in ((dict(window=-5), "window must be an integer >= 1, got -5"),      # (a ZeroDivisionError)
                    (dict(sink=-3), "sink must be an integer >= 0, got -3")):
    with pytest.raises(ValueError, match=words):
      dataclasses.replace(CFG, **kw).validate()
  assert not any((tmp_path / d).exists() for d in ("o1", "o2", "o3"))
  # a run that wrote no checkpoint yet (killed at its first compile) starts over with new settings; one that
  # did refuses other settings, other data among them
  o4 = tmp_path / "o4"
  trainer.prepare_out_dir(str(o4), {"a": 1})
  trainer.prepare_out_dir(str(o4), {"a": 2})
  assert json.loads((o4 / trainer.SETTINGS_FILE).read_text()) == {"a": 2}
  (o4 / trainer.CKPT_DIR / "5").mkdir(parents=True)
  with pytest.raises(ValueError, match="other settings"):
    trainer.prepare_out_dir(str(o4), {"a": 3})
  assert trainer.data_digest(_data()) != trainer.data_digest(_data()[::-1])
  # a directory of something else (a model, say) is never written into
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="not a distillation run \\(tokenizer.json\\)"):
    distill.distill(target, draft, _data(), str(tmp_path / "model"), CFG, progress=False)
  assert os.listdir(tmp_path / "model") == ["tokenizer.json"]


def test_openai_batch_output_is_distillation_data(tmp_path):
  """datagen's OpenAI format writes batch output lines (no token ids): each choice's completion text is a
  document (a completion's `text`, a chat choice's `message.content`); an error line holds none."""
  tok = testing.random_tiny_model(0).tokenizer
  def line(cid, choices, error=None):
    resp = None if error else {"status_code": 200, "request_id": "r", "body": {"object": "x", "choices": choices}}
    return json.dumps({"id": "b", "custom_id": cid, "response": resp, "error": error}) + "\n"
  texts = ["To be, or not to be", "that is the question", "Whether 'tis nobler"]
  path = tmp_path / "out.jsonl"
  path.write_text(line("a", [{"index": 0, "text": texts[0], "finish_reason": "stop"}])
                  + line("b", None, error={"code": "invalid_request", "message": "line 2: bad"})
                  + line("c", [{"index": 0, "message": {"role": "assistant", "content": texts[1]}},
                               {"index": 1, "message": {"role": "assistant", "content": texts[2]}}]))
  want = sum((tok.encode(t).ids + [256] for t in texts), [])
  got = distill_data.load_windows(str(path), tok, 264, 8, eos_id=256)
  assert got.reshape(-1).tolist() == want[:len(want) // 8 * 8]
  path.write_text(line("a", [{"index": 0, "finish_reason": "stop"}]))
  with pytest.raises(ValueError, match="line 1: an OpenAI batch output line without"):
    distill_data.load_windows(str(path), tok, 264, 8)


def test_batch_order_is_a_function_of_seed_and_step():
  a = [distill_data.batch_indices(10, 4, s, 7).tolist() for s in range(6)]
  b = [distill_data.batch_indices(10, 4, s, 7).tolist() for s in (3, 4, 5)]
  assert a[3:] == b
  flat = sum(a[:5], [])                   # 20 draws = two epochs, each a permutation of the 10 windows
  assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))


def test_cli_distill_writes_a_draft_that_decodes_losslessly(tmp_path):
  """run.py --mode=distill --draft=model end to end on the random tiny model: it exits 0 and the draft it
  writes drafts the target's own greedy tokens (a plain autoregressive run's)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  text = tmp_path / "text.txt"
  text.write_text("To be, or not to be, that is the question. " * 40)
  out = tmp_path / "draft"
  r = subprocess.run([sys.executable, "run.py", "--model=random-tiny:0", "--mode=distill", "--draft=model",
                      "--draft_layers=1", f"--distill_data={text}", f"--distill_out={out}", "--distill_steps=2",
                      "--batch=2", "--seq_len=32", "--window=16", "--noprogress"],
                     capture_output=True, text=True, cwd=root, env=dict(os.environ, PYTHONPATH=root), timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  target = testing.random_tiny_model(0)
  prompts = [np.random.default_rng(6).integers(0, target.config.vocab_size, size=n).tolist() for n in (9, 20)]
  ar = generation.generate(target, prompts, max_new_tokens=10)
  sd = generation.generate(target, prompts, max_new_tokens=10, gamma=2,
                       draft=drafts.ModelDraft(checkpoints.load_model(str(out)), sink=2, window=8))
  assert sd.tokens == ar.tokens


def test_cli_distill_flags_validated(tmp_path):
  from absl import app, flags

  def check(argv):
    fv = cli_modes.define_flags(flags.FlagValues())
    fv(["run.py", "--mode=distill"] + argv)
    cli_modes.validate(fv)

  data = tmp_path / "d.jsonl"
  data.write_text(json.dumps({"token_ids": [1, 2, 3]}) + "\n")
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "afile").write_text("x")
  ok = [f"--distill_data={data}", f"--distill_out={tmp_path / 'out'}", "--draft_layers=1"]
  check(ok)
  cases = [
      ([f"--distill_out={tmp_path / 'out'}", "--draft_layers=1"], "--distill_data"),
      ([f"--distill_data={tmp_path / 'nope.jsonl'}"] + ok[1:], "no such file"),
      ([f"--distill_data={tmp_path / 'empty.txt'}"] + ok[1:], "empty file"),
      (ok[:2], "--draft_layers"),
      (ok + [f"--draft_config={data}"], "exactly one"),
      ([ok[0], f"--distill_out={tmp_path / 'afile'}", ok[2]], "not a directory"),
      ([ok[0], f"--distill_out={tmp_path / 'no' / 'out'}", ok[2]], "does not exist"),
      (ok + ["--mesh=data:3", "--batch=8"], "--batch=8"),
      (ok + [f"--distill_heldout={tmp_path / 'empty.txt'}"], "--distill_heldout=" + str(tmp_path / "empty.txt")),
  ]
  for argv, msg in cases:
    with pytest.raises(app.UsageError, match=msg):
      check(argv)
  with pytest.raises(flags.IllegalFlagValueError):
    check(ok + ["--distill_loss=mse"])
  with pytest.raises(flags.IllegalFlagValueError):
    check(ok + ["--distill_steps=0"])
