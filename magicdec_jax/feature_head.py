"""The EAGLE-style feature head: one decoder layer that reads the target's own hidden states.

At head position t the input is `fc(concat(g_t, embed(token_{t+1})))` where
  * g_t = fuse(concat(rms(f_low_t), rms(f_mid_t), rms(f_high_t))) when the target's features f at t are
    known (committed positions), EAGLE-3's low / middle / high fusion (each feature RMS-normalized without a
    scale first: the raw residual stream's magnitude grows with depth, and the fuse matrix should not have
    to learn that);
  * g_t = h_{t-1}, the head's own output one position back, deeper in a draft (as EAGLE: speculative
    positions have no target features yet).
The layer is the project's `Block` (model.py); its output h_t goes through the head's own RMS norm and the
target's frozen LM head (tied embedding for SmolLM2) to logits predicting token t+2. The head params hold
only fuse, fc, the layer and the norm scale: the embedding and LM head it reads are the target's own.

A draft with a weight copy (`FeatureDraft(head, weights="int8" | "int4" | "bfloat16")`, drafts/feature.py)
reads a copy of every matrix its step multiplies, made once: the head's own (fuse, fc, the layer,
vocab_head) and the target matrices it reads, held in the draft params under "target_head" (the embedding,
which is also a tied target's LM head, and an untied target's LM head where the head has no draft
vocabulary; `target_weights`). Without a draft vocabulary the step's largest read is the target's full
LM head, V x D, once per draft token (SmolLM2: 28M parameters against ~5M in the head), so that copy saves
most. The embedding copy is only gathered (`QuantizedWeight.rows`, as model.embed). The target's
features and its verification still use its own weights, so outputs are unchanged.

Which layers (`default_layers`): {2, L // 2, L - 1} (0-based block outputs). Low (2) carries the token's
identity and local syntax, middle the context, and the last block's output is the state the target's own
LM head reads for token t+1; EAGLE-1 used that top state alone and it is the most informative single
feature for a head trained briefly (30 CPU minutes here), so we keep it rather than EAGLE-3's L - 3.

A smaller draft vocabulary (EAGLE-3's): `init_head(..., vocab=ids)` gives the head its own LM head over
those target token ids only (`vocab_head` [Vd, D], initialised from the target's LM-head rows and trained), so neither
its training nor its step pays for a full-vocabulary matmul (SmolLM2: 28M of the LM head's parameters
against ~5M in the head). In the loop the draft's logits are scattered back into the target's vocabulary
with NEG_INF elsewhere (`to_target_vocab`): tokens outside the vocabulary get draft probability exactly 0
and are never proposed, and verification stays lossless (a draft distribution may have holes).
`frequent_vocab` picks the most frequent ids of the training text.

Saved as DIR/params (orbax) + DIR/feature_head.json (config, layers, vocab, the target's signature; written
last, so a DIR only loads once complete); `load_head(DIR)` is the loader `run.py --draft=feature
--draft_model=DIR` uses. A head built for one target and run with another of the same shapes (a base model's
head on its instruct tune) is still lossless, only slower: `check_target` warns.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.config import ModelConfig
from magicdec_jax.layers import rms_norm
from magicdec_jax.layers.attention import NEG_INF
from magicdec_jax.layers.dense import dense
from magicdec_jax.layers.quant import QuantizedWeight
from magicdec_jax.model import Block, Model, init_params, lm_logits, rotations

HEAD_FILE = "feature_head.json"
PARAMS_DIR = "params"


@dataclasses.dataclass
class FeatureHead:
  """A feature head: its one-layer config (the target's dims), the target layers it reads, its params."""
  config: ModelConfig
  layers: tuple[int, ...]
  params: dict
  name: str = "feature-head"
  vocab: tuple[int, ...] | None = None      # draft vocabulary (sorted target ids); None = the target's
  target: str | None = None                 # target_signature of the model it was built for; None: unknown


def check_vocab(vocab, vocab_size: int) -> tuple[int, ...]:
  """A draft vocabulary as a sorted tuple of distinct target ids in [0, vocab_size); ValueError otherwise."""
  ids = np.asarray(vocab)
  if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"draft vocabulary must be a non-empty 1-D list of token ids, got shape {ids.shape} "
                     f"dtype {ids.dtype}")
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f"draft vocabulary ids must be in [0, {vocab_size}), got {int(ids.min())}..{int(ids.max())}")
  if len(np.unique(ids)) != ids.size:
    raise ValueError("draft vocabulary has repeated ids")
  return tuple(int(i) for i in np.sort(ids))


