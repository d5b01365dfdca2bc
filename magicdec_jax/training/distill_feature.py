"""Training a feature head (feature_head.py) against its frozen target.

    head = feature_head.init_head(target)                        # reads default_layers(L)
    data = distill_data.load_windows("text.txt", target.tokenizer, V, seq_len=256)
    head, history = distill_feature.train(target, head, data, "head_dir", FeatureDistillConfig(steps=300))
    md.generate(target, prompts, draft=md.FeatureDraft(feature_head.load_head("head_dir"), 4, 256))

The jitted step runs the target once over the batch (its features at the head's layers and its logits,
stop_gradient: the target is frozen) and the head `ttt` times, EAGLE-3's "training-time test": unroll step
0 reads the target's true features at every position; step k reads the head's own step-(k-1) output one
position back, and its queries see true-feature keys up to t-k plus the unrolled keys of steps 1..k on
their own speculative chain, exactly what the draft's tree node at depth k sees in the loop (ring up to
L-2, then its ancestors in the scratch slots). Every step is trained on the target's distribution at t+1
(soft cross-entropy -sum p log q over the vocabulary), weighted decay^k (0.8), positions t >= k. The same
sink + window mask as the draft's ring is applied throughout. A head with a draft vocabulary is trained
against the target's distribution renormalised over that vocabulary (its `vocab_head` trains too); its
agreement and held-out acceptance compare the target id of its argmax with the target's full argmax.

Optimizer, schedule, checkpoints and resume are trainer.py's (as for distill.py): AdamW + warm-up /
cosine, an orbax CheckpointManager under OUT/checkpoints (atomic), the batch of step s a pure function of
(seed, s), so a run cut into chunks (`stop_after` steps or `stop_after_s` seconds per call) ends where one
uninterrupted run ends; the history's `train_s` (training seconds, compilation excluded) counts over every
call. The finished head is written with feature_head.save_head into OUT.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from magicdec_jax import compile as compiling
from magicdec_jax import feature_head
from magicdec_jax.drafts import DEFAULT_SINK, DEFAULT_WINDOW
from magicdec_jax.training import trainer
from magicdec_jax.cache import KVCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.feature_head import FeatureHead
from magicdec_jax.layers.attention import DenseMask, PrefixTree
from magicdec_jax.layers.dense import narrow_weights
from magicdec_jax.model import Model, forward, lm_logits

COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class FeatureDistillConfig:
  steps: int = 300
  lr: float = 1e-3
  warmup_steps: int = 20
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  batch: int = 4
  seq_len: int = 256
  ttt: int = 3                 # training-time-test unroll steps (1 = plain teacher forcing)
  decay: float = 0.8           # step k's loss weight decay**k
  seed: int = 0
  checkpoint_every: int = 20
  eval_every: int = 0          # 0: evaluate only at the start and the end
  sink: int = DEFAULT_SINK     # the head's StreamingLLM ring (training mask and held-out evaluation)
  window: int = DEFAULT_WINDOW
  compute: str = "float32"     # "bfloat16": target pass and head matmuls on bfloat16 copies (f32 master)

  def validate(self):
    what = "feature distill"
    trainer.check_settings(self, what)
    for name in ("ttt", "window"):
      trainer.check_int(what, name, getattr(self, name))
    if not isinstance(self.seq_len, (int, np.integer)) or self.seq_len < self.ttt + 2:
      raise ValueError(f"{what} seq_len must be an integer >= ttt + 2 = {self.ttt + 2}, got {self.seq_len!r}")
    trainer.check_int(what, "sink", self.sink, low=0)
    if self.compute not in COMPUTE_DTYPES:
      raise ValueError(f"{what} compute must be one of {COMPUTE_DTYPES}, got {self.compute!r}")
    if not 0 < self.decay <= 1:
      raise ValueError(f"{what} decay must be in (0, 1], got {self.decay!r}")

  def optimizer(self) -> optax.GradientTransformation:
    return trainer.optimizer(self)

  def settings(self) -> dict:
    d = dataclasses.asdict(self)
    for k in ("eval_every", "checkpoint_every"):
      d.pop(k)
    return d


# ------------------------------------------------------------------------------------------ the model

def target_outputs(tparams, tcfg: ModelConfig, tokens: jax.Array, layers: tuple[int, ...],
                   vocab: tuple[int, ...] | None = None):
  """A plain causal target pass over [B, T] -> (float32 logits [B, T, V], features [B, T, n * D]).

  With a draft `vocab` the logits are over those ids only ([B, T, len(vocab)]): the LM head multiplies
  just their rows. That is all a head with a draft vocabulary trains on, and at SmolLM2's 49152 ids the
  full LM head (and its [B, T, V] float32 output) measured most of a training step on a 2-core CPU."""
  b, t = tokens.shape
  last = tcfg.num_layers - 1
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  spec = PrefixTree(jnp.zeros((b,), jnp.int32), jnp.tril(jnp.ones((t, t), bool)))
  _, _, feats = forward(tparams, tcfg, tokens, pos, KVCache.zeros(tcfg, b, t), pos, spec,
                        compute_logits=False, feature_layers=tuple(layers) + (last,))
  d = tcfg.hidden_size
  feats, top = feats[..., :-d], feats[..., -d:]                   # the head's features; the last block's
  if vocab is None:
    return lm_logits(tparams, tcfg, top, tparams["final_norm"]["scale"]), feats
  ids = jnp.asarray(vocab, jnp.int32)
  rows = tparams["embed"][ids] if tcfg.tie_embeddings else tparams["lm_head"][:, ids].T   # [Vd, D]
  return lm_logits({"embed": rows}, tcfg.replace(tie_embeddings=True), top,
                   tparams["final_norm"]["scale"]), feats


def unroll_mask(t: int, steps: int, k: int, sink: int, window: int) -> np.ndarray:
  """[t, steps * t] visibility of unroll step k's queries: slot j * t + s holds step j's key at position s.
  True keys (j = 0) at s <= q - k under the sink + window rule; step j's key at s = q - k + j, 1 <= j <= k."""
  q = np.arange(t)[:, None]
  j, s = np.divmod(np.arange(steps * t)[None, :], t)
  true = (j == 0) & (s <= q - k) & ((s < sink) | (s > q - window))
  spec = (j >= 1) & (j <= k) & (s == q - k + j)
  return true | spec


