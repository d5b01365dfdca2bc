"""The resumable training loop shared by draft distillation (distill.py) and feature-head training
(distill_feature.py).

Both train a small model against a frozen target on int token windows [N, T] with the same discipline, held
here once so that it cannot drift apart:

* AdamW on a linear warm-up + cosine schedule after global-norm clipping (`optimizer`).
* The batch of step s is `data[distill_data.batch_indices(N, batch, s, seed)]`: a pure function of
  (seed, s), so the data order never depends on where a run was cut.
* An orbax CheckpointManager under OUT/checkpoints (params, optimizer state and, for `clock="train_s"`, the
  training seconds so far) every `checkpoint_every` steps and at the end of every call; orbax writes each
  step to a temporary directory and renames it when complete, so a `kill -9` leaves either the previous or
  the new checkpoint. A rerun restores the latest one, so a run cut into pieces (`stop_after` steps,
  `stop_after_s` seconds, a crash) ends with the params of one uninterrupted run.
* Held-out evaluations at step 0, every `eval_every` steps and at the end, appended to
  OUT/distill_history.json (rewritten atomically; a resumed run keeps the records up to its checkpoint).
* The finished artifact is written (`save_final`) only once every step is done.

    trainer.prepare_out_dir(out_dir, settings)          # after every check: refuses other settings
    res = trainer.train(params, step_fn, cfg.optimizer(), data, cfg, out_dir, name="distill",
                        evaluate=evaluate, save_final=save, postfix=postfix)
    res.params, res.history, res.done

The caller owns the jitted step `(params, opt_state, batch [B, T]) -> (params, opt_state, metrics)`, which
may donate its first two arguments (the loop trains on its own copy of `params`), the evaluation and the
final save.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable, Literal, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from magicdec_jax import compile as compiling
from magicdec_jax.training import distill_data

CKPT_DIR = "checkpoints"
SETTINGS_FILE = "distill_settings.json"
HISTORY_FILE = "distill_history.json"
CLOCKS = ("wall_s", "train_s")

Params = Any            # a pytree of arrays
Metrics = dict          # name -> scalar or small array (e.g. one value per unroll depth)
StepFn = Callable[[Params, optax.OptState, jax.Array], tuple[Params, optax.OptState, Metrics]]


class LoopSettings(Protocol):
  """The fields of a training config the loop reads (DistillConfig and FeatureDistillConfig have them)."""
  steps: int
  lr: float
  warmup_steps: int
  final_lr_fraction: float
  weight_decay: float
  clip_norm: float
  batch: int
  seed: int
  checkpoint_every: int
  eval_every: int          # 0: evaluate only at the start and the end


class Result(NamedTuple):
  params: Params           # host arrays when `done`, else the device arrays of the last step of this call
  history: list[dict]      # one record per evaluation, over every call of the run
  done: bool               # all `steps` trained and `save_final` called


# ------------------------------------------------------------------------------------------ checks

def check_int(what: str, name: str, value, low: int = 1):
  """ValueError naming `what name` unless `value` is an integer >= low."""
  if not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{what} {name} must be an integer >= {low}, got {value!r}")


def check_settings(cfg: LoopSettings, what: str):
  """ValueError, naming the field and its value, unless the loop and optimizer fields of `cfg` are usable."""
  for name in ("steps", "batch", "checkpoint_every"):
    check_int(what, name, getattr(cfg, name))
  for name in ("warmup_steps", "eval_every"):
    check_int(what, name, getattr(cfg, name), low=0)
  if not (cfg.lr > 0 and np.isfinite(cfg.lr)):
    raise ValueError(f"{what} lr must be a positive number, got {cfg.lr!r}")
  if not cfg.clip_norm > 0:
    raise ValueError(f"{what} clip_norm must be > 0, got {cfg.clip_norm!r}")
  if not 0 <= cfg.final_lr_fraction <= 1:
    raise ValueError(f"{what} final_lr_fraction must be in [0, 1], got {cfg.final_lr_fraction!r}")
  if not cfg.weight_decay >= 0:
    raise ValueError(f"{what} weight_decay must be >= 0, got {cfg.weight_decay!r}")


def check_windows(data, seq_len: int, vocab_size: int, what: str) -> np.ndarray:
  """`data` as an int array [N >= 1, seq_len] of ids in [0, vocab_size); ValueError otherwise."""
  data = np.asarray(data)
  if data.ndim != 2 or data.shape[0] < 1 or data.shape[1] != seq_len:
    raise ValueError(f"{what} data must be [N >= 1, seq_len={seq_len}] token windows, got {data.shape}")
  lo, hi = int(data.min()), int(data.max())
  if lo < 0 or hi >= vocab_size:
    raise ValueError(f"{what} data has token ids outside [0, {vocab_size}): they span {lo}..{hi}")
  return data


def data_digest(data) -> str:
  """A digest of training windows (int [N, seq_len]): what a resumed run's data must match."""
  return hashlib.sha256(np.ascontiguousarray(np.asarray(data), np.int64).tobytes()).hexdigest()[:32]


