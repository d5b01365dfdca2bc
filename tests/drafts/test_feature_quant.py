"""FeatureDraft(head, weights="int8" | "int4"): the feature head drafting on a quantized copy.

The copy holds the head's matrices and the target matrices its step reads (embedding; the LM head where
the head has no draft vocabulary) under "target_head". Greedy output is token-exact against plain
autoregressive decoding of the float32 target (the target verifies with its own weights), chains and
trees, with and without a draft vocabulary, on a head that passes the next token's embedding through so
acceptance lies strictly inside (0, 1). The head's step on the copy is checked against float64 numpy on
matrices dequantized here from the stored integers and scales (not with the code's own dequantize), for a
tied and an untied target; the step is given no target params, so it cannot read the target's own.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from magicdec_jax import feature_head
from magicdec_jax.cli import draft_flags, modes as cli_modes
from magicdec_jax.drafts import FeatureDraft
from magicdec_jax.generation import generate
from magicdec_jax.layers.attention import DenseMask
from magicdec_jax.layers.quant import QuantizedWeight
from magicdec_jax.model import Model
from magicdec_jax.sharding.planner import plan_memory
from magicdec_jax.trees import Tree
from magicdec_jax.tuning import costmodel

from conftest import random_prompts, tiny_model

NEW = 24
LENGTHS = (9, 16, 12, 14, 10)
VOCAB = tuple(range(0, 64, 4)) + tuple(range(1, 64, 2))      # 48 of the 64 ids
TREE = Tree.from_children_counts([3, 2, 1, 0, 2, 1])
# the step against float64 numpy on the dequantized matrices, as a fraction of the largest value: int8 runs
# W8A8 on a CPU (activations quantized per token too: ~1.3% measured), int4 a bfloat16 dot (~0.3%)
TOL = {"int8": 0.025, "int4": 0.01}


def target(tied: bool = False) -> Model:
  t = tiny_model(0, attn_scale=10.0)
  if not tied:
    return t
  params = {k: v for k, v in t.params.items() if k != "lm_head"}
  return dataclasses.replace(t, config=t.config.replace(tie_embeddings=True), params=params, name=t.name + "-tied")


def passing_head(t: Model, vocab=None) -> feature_head.FeatureHead:
  """A random head whose fc also passes the next token's embedding through (h ~ embed(token t+1)): on this
  target its proposals are often right, so both accept and reject paths run."""
  head = feature_head.init_head(t, seed=1, vocab=vocab)
  d = t.config.hidden_size
  fc = np.asarray(head.params["fc"]) * 0.05
  fc[d:] += np.eye(d)
  return dataclasses.replace(head, params=dict(head.params, fc=jnp.asarray(fc, jnp.float32)))


@functools.lru_cache(maxsize=None)
def reference():
  prompts = random_prompts(LENGTHS, 64, seed=11)
  return prompts, generate(target(), prompts, max_new_tokens=NEW).tokens


@pytest.mark.parametrize("weights,vocab,shape", [("int8", False, "chain"), ("int8", True, "tree"),
                                                 ("int4", False, "tree"), ("int4", True, "chain")])
def test_greedy_exact_on_a_quantized_copy(weights, vocab, shape):
  prompts, ref = reference()
  t = target()
  draft = FeatureDraft(passing_head(t, VOCAB if vocab else None), 2, 16, weights=weights)
  params = draft.params(t)
  assert params is draft.params(t)                                        # made once
  assert isinstance(params["target_head"]["embed"], QuantizedWeight)
  assert isinstance(params["vocab_head" if vocab else "fc"], QuantizedWeight)
  assert ("lm_head" in params["target_head"]) == (not vocab)              # the target's LM head: only without
  assert isinstance(t.params["embed"], jax.Array)                         # the target keeps its own
  kw = dict(gamma=3) if shape == "chain" else dict(tree=TREE)
  res = generate(t, prompts, max_new_tokens=NEW, draft=draft, **kw)
  assert res.tokens == ref
  assert 0.0 < res.stats["acceptance_rate"] < 1.0, res.stats["acceptance_rate"]


# ---- the step against float64 numpy ------------------------------------------------------------------------

def dequantized(w) -> np.ndarray:
  """A QuantizedWeight's logical matrix in float64, from its stored integers and scales (layers/quant.py's
  layout: q [K, N] with scales [N] (int8) or scales and offsets [K / g, N] (int4), transposed for axis 1)."""
  if not isinstance(w, QuantizedWeight):
    return np.asarray(w, np.float64)
  q, s = np.asarray(w.q).astype(np.float64), np.asarray(w.scale, np.float64)
  o = np.zeros_like(s) if w.offset is None else np.asarray(w.offset, np.float64)   # int4: w = q s + o
  if w.axis == 1:                                                       # [N, K], scales [N] or [N, K / g]
    spread = (lambda a: a[:, None]) if s.ndim == 1 else (lambda a: np.repeat(a, q.shape[1] // a.shape[1], axis=1))
  else:
    spread = (lambda a: a[None, :]) if s.ndim == 1 else (lambda a: np.repeat(a, q.shape[0] // a.shape[0], axis=0))
  return (q * spread(s) + spread(o)).reshape(w.shape)


def numpy_step(cfg, w, feats, tokens, vocab_head: bool, tied: bool):
  """fuse + the head's step at position 0 (no rotation) with a causal mask over the new tokens, float64;
  w: the matrices by name (numpy). -> (logits, h, k)."""
  eps, d = cfg.rms_norm_eps, cfg.hidden_size
  rms = lambda x: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
  b, t, _ = feats.shape
  g = rms(feats.reshape(b, t, -1, d)).reshape(b, t, -1) @ w["fuse"]
  x = np.concatenate([g, w["embed"][tokens]], -1) @ w["fc"]
  h_, kh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  a = rms(x) * w["attn_norm"]
  q = (a @ w["q"].reshape(d, -1)).reshape(b, t, h_, hd)
  k = (a @ w["k"].reshape(d, -1)).reshape(b, t, kh, hd)
  v = (a @ w["v"].reshape(d, -1)).reshape(b, t, kh, hd)
  kv = np.arange(h_) // (h_ // kh)
  s = np.einsum("bthd,bshd->bhts", q, k[:, :, kv]) / np.sqrt(hd)
  s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  o = np.einsum("bhts,bshd->bthd", p / p.sum(-1, keepdims=True), v[:, :, kv])
  x = x + o.reshape(b, t, -1) @ w["o"].reshape(h_ * hd, d)
  m = rms(x) * w["mlp_norm"]
  gate = m @ w["gate"]
  x = x + (gate / (1 + np.exp(-gate)) * (m @ w["up"])) @ w["down"]
  y = rms(x) * w["norm"]
  head = w["vocab_head"].T if vocab_head else (w["embed"].T if tied else w["lm_head"])
  return y @ head, x, k


def matrices(hparams: dict, tables: dict) -> dict:
  """The step's matrices and scales by name (numpy float64): the head's and the target's `tables`."""
  lp = hparams["layers"][0]
  named = {"fuse": hparams["fuse"], "fc": hparams["fc"], "norm": hparams["norm"]["scale"], **lp["attn"],
           **lp["mlp"], "attn_norm": lp["attn_norm"]["scale"], "mlp_norm": lp["mlp_norm"]["scale"],
           **{n: tables[n] for n in ("embed", "lm_head") if n in tables}}
  if "vocab_head" in hparams:
    named["vocab_head"] = hparams["vocab_head"]
  return {n: dequantized(x) for n, x in named.items()}


