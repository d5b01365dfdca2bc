"""The decoder as Flax modules used purely, and the functional forward pass.

`forward(params, cfg, tokens, positions, cache, write_slots, spec) -> (logits, cache)`: embed, the layers,
final norm, LM head. One forward for every family: the config's features (config.py) switch its pieces on
(biases, q/k norms, Gemma's scaled embedding, (1 + w) norms, post-norms, GeGLU and soft-capping, each layer's
sliding window and RoPE; docs/families.md).

Layout: `params["layers"]` is a tuple of L per-layer trees and a cache a tuple of L per-layer buffers, and
the forward pass is a Python loop over layers, each traced once per kind of layer and inlined where it is
called (traced.py). A `lax.scan` over stacked [L, ...] arrays would be shorter
to compile, but every iteration then slices its layer's weights and cache out of the stack, and XLA
materializes those slices before the matmuls: on an H100 that copying took two thirds of a decode step
(docs/measurements.md#notes-per-layer). Unrolled over separate buffers, every matmul reads its weights
where they lie and every cache write is in place.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from magicdec_jax.cache import KVCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers import Attention, GatedMLP, RMSNorm, rms_norm
from magicdec_jax.layers.attention import PrefixTree, ring_rule
from magicdec_jax.layers.dense import dense
from magicdec_jax.layers.invariant import tile_map
from magicdec_jax.layers.prefill_attention import CausalChunk, softcapped
from magicdec_jax.layers.quant import QuantizedWeight
from magicdec_jax.layers.rope import rope_frequencies, rotation
from magicdec_jax.traced import traced_once


@dataclasses.dataclass
class Model:
  """A loaded model: config, params pytree, optional tokenizer and chat template."""
  config: ModelConfig
  params: Any
  tokenizer: Any = None          # a `tokenizers.Tokenizer`, or None (token-id input only)
  chat_template: str | None = None
  name: str = "model"
  template_tokens: dict | None = None   # {'bos_token', 'eos_token'} texts its chat template sees (HF's
                                        # tokenizer_config.json); None: the config's BOS id and first EOS id


class Block(nn.Module):
  """One pre-norm decoder layer (Gemma: the attention and MLP outputs normed too, before the residual), in
  three stages: `pre` (norm, q/k/v, RoPE: token-wise), `attend` (cache write + attention: per row),
  `post` (o projection, residual, MLP: token-wise); fixed-shape numerics tile the token-wise ones."""
  cfg: ModelConfig
  impl: str = "xla"
  layer: int = 0

  def setup(self):
    cfg = self.cfg
    norm = lambda: RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.norm_plus_one, cfg.invariant)
    self.attn_norm, self.mlp_norm = norm(), norm()
    if cfg.post_norms:
      self.post_attn_norm, self.post_mlp_norm = norm(), norm()
    self.attn = Attention(cfg, self.impl, self.layer)
    self.mlp = GatedMLP(cfg.intermediate_size, cfg.jnp_dtype, cfg.activation)

  def pre(self, x, rot, alt_rot=None):
    return self.attn.qkv(self.attn_norm(x), rot, alt_rot)

  def attend(self, q, q_alt, k, v, positions, cache_k, cache_v, write_slots, spec, return_scores=False):
    return self.attn.attend_cache(q, q_alt, k, v, positions, cache_k, cache_v, write_slots, spec, return_scores)

  def post(self, x, o):
    post_norms = self.cfg.post_norms
    a = self.attn.out(o)
    x = x + (self.post_attn_norm(a) if post_norms else a)
    m = self.mlp(self.mlp_norm(x))
    return x + (self.post_mlp_norm(m) if post_norms else m)

  def __call__(self, x, positions, rots, cache_k, cache_v, write_slots, spec, return_scores=False):
    q, q_alt, k, v = self.pre(x, *rots)
    o, cache_k, cache_v, scores = self.attend(q, q_alt, k, v, positions, cache_k, cache_v, write_slots, spec,
                                              return_scores)
    return self.post(x, o), cache_k, cache_v, scores


def invariant_block(lp, cfg: ModelConfig, impl: str, layer: int, x, positions, rots, cache_k, cache_v, write_slots,
                    spec, return_scores=False):
  """Block `layer` with fixed-shape numerics (layers/invariant.py): its token-wise stages in calls of the
  config's fixed row counts (cfg.fixed), its attention per row."""
  (cos, sin), alt_rot = rots
  if alt_rot is not None:
    raise ValueError("fixed-shape numerics compute the target, which has no alternative query positions "
                     "(a draft's ring rule); drafts compute with loop.draft_config")
  block, variables = Block(cfg, impl, layer), {"params": lp}
  rows = cfg.fixed.rows(isinstance(spec, CausalChunk))
  q, q_alt, k, v = tile_map(lambda xt, ct, st: block.apply(variables, xt, (ct, st), method=Block.pre), rows, x,
                            cos, sin)
  o, cache_k, cache_v, scores = block.apply(variables, q, q_alt, k, v, positions, cache_k, cache_v, write_slots,
                                            spec, return_scores, method=Block.attend)
  x = tile_map(lambda xt, ot: block.apply(variables, xt, ot, method=Block.post), rows, x, o)
  return x, cache_k, cache_v, scores


