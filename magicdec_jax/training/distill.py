"""Draft distillation: train a standalone draft model to predict the target's next-token distributions.

    draft = distill.init_draft(target, layers=8)               # the target's first 8 layers (or a ModelConfig)
    data = distill_data.load_windows("out.jsonl", target.tokenizer, V, seq_len=256)
    model, history = distill.distill(target, draft, data, "draft_dir", DistillConfig(steps=500))
    md.generate(target, prompts, draft=md.ModelDraft(md.load_model("draft_dir"), sink=4, window=256))

Losses (`DistillConfig.loss`), both against the target run inside the jitted train step (stop_gradient):
* "ce" (default): cross-entropy on the target's own greedy token (argmax of its logits) at every position,
  i.e. on the tokens the target would generate there.
* "kl": forward KL(p_target || q_draft) over the whole vocabulary at every position.
Why "ce" is the default: it optimises exactly what greedy speculation accepts (draft argmax == target
argmax) and gave the higher held-out greedy acceptance on both models we measured, same steps, data and
schedule: SmolLM2-135M -> 8-layer draft, 12 steps: 0.249 (ce) vs 0.185 (kl), from 0.060
(benchmarks/results/distill_smollm2_losscmp12_*_cpu_2026-11-23.json); tiny random 3 -> 1 layer, 120 steps:
0.822 vs 0.802 (distill_loss_tiny_cpu_2026-11-23.json). "kl" matches the whole distribution (held-out KL
0.009 vs 1.62 on the tiny pair), which is what speculative *sampling* accepts (sum min(p, q)): use it for
drafts meant for temperature > 0.

Training: optax AdamW with linear warm-up + cosine decay and global-norm clipping; one pure jitted step
(params, opt_state, tokens) -> (params, opt_state, metrics). With a mesh the batch is split over its
"data" axis and params are replicated (XLA inserts the gradient all-reduce).

Checkpoints: an orbax CheckpointManager under OUT/checkpoints (params, optimizer state, step) every
`checkpoint_every` steps; orbax writes each step to a temporary directory and renames it when complete,
so a `kill -9` leaves either the previous or the new checkpoint. A rerun resumes from the latest; since the
batch of step s is a pure function of (seed, s) (distill_data.batch_indices) it ends where an uninterrupted
run ends. The final draft is written with checkpoints.save_orbax into OUT itself (config file last, so OUT
only loads once complete): `load_model(OUT)` gives a Model ready for `ModelDraft(model, sink, window)`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from tqdm import tqdm

from magicdec_jax import checkpoints, drafts
from magicdec_jax.training import distill_data
from magicdec_jax.tuning.acceptance import windowed_logits
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, full_forward, init_params

LOSSES = ("kl", "ce")
CKPT_DIR = "checkpoints"
SETTINGS_FILE = "distill_settings.json"


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  steps: int = 1000
  lr: float = 3e-4
  warmup_steps: int = 50
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  batch: int = 8
  seq_len: int = 256
  loss: str = "ce"
  seed: int = 0
  checkpoint_every: int = 100
  eval_every: int = 0          # 0: evaluate only at the start and the end
  sink: int = 4                # the draft's StreamingLLM cache for held-out acceptance
  window: int = 256

  def validate(self):
    for name in ("steps", "batch", "seq_len", "checkpoint_every"):
      v = getattr(self, name)
      if not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"distill {name} must be an integer >= 1, got {v!r}")
    if self.warmup_steps < 0 or self.eval_every < 0:
      raise ValueError("distill warmup_steps and eval_every must be >= 0")
    if not (self.lr > 0 and np.isfinite(self.lr)):
      raise ValueError(f"distill lr must be a positive number, got {self.lr!r}")
    if self.loss not in LOSSES:
      raise ValueError(f"distill loss must be one of {LOSSES}, got {self.loss!r}")
    if self.clip_norm <= 0 or not 0 <= self.final_lr_fraction <= 1 or self.weight_decay < 0:
      raise ValueError("distill clip_norm must be > 0, final_lr_fraction in [0, 1], weight_decay >= 0")

  def settings(self) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints (eval cadence excluded)."""
    d = dataclasses.asdict(self)
    for k in ("eval_every", "checkpoint_every", "sink", "window"):
      d.pop(k)
    return d