def prepare_out_dir(out_dir: str, settings: dict):
  """Create OUT (or check it); refuse one holding a run of different settings, or files of something else
  (a model directory, say, which the finished run would overwrite). A run that wrote no checkpoint yet
  (killed at its first compile) is started over with the new settings. ValueError if not writable.
  Nothing is written but the settings file."""
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise ValueError(f"distill output {out_dir!r} exists and is not a directory")
  parent = os.path.dirname(out_dir)
  if not os.path.isdir(out_dir):
    if not os.path.isdir(parent):
      raise ValueError(f"distill output {out_dir!r}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
      raise ValueError(f"distill output {out_dir!r}: {parent} is not writable")
  elif not os.access(out_dir, os.W_OK):
    raise ValueError(f"distill output {out_dir!r} is not writable")
  path = os.path.join(out_dir, SETTINGS_FILE)
  ckpt = os.path.join(out_dir, CKPT_DIR)
  names = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
  if names and not os.path.isfile(path):
    raise ValueError(f"distill output {out_dir!r} holds files that are not a distillation run "
                     f"({', '.join(sorted(names)[:5])}); use a new or empty directory")
  trained = bool(names - {SETTINGS_FILE, CKPT_DIR}) or (os.path.isdir(ckpt) and bool(os.listdir(ckpt)))
  if os.path.isfile(path) and trained:
    with open(path) as f:
      old = json.load(f)
    if old != settings:
      diff = {k: (old.get(k), settings.get(k)) for k in set(old) | set(settings) if old.get(k) != settings.get(k)}
      raise ValueError(f"distill output {out_dir!r} holds a run with other settings {diff} (old, new); "
                       "use another directory or delete it")
    return
  os.makedirs(out_dir, exist_ok=True)
  _write_json(path, settings, sort_keys=True)


def _write_json(path: str, obj, **kw):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, **kw)
  os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ optimizer