def apply_layer(lp, cfg: ModelConfig, impl: str, layer: int, x, positions, rots, cache_k, cache_v, write_slots,
                spec, return_scores=False):
  """Layer `layer` of the decoder, as the config's numerics compute it. rots: (cos, sin) of the tokens'
  positions for this layer's RoPE and of the spec's alt_pos (or None): `rotations`."""
  if cfg.invariant:
    return invariant_block(lp, cfg, impl, layer, x, positions, rots, cache_k, cache_v, write_slots, spec,
                           return_scores)
  return Block(cfg, impl, layer).apply({"params": lp}, x, positions, rots, cache_k, cache_v, write_slots, spec,
                                       return_scores)


def rotations(cfg: ModelConfig, layer: int, positions, spec, memo: dict):
  """((cos, sin), alt or None) for layer `layer`: RoPE's rotation [B, T, D/2] at the tokens' positions and at
  the spec's alt_pos, computed once per forward pass for all layers with the same frequencies (`memo`): the
  layers' q and k read one rotation instead of each computing its own."""
  inv_freq = rope_frequencies(cfg, layer)
  alt = getattr(spec, "alt_pos", None)
  key = (inv_freq.tobytes(), None if alt is None else id(alt))   # (alt_pos: the one array the layers' rule holds)
  if key not in memo:
    tabled = cfg.max_position_embeddings if cfg.invariant else None
    memo[key] = (rotation(positions, inv_freq, tabled), None if alt is None else rotation(alt, inv_freq, tabled))
  return memo[key]