def frequent_vocab(tokens, size: int, vocab_size: int, always=()) -> tuple[int, ...]:
  """The `size` most frequent ids in `tokens` (any int array; ties to the smaller id) plus `always` (e.g.
  EOS), sorted: a draft vocabulary for init_head."""
  if not isinstance(size, (int, np.integer)) or not 1 <= size <= vocab_size:
    raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {size!r}")
  counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size)[:vocab_size]
  top = np.argsort(-counts, kind="stable")[:size]
  return check_vocab(np.union1d(top, np.asarray(list(always), np.int64)).astype(np.int64), vocab_size)


def default_layers(num_layers: int) -> tuple[int, ...]:
  """Low / middle / high feature layers of an L-layer target (see the module docstring)."""
  return tuple(sorted({min(2, num_layers - 1), num_layers // 2, num_layers - 1}))


def target_signature(target: Model) -> str:
  """A short digest of the target a head is built for: its norm scales (the final norm and every layer's,
  rounded to bfloat16, so the same model from another file format or dtype signs the same; replicated on
  every mesh, so any process can read them). Shapes alone cannot tell a model from its fine-tunes, whose
  features a head did not learn."""
  digest = hashlib.sha256(str(target.config.num_layers).encode())
  for path, x in jax.tree_util.tree_leaves_with_path(target.params):
    name = jax.tree_util.keystr(path)
    if "norm" in name and name.endswith("['scale']"):
      digest.update(name.encode())
      local = x.addressable_data(0) if isinstance(x, jax.Array) else x      # (a host array as it is)
      digest.update(np.asarray(local, np.float32).astype(jnp.bfloat16).tobytes())
  return digest.hexdigest()[:16]


def check_target(head: FeatureHead, target: Model) -> None:
  """Warn when `head` was built for another target than `target` (its signature differs): decoding stays
  lossless, but the head reads features it was not trained on, so acceptance (the speed) drops."""
  if head.target is not None and head.target != (sig := target_signature(target)):
    warnings.warn(f"feature head {head.name!r} was built for a target signed {head.target}, and "
                  f"{target.name!r} signs {sig} (feature_head.target_signature): another model or fine-tune "
                  "of the same shapes; the output is unchanged, acceptance may be low", stacklevel=3)


def head_config(target_cfg: ModelConfig) -> ModelConfig:
  return target_cfg.replace(num_layers=1)


def check_layers(layers, num_layers: int) -> tuple[int, ...]:
  layers = tuple(int(i) for i in layers)
  if not layers or len(set(layers)) != len(layers) or any(not 0 <= i < num_layers for i in layers):
    raise ValueError(f"feature layers must be distinct indices in [0, {num_layers}), got {layers}")
  return layers


def init_head(target: Model, layers=None, seed: int = 0, vocab=None) -> FeatureHead:
  """A random head for `target` (std 0.02 layer weights, fan-in scaled fuse / fc, the target's final norm
  scale as the head's norm), reading `layers` (default_layers if None); with `vocab` (target ids) its own
  LM head over them, initialised from the target's LM-head rows."""
  tcfg = target.config
  vocab = None if vocab is None else check_vocab(vocab, tcfg.vocab_size)
  layers = check_layers(default_layers(tcfg.num_layers) if layers is None else layers, tcfg.num_layers)
  cfg = head_config(tcfg)
  shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))["layers"]
  rng = np.random.default_rng(seed)
  dt, d = cfg.jnp_dtype, cfg.hidden_size

  def leaf(path, x):
    if "scale" in jax.tree_util.keystr(path):
      return jnp.ones(x.shape, x.dtype)
    return jnp.asarray(rng.normal(size=x.shape) * 0.02, x.dtype)

  nf = len(layers)
  params = {
      "fuse": jnp.asarray(rng.normal(size=(nf * d, d)) * (nf * d) ** -0.5, dt),
      "fc": jnp.asarray(rng.normal(size=(2 * d, d)) * (2 * d) ** -0.5, dt),
      "layers": jax.tree_util.tree_map_with_path(leaf, shapes),
      "norm": {"scale": jnp.array(target.params["final_norm"]["scale"], dt)},
  }
  if vocab is not None:
    ids = np.asarray(vocab)
    rows = target.params["embed"][ids] if tcfg.tie_embeddings else target.params["lm_head"][:, ids].T
    params["vocab_head"] = jnp.array(rows, dt)                                     # [Vd, D]
  return FeatureHead(cfg, layers, params, name=f"feature-head{list(layers)}", vocab=vocab,
                     target=target_signature(target))


def check_compatible(head: FeatureHead, target_cfg: ModelConfig):
  """ValueError unless `head` was built for a target of `target_cfg`'s shape and dtype."""
  hc = head.config
  for name in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim"):
    if getattr(hc, name) != getattr(target_cfg, name):
      raise ValueError(f"feature head {name}={getattr(hc, name)} differs from the target's "
                       f"{getattr(target_cfg, name)}: the head was trained for another model")
  if hc.dtype != target_cfg.dtype:
    raise ValueError(f"feature head dtype={hc.dtype} differs from the target's {target_cfg.dtype}: a head "
                     "computes on the target's features in the target's dtype (train it on the target loaded "
                     "in that dtype)")
  check_layers(head.layers, target_cfg.num_layers)
  if head.vocab is not None:
    check_vocab(head.vocab, target_cfg.vocab_size)


# ------------------------------------------------------------------------------------------ the step

def fuse(hparams: dict, feats: jax.Array, eps: float) -> jax.Array:
  """Target features [..., n * D] (concatenated layers) -> g [..., D]."""
  d = hparams["fc"].shape[1]
  n = feats.shape[-1] // d
  parts = feats.reshape(*feats.shape[:-1], n, d)
  normed = rms_norm(parts, jnp.ones((d,), parts.dtype), eps).reshape(feats.shape)
  return dense("...F,FD->...D", normed, hparams["fuse"])


def step(cfg: ModelConfig, hparams: dict, tparams: dict, g: jax.Array, tokens: jax.Array,
         positions: jax.Array, cache_k: jax.Array, cache_v: jax.Array, write_slots, attn_spec):
  """One head pass: g [B, T, D], tokens [B, T] (the token after each position) -> (float32 logits
  [B, T, V], h [B, T, D] (the next depth's g), cache_k, cache_v) on the head's one-layer cache buffers.
  The target's embedding (and LM head) come from `target_weights(hparams, tparams)`."""
  table = target_weights(hparams, tparams)["embed"]
  e = table.rows(tokens, g.dtype) if isinstance(table, QuantizedWeight) else \
      jnp.take(table, tokens, axis=0).astype(g.dtype)
  x = dense("BTF,FD->BTD", jnp.concatenate([g, e], axis=-1), hparams["fc"])
  h, cache_k, cache_v, _ = Block(cfg).apply({"params": hparams["layers"][0]}, x, positions,
                                            rotations(cfg, 0, positions, attn_spec, {}), cache_k, cache_v,
                                            write_slots, attn_spec)
  return head_logits(cfg, hparams, tparams, h), h, cache_k, cache_v


def head_logits(cfg: ModelConfig, hparams: dict, tparams: dict, h: jax.Array) -> jax.Array:
  """h [B, T, D] -> float32 logits over the head's vocabulary: its own LM head [Vd, D] when it has a draft
  vocabulary, else the target's (full vocabulary; a quantized draft's copy of it, `target_weights`)."""
  if "vocab_head" not in hparams:
    return lm_logits(target_weights(hparams, tparams), cfg, h, hparams["norm"]["scale"])
  x = rms_norm(h, hparams["norm"]["scale"], cfg.rms_norm_eps)
  return dense("BTD,VD->BTV", x, hparams["vocab_head"], out_dtype=jnp.float32)   # (or its bf16 training copy)


def target_weights(hparams: dict, tparams: dict) -> dict:
  """The target matrices the head reads ("embed"; "lm_head" where untied): a draft's copy of them in
  hparams["target_head"] (FeatureDraft with `weights`), else the target's own params."""
  return hparams.get("target_head", tparams)


def to_target_vocab(logits: jax.Array, vocab: tuple[int, ...] | None, vocab_size: int) -> jax.Array:
  """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V], NEG_INF outside the vocabulary
  (probability exactly 0 after softmax); identity without a draft vocabulary."""
  if vocab is None:
    return logits
  full = jnp.full(logits.shape[:-1] + (vocab_size,), NEG_INF, logits.dtype)
  return full.at[..., jnp.asarray(vocab, jnp.int32)].set(logits)


# ----------------------------------------------------------------------------------------- save / load

def save_head(head: FeatureHead, directory: str) -> None:
  """params (orbax) into DIR/params, then DIR/feature_head.json (last: DIR loads only once complete)."""
  import orbax.checkpoint as ocp   # imported where used: orbax is slow to import, and only its checkpoints need it
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(os.path.join(directory, PARAMS_DIR), jax.device_get(head.params), force=True)
  ckptr.wait_until_finished()
  tmp = os.path.join(directory, HEAD_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump({"config": json.loads(head.config.to_json()), "layers": list(head.layers),
               "vocab": None if head.vocab is None else list(head.vocab), "target": head.target}, f)
  os.replace(tmp, os.path.join(directory, HEAD_FILE))


def load_head(directory: str) -> FeatureHead:
  """A head written by save_head (or by distill_feature at the end of training)."""
  import orbax.checkpoint as ocp   # where used, as in save_head
  directory = os.path.abspath(directory)
  path = os.path.join(directory, HEAD_FILE)
  if not os.path.isfile(path):
    raise ValueError(f"{directory!r} holds no feature head ({HEAD_FILE} missing; training unfinished?)")
  try:
    with open(path) as f:
      meta = json.load(f)
    cfg = ModelConfig.from_json(json.dumps(meta["config"]))
    layers = tuple(meta["layers"])
    vocab = None if meta.get("vocab") is None else tuple(meta["vocab"])
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise ValueError(f"cannot read the feature head in {directory!r} ({HEAD_FILE}): {type(e).__name__}: {e}") from e
  d, nf = cfg.hidden_size, len(layers)
  abstract = {
      "fuse": jax.ShapeDtypeStruct((nf * d, d), cfg.jnp_dtype),
      "fc": jax.ShapeDtypeStruct((2 * d, d), cfg.jnp_dtype),
      "layers": jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))["layers"],
      "norm": {"scale": jax.ShapeDtypeStruct((d,), cfg.jnp_dtype)},
  }
  if vocab is not None:
    abstract["vocab_head"] = jax.ShapeDtypeStruct((len(vocab), d), cfg.jnp_dtype)
  try:
    params = ocp.StandardCheckpointer().restore(os.path.join(directory, PARAMS_DIR), abstract)
  except (OSError, ValueError) as e:
    raise ValueError(f"cannot restore the feature head's params in {directory!r}: {e}") from e
  got = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_leaves_with_path(abstract)}
  if got != want:                                 # (orbax restores the stored shapes whatever it is asked)
    bad = next(k for k in sorted(want.keys() | got.keys()) if got.get(k) != want.get(k))
    raise ValueError(f"feature head {directory!r}: params{bad} has shape {got.get(bad)}, its {HEAD_FILE} says "
                     f"{want[bad]} (params from another head?)")
  return FeatureHead(cfg, layers, params, name=os.path.basename(directory), vocab=vocab, target=meta.get("target"))