def unroll(hparams, cfg: ModelConfig, tparams, feats: jax.Array, tokens: jax.Array, steps: int, sink: int,
           window: int) -> list[jax.Array]:
  """The head's `steps` unrolled passes over positions 0..T-2 -> per step float32 logits [B, T-1, V]
  (position t predicts token t+2)."""
  b, t = tokens.shape
  t1 = t - 1
  pos = jnp.broadcast_to(jnp.arange(t1, dtype=jnp.int32), (b, t1))
  cache = KVCache.zeros(cfg, b, steps * t1)
  ck, cv = cache.k[0], cache.v[0]
  g = feature_head.fuse(hparams, feats[:, :t1], cfg.rms_norm_eps)
  out = []
  for k in range(steps):
    mask = jnp.broadcast_to(jnp.asarray(unroll_mask(t1, steps, k, sink, window)), (b, t1, steps * t1))
    logits, h, ck, cv = feature_head.step(cfg, hparams, tparams, g, tokens[:, 1:], pos, ck, cv,
                                          k * t1 + pos, DenseMask(mask))
    out.append(logits)
    g = jnp.concatenate([jnp.zeros_like(h[:, :1]), h[:, :-1]], axis=1)     # g_t = h_{t-1}
  return out


def unroll_terms(draft_logits: list[jax.Array], target_logits: jax.Array, decay: float):
  """-> (weighted soft-CE loss, per-step soft CE [K], per-step greedy agreement [K]) over valid positions.
  `target_logits` are over the draft's vocabulary (target_outputs with the same vocab): with a draft
  vocabulary the target's distribution is renormalised over it, and agreement (a training metric) is
  with the target's argmax within it; held-out acceptance compares with the target's full argmax."""
  tl = target_logits[:, 1:]
  label = jnp.argmax(tl, -1)
  p = jax.nn.softmax(tl.astype(jnp.float32), -1)                           # the target at t + 1
  t1 = p.shape[1]
  loss, ces, agrees, wsum = 0.0, [], [], 0.0
  for k, lg in enumerate(draft_logits):
    valid = (jnp.arange(t1) >= k)[None, :]
    n = valid.sum() * lg.shape[0]
    ce = -(jnp.sum(p * jax.nn.log_softmax(lg, -1), -1) * valid).sum() / n
    agree = ((jnp.argmax(lg, -1) == label) & valid).sum() / n
    loss, wsum = loss + decay ** k * ce, wsum + decay ** k
    ces.append(ce)
    agrees.append(agree)
  return loss / wsum, jnp.stack(ces), jnp.stack(agrees)


def to_target_ids(draft_ids: jax.Array, ids: jax.Array | None) -> jax.Array:
  """Argmax indices over the draft vocabulary -> target token ids (identity without one)."""
  return draft_ids if ids is None else jnp.take(ids, draft_ids)


@functools.partial(jax.jit, static_argnames=("cfg", "tcfg", "layers", "fcfg", "opt", "vocab"),
                   donate_argnums=(0, 1))
def train_step(hparams, opt_state, tparams, tokens, *, cfg: ModelConfig, tcfg: ModelConfig,
               layers: tuple[int, ...], fcfg: FeatureDistillConfig, opt: optax.GradientTransformation,
               vocab: tuple[int, ...] | None = None):
  """One AdamW step of the head on tokens [B, T] (the target run inside, frozen). `tparams` are the
  target's params in the compute precision (train() narrows them once); the head's float32 params are
  cast to it inside the loss, so the gradient and the update stay float32."""
  tlogits, feats = jax.lax.stop_gradient(target_outputs(tparams, tcfg, tokens, layers, vocab))

  def loss_fn(hp):
    hc = hp if fcfg.compute == "float32" else narrow_weights(hp, fcfg.compute)
    outs = unroll(hc, cfg, tparams, feats, tokens, fcfg.ttt, fcfg.sink, fcfg.window)
    loss, ce, agree = unroll_terms(outs, tlogits, fcfg.decay)
    return loss, (ce, agree)

  (loss, (ce, agree)), grads = jax.value_and_grad(loss_fn, has_aux=True)(hparams)
  updates, opt_state = opt.update(grads, opt_state, hparams)
  hparams = optax.apply_updates(hparams, updates)
  return hparams, opt_state, {"loss": loss, "ce": ce, "agree": agree, "grad_norm": optax.tree.norm(grads)}