@functools.partial(jax.jit, static_argnames=("cfg",))
def init_layer(cfg: ModelConfig, key: jax.Array) -> dict:
  """One layer's random params (one executable per config, whatever the seed)."""
  dt, b, t, s = cfg.jnp_dtype, 1, 1, 1
  rot = jnp.zeros((b, t, cfg.head_dim // 2), jnp.float32)
  dummy = (jnp.zeros((b, t, cfg.hidden_size), dt), jnp.zeros((b, t), jnp.int32), ((rot, rot), None),
           jnp.zeros((b, cfg.num_kv_heads, s, cfg.head_dim), dt),
           jnp.zeros((b, cfg.num_kv_heads, s, cfg.head_dim), dt), jnp.zeros((b, t), jnp.int32),
           PrefixTree(jnp.zeros((b,), jnp.int32), jnp.ones((t, t), bool)))
  return Block(cfg).init(key, *dummy)["params"]


def init_params(cfg: ModelConfig, key: jax.Array, scale: float = 0.02) -> dict:
  """Random params in the layout every loader produces (a tuple of per-layer trees)."""
  k_embed, k_layers, k_head = jax.random.split(key, 3)
  dt = cfg.jnp_dtype
  layers = tuple(init_layer(cfg, k) for k in jax.random.split(k_layers, cfg.num_layers))
  params = {
      "embed": (jax.random.normal(k_embed, (cfg.vocab_size, cfg.hidden_size)) * scale).astype(dt),
      "layers": layers,
      "final_norm": {"scale": (jnp.zeros if cfg.norm_plus_one else jnp.ones)((cfg.hidden_size,), dt)},
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = (jax.random.normal(k_head, (cfg.hidden_size, cfg.vocab_size)) * scale).astype(dt)
  return params


def forward(params: dict, cfg: ModelConfig, tokens: jax.Array, positions: jax.Array, cache,
            write_slots: jax.Array | None, spec, *, impl: str = "xla", compute_logits: bool = True,
            return_scores: bool = False, feature_layers: tuple[int, ...] = ()):
  """tokens/positions/write_slots [B, T] -> (logits float32 [B, T, V] or None, cache[, scores L x [B,K,S]]
  [, features]).

  `cache` is any pytree with `.k`/`.v` tuples of L per-layer [B, K, S, D] buffers (KVCache or RingCache);
  `spec` is a PrefixTree or DenseMask visibility rule (see layers/attention.py). Slots out of range, or
  every slot when `write_slots` is None, are not written. With `feature_layers` (layer indices), the
  hidden states after those layers come back last, concatenated: [B, T, len(feature_layers) * D] (what a
  feature-head draft reads, feature_draft.py). A KVCache's ring layers (windowed, cache.py) take the
  slots and the rule as that layer's ring sees them (`ring_rule`): write_slots are virtual (linear) slots.
  """
  x = embed(params, cfg, tokens)
  ks, vs, scores, feats, rings, rots = [], [], [], {}, {}, {}
  for i, (lp, ck, cv) in enumerate(zip(params["layers"], cache.k, cache.v, strict=True)):
    ws, sp = write_slots, spec
    if isinstance(cache, KVCache) and cache.is_ring(i):
      size = ck.shape[2]
      if size not in rings:
        rule = CausalChunk(spec.start, ring=size) if cfg.invariant and isinstance(spec, CausalChunk) else \
            ring_rule(spec, positions, size)      # fixed-shape numerics read a prefill's ring by position
        rings[size] = (None if ws is None else cache.layer_slots(i, ws), rule)
      ws, sp = rings[size]
    x, ck, cv, sc = traced_once(apply_layer, lp, cfg, impl, cfg.layer_kind(i), x, positions,
                                rotations(cfg, i, positions, sp, rots), ck, cv, ws, sp, return_scores)
    ks.append(ck)
    vs.append(cv)
    scores.append(sc)
    if i in feature_layers:
      feats[i] = x
  cache = cache.replace(k=tuple(ks), v=tuple(vs))
  head = lambda h: lm_logits(params, cfg, h, params["final_norm"]["scale"])
  logits = None
  if compute_logits:                                          # (decode rounds only: prefill computes none)
    logits = tile_map(head, cfg.fixed.rows(False), x) if cfg.invariant else head(x)
  out = (logits, cache)
  if return_scores:
    out += (tuple(scores),)
  if feature_layers:
    out += (jnp.concatenate([feats[i] for i in feature_layers], axis=-1),)
  return out


def embed(params: dict, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
  """tokens [B, T] -> [B, T, D] in the activation dtype (Gemma: x sqrt(D) rounded to that dtype, as HF)."""
  table = params["embed"]                                    # (a draft's copy may be narrower or quantized)
  x = table.rows(tokens, cfg.jnp_dtype) if isinstance(table, QuantizedWeight) else \
      jnp.take(table, tokens, axis=0).astype(cfg.jnp_dtype)
  return x * jnp.asarray(math.sqrt(cfg.hidden_size), cfg.jnp_dtype) if cfg.embed_scale else x


def lm_logits(params: dict, cfg: ModelConfig, x: jax.Array, norm_scale: jax.Array) -> jax.Array:
  """Hidden states [B, T, D] -> float32 logits [B, T, V]: RMS norm with `norm_scale`, then the LM head of
  `params` (its embedding when tied), soft-capped if the config says so."""
  x = rms_norm(x, norm_scale, cfg.rms_norm_eps, cfg.norm_plus_one, cfg.invariant)
  # a tied head reads the embedding [V, D] as it lies (a transposed copy would cost V x D more memory)
  head, eq = (params["embed"], "BTD,VD->BTV") if cfg.tie_embeddings else (params["lm_head"], "BTD,DV->BTV")
  return softcapped(dense(eq, x, head, out_dtype=jnp.float32), cfg.final_softcap)  # (a draft's copy: bf16 dot)


@functools.partial(jax.jit, static_argnames=("cfg",))
def full_forward(params: dict, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
  """A plain causal forward over [B, T] tokens -> float32 logits [B, T, V] (no cache kept)."""
  b, t = tokens.shape
  cache = KVCache.zeros(cfg, b, t)
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  spec = PrefixTree(jnp.zeros((b,), jnp.int32), jnp.tril(jnp.ones((t, t), bool)))
  logits, _ = forward(params, cfg, tokens, pos, cache, pos, spec)
  return logits