def optimizer(cfg: LoopSettings) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW on a warm-up + cosine schedule. The same schedule gives the same
  object: the optimizer is a static argument of the jitted steps, so that means the same executable."""
  return _optimizer(cfg.steps, cfg.lr, cfg.warmup_steps, cfg.final_lr_fraction, cfg.weight_decay,
                    cfg.clip_norm)


@functools.lru_cache(maxsize=16)
def _optimizer(steps: int, lr: float, warmup_steps: int, final_lr_fraction: float, weight_decay: float,
               clip_norm: float) -> optax.GradientTransformation:
  warmup = min(warmup_steps, max(steps - 1, 0))
  sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1),
                                             end_value=lr * final_lr_fraction)
  return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(sched, weight_decay=weight_decay))


# ------------------------------------------------------------------------------------------ the loop

def train(params: Params, step_fn: StepFn, opt: optax.GradientTransformation, data: np.ndarray,
          cfg: LoopSettings, out_dir: str, *, name: str,
          evaluate: Callable[[Params], tuple[dict, str]] | None,
          save_final: Callable[[Params], Any],
          postfix: Callable[[Metrics, float], dict] = lambda m, rate: {},
          put_batch: Callable[[np.ndarray], jax.Array] = jnp.asarray,
          place: Callable[[Any], Any] = lambda tree: tree,
          clock: Literal["wall_s", "train_s"] = "wall_s",
          progress: bool = True, stop_after: int | None = None, stop_after_s: float | None = None,
          log: Callable[[str], Any] | None = None) -> Result:
  """Train `params` with `step_fn` on `data` (int [N, T] windows) into the prepared `out_dir`, resuming from
  its latest checkpoint.

  evaluate(params) -> (measures, summary): held-out measures recorded in the history (None: no evaluation,
    empty history) and a line logged after "step s: ".
  save_final(host params): writes the finished artifact into OUT; called once all `cfg.steps` are done.
  postfix(host metrics, steps/s of this call from its second step on) -> the progress bar's postfix.
  put_batch(windows [B, T]) -> the step's batch (e.g. split over a mesh's data axis).
  place(tree) -> the params and the fresh optimizer state where the step takes them (e.g. replicated).
  clock: the time each history record carries after the measures: "wall_s", seconds since this call began
    (evaluations included); "train_s", training seconds over every call of the run, compilation excluded
    (kept in the checkpoints; each step is waited for to time it).
  stop_after=k / stop_after_s=t: end this call after k steps / the first step that ends t seconds after
    training began (checkpointing first).
  log: a callable taking one line; default: stderr as "[name] ..." when `progress`, else silent.
  """
  import orbax.checkpoint as ocp   # imported where used: orbax is slow to import, and only training needs it here
  if clock not in CLOCKS:
    raise ValueError(f"trainer clock must be one of {CLOCKS}, got {clock!r}")
  log = log or (lambda m: print(f"[{name}] {m}", file=sys.stderr, flush=True) if progress else None)
  out_dir = os.path.abspath(out_dir)
  params = place(jax.tree.map(jnp.copy, params))                  # own buffers: the step donates them
  opt_state = place(opt.init(params))
  train_s = 0.0

  def checkpoint_state() -> dict:
    state = {"params": params, "opt_state": opt_state}
    if clock == "train_s":
      state["train_s"] = np.float64(train_s)
    return state

  mngr = ocp.CheckpointManager(os.path.join(out_dir, CKPT_DIR),
                               options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start = mngr.latest_step() or 0
  hist_path = os.path.join(out_dir, HISTORY_FILE)
  history: list[dict] = []
  if start:
    state = mngr.restore(start, args=ocp.args.StandardRestore(
        jax.tree.map(ocp.utils.to_shape_dtype_struct, checkpoint_state())))
    params, opt_state = state["params"], state["opt_state"]
    train_s = float(state.get("train_s", 0.0))
    if os.path.isfile(hist_path):
      with open(hist_path) as f:
        history = [h for h in json.load(f) if h["step"] <= start]
    trained = f" ({train_s:.0f} s trained)" if clock == "train_s" else ""
    log(f"resumed from the checkpoint at step {start}{trained}")

  def record(step: int, metrics: Metrics | None = None):
    if evaluate is None:
      return
    measures, summary = evaluate(params)
    rec = {"step": step, **measures,
           clock: time.perf_counter() - t0 if clock == "wall_s" else train_s}
    if metrics:
      rec.update({k: np.asarray(v).tolist() for k, v in metrics.items()})
    history.append(rec)
    log(f"step {step}: {summary}")
    _write_json(hist_path, history)

  t0 = time.perf_counter()
  if start == 0:
    record(0)
  end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
  bar = None
  if progress and end > start:
    bar = tqdm(total=cfg.steps, initial=start, desc=name, unit="step", dynamic_ncols=True, file=sys.stderr)
  sync = bar is not None or clock == "train_s"        # fetch every step's metrics (else only when needed)
  metrics, t_call = None, time.perf_counter()
  t_run = t_call
  for step in range(start, end):
    windows = data[distill_data.batch_indices(data.shape[0], cfg.batch, step, cfg.seed)]   # [B, T]
    t_step, c_step = time.perf_counter(), compiling.compile_seconds()
    params, opt_state, metrics = step_fn(params, opt_state, put_batch(windows))
    host = jax.device_get(metrics) if sync else None
    done = step + 1
    if clock == "train_s":
      train_s += time.perf_counter() - t_step - (compiling.compile_seconds() - c_step)
    if done == start + 1:
      jax.block_until_ready(metrics)
      t_run = time.perf_counter()         # steps/s from the second step on (the first one compiles)
    if bar is not None:
      bar.set_postfix(**postfix(host, (done - start - 1) / max(time.perf_counter() - t_run, 1e-9)))
      bar.update(1)
    out_of_time = stop_after_s is not None and time.perf_counter() - t_call >= stop_after_s
    if done % cfg.checkpoint_every == 0 or done == end or out_of_time:
      mngr.save(done, args=ocp.args.StandardSave(checkpoint_state()), force=True)
    if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
      record(done, host if sync else jax.device_get(metrics))
    if out_of_time:
      end = done
      break
  mngr.wait_until_finished()
  if bar is not None:
    bar.close()
  if end < cfg.steps:
    return Result(params, history, False)
  if not history or history[-1]["step"] != cfg.steps:
    record(cfg.steps, jax.device_get(metrics) if metrics is not None else None)
  params = jax.device_get(params)
  save_final(params)
  return Result(params, history, True)