@functools.partial(jax.jit, static_argnames=("cfg", "tcfg", "layers", "steps", "sink", "window", "vocab"))
def _eval_window(hparams, tparams, tokens, *, cfg, tcfg, layers, steps, sink, window, vocab=None):
  tlogits, feats = target_outputs(tparams, tcfg, tokens, layers)
  outs = unroll(hparams, cfg, tparams, feats, tokens, steps, sink, window)
  label = jnp.argmax(tlogits[:, 1:], -1)
  ids = None if vocab is None else jnp.asarray(vocab, jnp.int32)
  return jnp.stack([to_target_ids(jnp.argmax(o, -1), ids) == label for o in outs], 1)   # [B, K, T-1]


def heldout_acceptance(head: FeatureHead, target: Model, windows, sink: int, window: int,
                       steps: int = 3) -> list[float]:
  """Teacher-forced greedy acceptance of draft positions 1..steps on held-out token windows: the share of
  positions t where the head's argmax (at depth k, from true features up to t - k) is the target's argmax
  for token t + 2. Positions from sink + window on where the window really cuts (as distill.py)."""
  hits, n = np.zeros(steps), 0
  for w in windows:
    w = [int(x) for x in w]
    start = sink + window if len(w) > sink + window + 16 else 0
    ok = np.asarray(_eval_window(head.params, target.params, jnp.asarray([w], jnp.int32), cfg=head.config,
                                 tcfg=target.config, layers=tuple(head.layers), steps=steps, sink=sink,
                                 window=window, vocab=head.vocab))[0][:, start:]
    hits += ok.sum(-1)
    n += ok.shape[1]
  return (hits / n).tolist()


# ------------------------------------------------------------------------------------------ the loop

def train(target: Model, head: FeatureHead, data: np.ndarray, out_dir: str,
          cfg: FeatureDistillConfig = FeatureDistillConfig(), *, eval_windows=None, progress: bool = True,
          stop_after: int | None = None, stop_after_s: float | None = None, log=None
          ) -> tuple[FeatureHead, list[dict]]:
  """Train `head` on `data` (int [N, seq_len] windows) against `target`; resume from OUT's checkpoints.

  Returns (the head, history: one dict per evaluation: step, acceptance per draft depth, train seconds so
  far over every call, the step's metrics). `stop_after` steps / `stop_after_s` seconds end this call early
  (checkpointing first); the head is written into OUT only when all `cfg.steps` are done.
  """
  cfg.validate()
  data = trainer.check_windows(data, cfg.seq_len, target.config.vocab_size, "feature distill")
  feature_head.check_compatible(head, target.config)
  feature_head.check_target(head, target)
  settings = dict(cfg.settings(), kind="feature_head", layers=list(head.layers),
                  draft_vocab=None if head.vocab is None else trainer.data_digest(head.vocab),
                  target=json.loads(target.config.to_json()), target_name=target.name,
                  num_windows=int(data.shape[0]), data=trainer.data_digest(data))
  trainer.prepare_out_dir(out_dir, settings)
  out_dir = os.path.abspath(out_dir)

  compiling.ensure_persistent_cache()     # later chunks of a run reuse the step's executable
  opt = cfg.optimizer()
  tparams = target.params if cfg.compute == "float32" else narrow_weights(target.params, cfg.compute)

  def step_fn(params, opt_state, tokens):
    return train_step(params, opt_state, tparams, tokens, cfg=head.config, tcfg=target.config,
                      layers=tuple(head.layers), fcfg=cfg, opt=opt, vocab=head.vocab)

  def evaluate(params):
    acc = heldout_acceptance(dataclasses.replace(head, params=params), target, eval_windows, cfg.sink,
                             cfg.window, cfg.ttt)
    return {"acceptance": acc}, f"held-out teacher-forced greedy acceptance by depth {[round(a, 4) for a in acc]}"

  def postfix(m, steps_per_s):
    return dict(loss=f"{float(m['loss']):.3f}", agree0=f"{float(m['agree'][0]):.3f}")

  def final(params):
    return dataclasses.replace(head, params=params, name=os.path.basename(out_dir),
                               target=feature_head.target_signature(target))

  res = trainer.train(head.params, step_fn, opt, data, cfg, out_dir, name="distill-feature",
                      evaluate=None if eval_windows is None else evaluate,
                      save_final=lambda p: feature_head.save_head(final(p), out_dir), postfix=postfix,
                      clock="train_s", progress=progress, stop_after=stop_after, stop_after_s=stop_after_s,
                      log=log)
  return (final(res.params) if res.done else dataclasses.replace(head, params=res.params)), res.history
