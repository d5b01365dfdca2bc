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
argmax), and gave the higher held-out greedy acceptance on both models measured
(docs/decisions.md#distill-loss). "kl" matches the whole distribution, which is what speculative *sampling*
accepts (sum min(p, q)): use it for drafts meant for temperature > 0.

Training: one pure jitted step (params, opt_state, tokens) -> (params, opt_state, metrics), run by
trainer.py's resumable loop (AdamW with linear warm-up + cosine decay and global-norm clipping; orbax
checkpoints under OUT/checkpoints every `checkpoint_every` steps, atomic, so a `kill -9` loses at most the
steps since the last one; a rerun resumes from the latest and, the batch of step s being a pure function of
(seed, s), ends where an uninterrupted run ends). With a mesh the batch is split over its "data" axis and
params are replicated (XLA inserts the gradient all-reduce). The final draft is written with
checkpoints.save_orbax into OUT itself (config file last, so OUT only loads once complete): `load_model(OUT)`
gives a Model ready for `ModelDraft(model, sink, window)`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax

from magicdec_jax import checkpoints, drafts
from magicdec_jax.training import trainer
from magicdec_jax.measure.acceptance import windowed_logits
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, full_forward, init_params

LOSSES = ("kl", "ce")


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
  sink: int = drafts.DEFAULT_SINK   # the draft's StreamingLLM cache for held-out acceptance
  window: int = drafts.DEFAULT_WINDOW

  def validate(self):
    trainer.check_settings(self, "distill")
    trainer.check_int("distill", "seq_len", self.seq_len)
    trainer.check_int("distill", "window", self.window)           # (the held-out acceptance's draft)
    trainer.check_int("distill", "sink", self.sink, low=0)
    if self.loss not in LOSSES:
      raise ValueError(f"distill loss must be one of {LOSSES}, got {self.loss!r}")

  def optimizer(self) -> optax.GradientTransformation:
    return trainer.optimizer(self)

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
  return Model(config, params, target.tokenizer, target.chat_template, name=f"draft-{config.num_layers}l",
               template_tokens=target.template_tokens)


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


# ------------------------------------------------------------------------------------------- the step

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

  Returns (the trained draft Model, history: one dict per evaluation with step, heldout acceptance, wall
  seconds of this call, the step's metrics). `stop_after=k` stops after k steps of this call (checkpointing
  first), for tests; the final model is only written when all `cfg.steps` are done. Every check runs before
  anything compiles.
  """
  cfg.validate()
  data = trainer.check_windows(data, cfg.seq_len, target.config.vocab_size, "distill")
  check_pair(target, draft, cfg.seq_len)
  if mesh is not None:
    d = mesh.shape["data"]
    if cfg.batch % d:
      raise ValueError(f"distill batch {cfg.batch} must be a multiple of the mesh's data axis ({d})")
  settings = dict(cfg.settings(), draft_config=json.loads(draft.config.to_json()),
                  target=target.name, target_config=json.loads(target.config.to_json()),
                  num_windows=int(data.shape[0]), data=trainer.data_digest(data))
  trainer.prepare_out_dir(out_dir, settings)
  out_dir = os.path.abspath(out_dir)

  opt = cfg.optimizer()
  tparams = _replicate(target.params, mesh)
  measure = None if eval_windows is None else HeldoutAcceptance(target, eval_windows, cfg.sink, cfg.window)

  def step_fn(params, opt_state, tokens):
    return train_step(params, opt_state, tparams, tokens, dcfg=draft.config, tcfg=target.config,
                      kind=cfg.loss, opt=opt)

  def evaluate(params):
    acc = measure(params, draft.config)
    return {"acceptance": acc}, f"held-out greedy acceptance {acc:.4f}"

  def postfix(m, steps_per_s):
    return dict(loss=f"{float(m['loss']):.4f}", agree=f"{float(m['agree']):.3f}",
                tok_s=f"{steps_per_s * cfg.batch * cfg.seq_len:.0f}")

  def final(params):
    return dataclasses.replace(draft, params=params, name=os.path.basename(out_dir))

  res = trainer.train(draft.params, step_fn, opt, data, cfg, out_dir, name="distill",
                      evaluate=None if measure is None else evaluate,
                      save_final=lambda p: save_final(final(p), out_dir), postfix=postfix,
                      put_batch=lambda x: _shard_batch(x, mesh), place=lambda tree: _replicate(tree, mesh),
                      progress=progress, stop_after=stop_after, log=log)
  return (final(res.params) if res.done else dataclasses.replace(draft, params=res.params)), res.history


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