@pytest.mark.parametrize("weights", ["int8", "int4"])
@pytest.mark.parametrize("tied,vocab", [(False, False), (True, False), (False, True)])
def test_step_on_the_copy_matches_float64_numpy(weights, tied, vocab):
  t = target(tied)
  cfg = t.config
  head = feature_head.init_head(t, seed=2, vocab=VOCAB if vocab else None)
  params = FeatureDraft(head, 2, 16, weights=weights).params(t)
  assert sorted(params["target_head"]) == (["embed"] if tied or vocab else ["embed", "lm_head"])
  w, float_w = matrices(params, params["target_head"]), matrices(head.params, t.params)
  quantized = {"fuse": params["fuse"], "fc": params["fc"], **params["target_head"], **params["layers"][0]["mlp"]}
  for n, x in quantized.items():       # the copy is the float matrices rounded: within half its scale step
    assert isinstance(x, QuantizedWeight), n
    step = dequantized(dataclasses.replace(x, q=jnp.ones_like(x.q), offset=None))      # the scale per element
    assert np.all(np.abs(w[n] - float_w[n]) <= 0.5 * step + 1e-7), n

  rng = np.random.default_rng(0)
  b, n_tok = 2, 5
  feats = rng.normal(size=(b, n_tok, len(head.layers) * cfg.hidden_size)) * 3.0
  tokens = rng.integers(0, cfg.vocab_size, size=(b, n_tok))
  zeros = jnp.zeros((b, cfg.num_kv_heads, n_tok, cfg.head_dim), jnp.float32)
  slots = jnp.broadcast_to(jnp.arange(n_tok), (b, n_tok))
  mask = DenseMask(jnp.broadcast_to(jnp.tril(jnp.ones((n_tok, n_tok), bool)), (b, n_tok, n_tok)))
  g = feature_head.fuse(params, jnp.asarray(feats, jnp.float32), cfg.rms_norm_eps)
  logits, h, k, _ = feature_head.step(head.config, params, {}, g, jnp.asarray(tokens, jnp.int32),   # no target
                                      jnp.zeros((b, n_tok), jnp.int32), zeros, zeros, slots, mask)
  want_logits, want_h, want_k = numpy_step(cfg, w, feats, tokens, vocab, tied)
  assert logits.shape == want_logits.shape == (b, n_tok, len(VOCAB) if vocab else cfg.vocab_size)
  for got, want in ((logits, want_logits), (h, want_h), (np.asarray(k).transpose(0, 2, 1, 3), want_k)):
    err = np.max(np.abs(np.asarray(got, np.float64) - want))
    assert err <= TOL[weights] * np.max(np.abs(want)), (err, np.max(np.abs(want)))
  if weights == "int4":   # it computes on the copy: far closer to that than to the float head and target
    float_logits = numpy_step(cfg, float_w, feats, tokens, vocab, tied)[0]
    assert np.max(np.abs(logits - want_logits)) < 0.5 * np.max(np.abs(float_logits - want_logits))