def init_draft(target: Model, layers: int | None = None, config: ModelConfig | None = None,
               seed: int = 0) -> Model:
  """The draft to train: the target's first `layers` layers, or a random model of `config` (the target's
  tokenizer, vocabulary and chat template either way)."""
  if (layers is None) == (config is None):
    raise ValueError("init_draft needs exactly one of layers= or config=")
  if layers is not None:
    return drafts.truncate_layers(target, layers)
  params = random_params(config, seed)
  return Model(config, params, target.tokenizer, target.chat_template, name=f"draft-{config.num_layers}l")


def random_params(cfg: ModelConfig, seed: int = 0, scale: float = 0.02) -> dict:
  """Random params in init_params' layout (its shapes via jax.eval_shape, so nothing compiles): normal
  weights of std `scale`, norm scales 1."""
  shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def leaf(path, x):
    if "scale" in jax.tree_util.keystr(path):
      return jnp.ones(x.shape, x.dtype)
    return jnp.asarray(rng.normal(size=x.shape) * scale, x.dtype)

  return jax.tree_util.tree_map_with_path(leaf, shapes)


def _num_params(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def check_pair(target: Model, draft: Model, seq_len: int):
  """ValueError unless `draft` can be distilled from `target` (before anything compiles)."""
  tc, dc = target.config, draft.config
  if dc.vocab_size != tc.vocab_size:
    raise ValueError(f"draft vocabulary size {dc.vocab_size} differs from the target's {tc.vocab_size}; a "
                     "draft must share the target's tokenizer")
  nd, nt = _num_params(draft.params), _num_params(target.params)
  if nd > nt or dc.num_layers > tc.num_layers:
    raise ValueError(f"the draft ({dc.num_layers} layers, {nd:,} params) is larger than the target "
                     f"({tc.num_layers} layers, {nt:,} params)")
  if seq_len > min(tc.max_position_embeddings, dc.max_position_embeddings):
    raise ValueError(f"seq_len={seq_len} exceeds the models' context "
                     f"({min(tc.max_position_embeddings, dc.max_position_embeddings)})")


def prepare_out_dir(out_dir: str, settings: dict):
  """Create OUT (or check it); refuse one holding checkpoints of different settings. ValueError if not
  writable. Nothing is written but the settings file."""
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
  if os.path.isfile(path):
    with open(path) as f:
      old = json.load(f)
    if old != settings:
      diff = {k: (old.get(k), settings.get(k)) for k in set(old) | set(settings) if old.get(k) != settings.get(k)}
      raise ValueError(f"distill output {out_dir!r} holds a run with other settings {diff} (old, new); "
                       "use another directory or delete it")
    return
  os.makedirs(out_dir, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(settings, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


# ------------------------------------------------------------------------------------------- the step

@functools.lru_cache(maxsize=16)
def make_optimizer(cfg: DistillConfig) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW on a warm-up + cosine schedule. Cached per config: the optimizer is
  a static argument of the jitted step, so the same object means the same executable."""
  warmup = min(cfg.warmup_steps, max(cfg.steps - 1, 0))
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, warmup, max(cfg.steps, warmup + 1),
                                             end_value=cfg.lr * cfg.final_lr_fraction)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(sched, weight_decay=cfg.weight_decay))


def loss_terms(draft_logits: jax.Array, target_logits: jax.Array, kind: str):
  """[B, T, V] each -> (mean loss, mean KL(p_t || q_d), greedy agreement) over all positions."""
  logq = jax.nn.log_softmax(draft_logits.astype(jnp.float32), -1)
  logp = jax.nn.log_softmax(target_logits.astype(jnp.float32), -1)
  kl = jnp.sum(jnp.exp(logp) * (logp - logq), -1).mean()
  labels = jnp.argmax(target_logits, -1)
  agree = (jnp.argmax(draft_logits, -1) == labels).mean()
  if kind == "kl":
    return kl, kl, agree
  ce = -jnp.take_along_axis(logq, labels[..., None], -1).mean()
  return ce, kl, agree


@functools.partial(jax.jit, static_argnames=("dcfg", "tcfg", "kind", "opt"), donate_argnums=(0, 1))
def train_step(dparams, opt_state, tparams, tokens, *, dcfg: ModelConfig, tcfg: ModelConfig, kind: str,
               opt: optax.GradientTransformation):
  """One AdamW step on tokens [B, T]; the target's logits are the (stop_gradient) teacher."""
  teacher = jax.lax.stop_gradient(full_forward(tparams, tcfg, tokens))

  def loss_fn(p):
    loss, kl, agree = loss_terms(full_forward(p, dcfg, tokens), teacher, kind)
    return loss, (kl, agree)

  (loss, (kl, agree)), grads = jax.value_and_grad(loss_fn, has_aux=True)(dparams)
  updates, opt_state = opt.update(grads, opt_state, dparams)
  dparams = optax.apply_updates(dparams, updates)
  return dparams, opt_state, {"loss": loss, "kl": kl, "agree": agree, "grad_norm": optax.tree.norm(grads)}


# ------------------------------------------------------------------------------------------ evaluation

def heldout_kl(target: Model, draft: Model, windows) -> float:
  """Mean KL(target || draft) in float64 over every position of held-out token windows (full attention)."""
  tot, n = 0.0, 0
  for w in windows:
    arr = jnp.asarray([w], jnp.int32)
    p = np.asarray(full_forward(target.params, target.config, arr), np.float64)[0]
    q = np.asarray(full_forward(draft.params, draft.config, arr), np.float64)[0]
    logp = p - p.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    logq = q - q.max(-1, keepdims=True)
    logq -= np.log(np.exp(logq).sum(-1, keepdims=True))
    tot += float((np.exp(logp) * (logp - logq)).sum())
    n += logp.shape[0]
  return tot / n


class HeldoutAcceptance:
  """Greedy per-token acceptance of a draft with a StreamingLLM cache (sink + window) against the target,
  teacher-forced on held-out windows: the share of positions where the draft's argmax is the target's
  (what acceptance.profile measures with W=1, same positions: from sink + window on when the window really
  cuts). The target's argmaxes are computed once; each call runs only the draft."""

  def __init__(self, target: Model, windows, sink: int, window: int):
    self.windows = [list(map(int, w)) for w in windows]
    self.sink, self.window = sink, window
    self.starts = [sink + window if len(w) > sink + window + 16 else 0 for w in self.windows]
    self.labels = [np.argmax(np.asarray(full_forward(target.params, target.config,
                                                     jnp.asarray([w], jnp.int32)))[0], -1)[s:len(w) - 1]
                   for w, s in zip(self.windows, self.starts)]

  def __call__(self, draft_params, draft_cfg: ModelConfig) -> float:
    hits, n = 0, 0
    for w, s, lab in zip(self.windows, self.starts, self.labels):
      dl = windowed_logits(draft_params, draft_cfg, jnp.asarray([w], jnp.int32), self.sink, self.window)
      pred = np.argmax(np.asarray(dl)[0], -1)[s:len(w) - 1]
      hits += int((pred == lab).sum())
      n += lab.size
    return hits / n


def heldout_acceptance(target: Model, draft: Model, windows, sink: int, window: int) -> float:
  """One-off HeldoutAcceptance(target, windows, sink, window)(draft)."""
  return HeldoutAcceptance(target, windows, sink, window)(draft.params, draft.config)


# ------------------------------------------------------------------------------------------ the loop

def _replicate(tree, mesh):
  if mesh is None:
    return tree
  return jax.device_put(tree, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def _shard_batch(x, mesh):
  if mesh is None:
    return jnp.asarray(x)
  return jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None)))


def distill(target: Model, draft: Model, data: np.ndarray, out_dir: str, cfg: DistillConfig = DistillConfig(),
            *, eval_windows=None, mesh=None, progress: bool = True, stop_after: int | None = None,
            log=None) -> tuple[Model, list[dict]]:
  """Train `draft` on `data` (int [N, seq_len] windows) against `target`; resume from OUT's checkpoints.

  Returns (the trained draft Model, history: one dict per evaluation with step, heldout acceptance, loss,
  wall seconds). `stop_after=k` stops after k steps of this call (checkpointing first), for tests; the
  final model is only written when all `cfg.steps` are done. Every check runs before anything compiles.
  """
  cfg.validate()
  data = np.asarray(data)
  if data.ndim != 2 or data.shape[0] < 1 or data.shape[1] != cfg.seq_len:
    raise ValueError(f"distill data must be [N >= 1, seq_len={cfg.seq_len}] token windows, got {data.shape}")
  if data.min() < 0 or data.max() >= target.config.vocab_size:
    raise ValueError(f"distill data has token ids outside [0, {target.config.vocab_size})")
  check_pair(target, draft, cfg.seq_len)
  if mesh is not None:
    d = mesh.shape["data"]
    if cfg.batch % d:
      raise ValueError(f"distill batch {cfg.batch} must be a multiple of the mesh's data axis ({d})")
  settings = dict(cfg.settings(), draft_config=json.loads(draft.config.to_json()),
                  target_vocab=target.config.vocab_size, num_windows=int(data.shape[0]))
  prepare_out_dir(out_dir, settings)
  out_dir = os.path.abspath(out_dir)
  log = log or (lambda m: print(f"[distill] {m}", file=sys.stderr, flush=True) if progress else None)

  opt = make_optimizer(cfg)
  params = _replicate(jax.tree.map(jnp.copy, draft.params), mesh)   # own buffers: the step donates them
  tparams = _replicate(target.params, mesh)
  opt_state = opt.init(params)
  mngr = ocp.CheckpointManager(os.path.join(out_dir, CKPT_DIR),
                               options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start = mngr.latest_step() or 0
  hist_path = os.path.join(out_dir, "distill_history.json")
  history: list[dict] = []
  if start:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params, "opt_state": opt_state})
    restored = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
    params, opt_state = restored["params"], restored["opt_state"]
    if os.path.isfile(hist_path):
      with open(hist_path) as f:
        history = [h for h in json.load(f) if h["step"] <= start]
    log(f"resumed from the checkpoint at step {start}")

  def as_model(p):
    return dataclasses.replace(draft, params=p)

  measure = None if eval_windows is None else HeldoutAcceptance(target, eval_windows, cfg.sink, cfg.window)

  def evaluate(step, metrics=None):
    if measure is None:
      return
    rec = {"step": step, "acceptance": measure(params, draft.config), "wall_s": time.perf_counter() - t0}
    if metrics:
      rec.update({k: float(v) for k, v in metrics.items()})
    history.append(rec)
    log(f"step {step}: held-out greedy acceptance {rec['acceptance']:.4f}")
    tmp = hist_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(history, f, indent=1)
    os.replace(tmp, hist_path)

  t0 = time.perf_counter()
  if start == 0 and not history:
    evaluate(0)
  end = cfg.steps if stop_after is None else min(cfg.steps, start + stop_after)
  bar = None
  if progress and end > start:
    bar = tqdm(total=cfg.steps, initial=start, desc="distill", unit="step", dynamic_ncols=True,
               file=sys.stderr)
  metrics, tokens_done, t_run = None, 0, time.perf_counter()
  step_fn = functools.partial(train_step, dcfg=draft.config, tcfg=target.config, kind=cfg.loss, opt=opt)
  for step in range(start, end):
    batch = data[distill_data.batch_indices(data.shape[0], cfg.batch, step, cfg.seed)]
    params, opt_state, metrics = step_fn(params, opt_state, tparams, _shard_batch(batch, mesh))
    done = step + 1
    if done == start + 1:
      jax.block_until_ready(metrics)
      t_run = time.perf_counter()       # tokens/s from the second step on (the first one compiles)
    else:
      tokens_done += batch.size
    if bar is not None:
      m = jax.device_get(metrics)
      rate = tokens_done / max(time.perf_counter() - t_run, 1e-9)
      bar.set_postfix(loss=f"{float(m['loss']):.4f}", agree=f"{float(m['agree']):.3f}", tok_s=f"{rate:.0f}")
      bar.update(1)
    if done % cfg.checkpoint_every == 0 or done == end:
      mngr.save(done, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}), force=True)
    if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
      evaluate(done, jax.device_get(metrics))
  mngr.wait_until_finished()
  if bar is not None:
    bar.close()
  if end < cfg.steps:
    return as_model(params), history
  if not history or history[-1]["step"] != cfg.steps:
    evaluate(cfg.steps, jax.device_get(metrics) if metrics is not None else None)
  model = dataclasses.replace(as_model(jax.device_get(params)), name=os.path.basename(out_dir))
  save_final(model, out_dir)
  return model, history


def save_final(model: Model, out_dir: str):
  """checkpoints.save_orbax into OUT/.final.tmp, then move each piece into OUT, the config file last."""
  tmp = os.path.join(out_dir, ".final.tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  checkpoints.save_orbax(model, tmp)
  cfg_file = os.path.join(out_dir, checkpoints.CONFIG_FILE)
  if os.path.exists(cfg_file):
    os.remove(cfg_file)
  for name in sorted(os.listdir(tmp), key=lambda n: n == checkpoints.CONFIG_FILE):
    dst = os.path.join(out_dir, name)
    if os.path.isdir(dst):
      shutil.rmtree(dst)
    os.replace(os.path.join(tmp, name), dst)
  os.rmdir(tmp)
