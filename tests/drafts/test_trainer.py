"""The shared training loop (magicdec_jax.training.trainer) on a toy least-squares problem, independent of any
model: a run cut into pieces (stop_after steps, stop_after_s seconds, a `kill -9` mid-run) ends with the
params and the history of one uninterrupted run, the final artifact is written once and only at the end,
and bad settings are named with their value."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from magicdec_jax.training import trainer

VOCAB, SEQ = 16, 6
TOY = dict(steps=8, lr=0.05, warmup_steps=2, final_lr_fraction=0.1, weight_decay=0.0, clip_norm=1.0, batch=3,
           seed=5, checkpoint_every=2, eval_every=3)


def toy_cfg(**changes) -> trainer.LoopSettings:
  return types.SimpleNamespace(**{**TOY, **changes})


def toy_data() -> np.ndarray:
  return np.random.default_rng(0).integers(0, VOCAB, size=(7, SEQ)).astype(np.int32)


@functools.partial(jax.jit, static_argnames="opt", donate_argnums=(0, 1))
def toy_step(params, opt_state, tokens, *, opt):
  """Least squares: windows [B, T] scaled to [0, 1) -> w . x should be 1."""
  def loss_fn(p):
    x = tokens.astype(jnp.float32) / VOCAB
    return jnp.mean((x @ p["w"] + p["b"] - 1.0) ** 2)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = opt.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, {"loss": loss, "w0": params["w"][:2]}


def run(out_dir: str, step=None, saved: list | None = None, **kw) -> trainer.Result:
  cfg = toy_cfg()
  opt = trainer.optimizer(cfg)
  params = {"w": jnp.zeros((SEQ,), jnp.float32), "b": jnp.zeros((), jnp.float32)}

  def evaluate(p):
    score = float(np.sum(np.asarray(p["w"], np.float64)))
    return {"score": score}, f"score {score:.4f}"

  trainer.prepare_out_dir(out_dir, {"toy": TOY})
  return trainer.train(params, step or functools.partial(toy_step, opt=opt), opt, toy_data(), cfg, out_dir,
                       name="toy", evaluate=evaluate, save_final=(saved if saved is not None else []).append,
                       progress=False, **kw)


def _assert_same(res: trainer.Result, ref: trainer.Result):
  """Same params, same history but for the clocks (timings)."""
  for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(ref.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  drop = lambda hist: [{k: v for k, v in r.items() if k not in trainer.CLOCKS} for r in hist]
  assert drop(res.history) == drop(ref.history)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  saved = []
  res = run(str(tmp_path_factory.mktemp("toy") / "one"), saved=saved)
  assert res.done and len(saved) == 1
  assert [h["step"] for h in res.history] == [0, 3, 6, 8]
  return res


@pytest.mark.parametrize("clock", trainer.CLOCKS)
def test_pieces_equal_one_run(uninterrupted, tmp_path, clock):
  out, saved = str(tmp_path / "pieces"), []
  part = run(out, saved=saved, clock=clock, stop_after=2)
  assert not part.done and not saved and part.history[-1]["step"] == 0
  part = run(out, saved=saved, clock=clock, stop_after_s=0.0)          # one step, then a checkpoint at 3
  assert not part.done and not saved and part.history[-1]["step"] == 3
  assert "3" in os.listdir(os.path.join(out, trainer.CKPT_DIR))     # off the checkpoint_every grid: kept
  res = run(out, saved=saved, clock=clock)
  assert res.done and len(saved) == 1
  _assert_same(res, uninterrupted)
  for a, b in zip(jax.tree.leaves(saved[0]), jax.tree.leaves(res.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  if clock == "train_s":                     # training seconds add up over the calls
    times = [h["train_s"] for h in res.history]
    assert times[0] == 0.0 and all(a < b for a, b in zip(times[1:], times[2:])), times
    assert all("wall_s" not in h for h in res.history)


KILL_SCRIPT = """
import os, sys
sys.path[:0] = [{tests!r}, os.path.join({tests!r}, "drafts")]
import test_trainer as T
from magicdec_jax.training import trainer
opt = trainer.optimizer(T.toy_cfg())
n = [0]
def killing(*a):
  n[0] += 1
  if n[0] == 6:                       # mid-run, right after the async checkpoint of step 4 began
    os.kill(os.getpid(), 9)
  return T.toy_step(*a, opt=opt)
T.run({out!r}, step=killing)
"""


def test_resume_after_kill_9(uninterrupted, tmp_path):
  """Killed by SIGKILL while a checkpoint is being written, the rerun ends as the uninterrupted run."""
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = str(tmp_path / "killed")
  killed = subprocess.run([sys.executable, "-c", KILL_SCRIPT.format(tests=here, out=out)], capture_output=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here])},
                          timeout=300)
  assert killed.returncode == -9, killed.stderr.decode()[-2000:]
  saved = []
  res = run(out, saved=saved)
  assert res.done and len(saved) == 1
  _assert_same(res, uninterrupted)


def test_bad_settings_named():
  with pytest.raises(ValueError, match="toy steps must be an integer >= 1, got 0"):
    trainer.check_settings(toy_cfg(steps=0), "toy")
  with pytest.raises(ValueError, match="toy eval_every must be an integer >= 0, got -1"):
    trainer.check_settings(toy_cfg(eval_every=-1), "toy")
  with pytest.raises(ValueError, match="toy lr must be a positive number, got nan"):
    trainer.check_settings(toy_cfg(lr=float("nan")), "toy")
  with pytest.raises(ValueError, match=r"toy final_lr_fraction must be in \[0, 1\], got 2"):
    trainer.check_settings(toy_cfg(final_lr_fraction=2), "toy")
  with pytest.raises(ValueError, match=r"toy data must be \[N >= 1, seq_len=6\] token windows, got \(2, 5\)"):
    trainer.check_windows(np.zeros((2, 5), np.int32), SEQ, VOCAB, "toy")
  with pytest.raises(ValueError, match=r"toy data has token ids outside \[0, 16\): they span 5\.\.16"):
    trainer.check_windows(np.arange(2 * SEQ).reshape(2, SEQ) + 5, SEQ, VOCAB, "toy")
  with pytest.raises(ValueError, match="trainer clock must be one of"):
    trainer.train({}, None, trainer.optimizer(toy_cfg()), toy_data(), toy_cfg(), "/nonexistent", name="toy",
                  evaluate=None, save_final=print, clock="cpu_s")