# ---- refusals, cost, command line ------------------------------------------------------------------------

def test_bad_weights_refused_by_name():
  head = feature_head.init_head(target(), seed=1)
  for bad in ("int3", "float16", 8):
    with pytest.raises(ValueError, match=f"FeatureDraft weights must be one of .*got {bad!r}"):
      FeatureDraft(head, 2, 16, weights=bad)
  bf16 = dataclasses.replace(head, config=head.config.replace(dtype="bfloat16"))
  with pytest.raises(ValueError, match="weights='bfloat16' is not narrower than the model's bfloat16"):
    FeatureDraft(bf16, 2, 16, weights="bfloat16")


def test_cost_and_footprint_count_the_copy():
  t = target()
  head = feature_head.init_head(t, seed=1)
  ctx = 4096
  costs = {w: FeatureDraft(head, 2, 16, weights=w).spec.cost() for w in (None, "bfloat16", "int8", "int4")}
  assert [c.weights_dtype for c in costs.values()] == list(costs)
  step = {w: costmodel.step_bytes(c.network_config(t.config), 1, ctx, 1, "float32", kv_context=c.kv_tokens(ctx),
                                  weights_dtype=c.weights_dtype) for w, c in costs.items()}
  # on CPU the int4 matrices are read as the bfloat16 ones XLA hoists them into (QuantForm.hoisted)
  assert step[None] > step["bfloat16"] > step["int4"] > step["int8"], step
  fp = FeatureDraft(head, 2, 16, weights="int8").spec.footprint(t.config, 4, 256)
  assert fp.weight_copy == "int8" and fp.weights == head.config
  mem = {w: plan_memory(t.config, None, batch=2, max_context=256, draft=FeatureDraft(head, 2, 16, weights=w),
                        tree_nodes=4).draft_params for w in (None, "int8")}
  assert mem["int8"] > mem[None]                    # the copy is held beside the head


def test_command_line_passes_draft_weights(tmp_path, monkeypatch):
  (tmp_path / feature_head.HEAD_FILE).write_text("{}")
  head = feature_head.init_head(target(), seed=1)
  monkeypatch.setattr(draft_flags.feature_head, "load_head", lambda d: head)
  fv = cli_modes.define_flags(flags.FlagValues())
  fv(["run.py", "--mode=generate", "--prompt=a", "--draft=feature", f"--draft_model={tmp_path}",
      "--draft_weights=int8", "--sink=3", "--window=20"])
  cli_modes.validate(fv)                                          # no longer refused for --draft=feature
  draft = draft_flags.build(fv, target(), lambda name: None)
  assert isinstance(draft, FeatureDraft) and draft.spec.weights == "int8"
  assert draft_flags.cost(fv, target().config).weights_dtype == "int8" == draft.spec.cost().weights_dtype
