"""`ModelDraft(model, sink, window)`: a separate, smaller model of the same vocabulary with its own
StreamingLLM ring. Every one of its K/V entries is computed with sink + window attention (its prefill
included), so it is exactly "the draft model with StreamingLLM attention"."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from magicdec_jax.cache import KVCache, RingCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import (Draft, Footprint, Prefill, Round, check_positions, check_sink_window, copy_from_linear,
                                      window_attention, windowed_mask)
from magicdec_jax.drafts.ring import RingDraft
from magicdec_jax.drafts.streaming import DEFAULT_SINK, DEFAULT_WINDOW
from magicdec_jax.drafts.weights import check_narrower, check_weights, copy_of
from magicdec_jax.layers import quant
from magicdec_jax.model import Model, forward
from magicdec_jax.options import is_int
from magicdec_jax.tuning.draft_cost import DraftCost


@dataclasses.dataclass(frozen=True)
class ModelSpec(RingDraft):
  """The static part of a ModelDraft (hashable, a jit static argument)."""
  config: ModelConfig
  sink: int
  window: int
  positions: str = "absolute"
  weights: str | None = None      # the draft model's matrices as a copy (StreamingDraft.weights)

  needs_prev_token = True
  commits_plain_rounds = False   # its ring takes its own scratch K/V, which a plain round never computes

  num_static = property(lambda self: self.sink)

  def _network(self, r: Round):
    return r.draft_params, self.config

  def ring_config(self, cfg: ModelConfig) -> ModelConfig:
    return self.config

  def network_config(self, cfg: ModelConfig) -> ModelConfig:
    return self.config

  def prefill_ring(self, ring: RingCache, p: Prefill) -> RingCache:
    """The draft model's own chunked prefill, each query under the sink + window rule, then its sink and
    recent K/V copied into the ring."""
    b, n = p.tokens.shape

    def chunk(cache, c):
      toks = jax.lax.dynamic_slice_in_dim(p.tokens, c * p.chunk, p.chunk, axis=1)
      pos = jnp.broadcast_to(c * p.chunk + jnp.arange(p.chunk, dtype=jnp.int32), (b, p.chunk))
      mask = window_attention(self, windowed_mask(self.sink, self.window, pos, cache.num_slots), pos, self.sink)
      _, cache = forward(p.draft_params, self.config, toks, pos, cache, pos, mask, compute_logits=False)
      return cache, None

    linear, _ = jax.lax.scan(chunk, KVCache.zeros(self.config, b, n), jnp.arange(n // p.chunk, dtype=jnp.int32))
    return copy_from_linear(ring, self.sink, self.window, linear, p.lengths)

  def cost(self) -> DraftCost:
    return DraftCost(self.sink + self.window, self.config, self.weights, label="model")

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    return Footprint(weights=self.config, ring=self.config, ring_slots=self.sink + self.window + tree_nodes + 1,
                     row_bytes=4 * (self.sink + self.window), prefill_cache=self.config,
                     weight_copy=self.weights)


class ModelDraft(Draft):
  """A standalone draft model (same vocabulary) with its own StreamingLLM ring cache."""

  name = "model"
  weight_copies = True

  def __init__(self, model: Model, sink: int = DEFAULT_SINK, window: int = DEFAULT_WINDOW,
               positions: str = "absolute", weights: str | None = None):
    if not isinstance(model, Model):
      raise ValueError(f"ModelDraft needs a Model (md.load_model(...) or drafts.truncate_layers(...)), got "
                       f"{model!r:.80}")
    check_sink_window(sink, window)
    check_positions(positions)
    check_weights(weights, "ModelDraft")
    check_narrower(weights, model.config.dtype, "ModelDraft")
    self.model = model
    self._spec = ModelSpec(model.config, sink, window, positions, weights)

  @property
  def spec(self) -> ModelSpec:
    return self._spec

  def params(self, target):
    w = self._spec.weights
    return self.model.params if w is None else copy_of(self.model.params, w)

  def xla_options(self) -> dict:
    return quant.xla_options(self._spec.weights)

  def check_compatible(self, target: Model) -> None:
    if self.model.config.vocab_size != target.config.vocab_size:
      raise ValueError(f"draft vocabulary size {self.model.config.vocab_size} differs from the target's "
                       f"{target.config.vocab_size}; a draft must share the target's vocabulary")
    other = different_token(self.model.tokenizer, target.tokenizer)
    if other is not None:
      raise ValueError(f"the draft's tokenizer is not the target's ({other}); a draft must share the target's "
                       "vocabulary, token for token")

  def forward_network(self, target):
    return self.model.params, self.model.config

  def windowed_network(self, target):
    self.check_compatible(target)
    return self.model.params, self.model.config, self.spec.sink, self.spec.window

  def __repr__(self) -> str:
    return (f"ModelDraft({self.model.name}, sink={self.spec.sink}, window={self.spec.window}, "
            f"positions={self.spec.positions!r})")


@functools.lru_cache(maxsize=8)
def _vocab(tokenizer) -> dict[str, int]:
  return tokenizer.get_vocab(with_added_tokens=True)


def different_token(draft_tok, target_tok) -> str | None:
  """Where two tokenizers map a token to different ids (described), or None: the same vocabulary, or one
  side has no tokenizer (token ids only: nothing to compare)."""
  if draft_tok is None or target_tok is None or draft_tok is target_tok:
    return None
  mine, theirs = _vocab(draft_tok), _vocab(target_tok)
  if mine == theirs:
    return None
  for tok in sorted(mine.keys() | theirs.keys(), key=lambda t: (min(mine.get(t, 1 << 62), theirs.get(t, 1 << 62)), t)):
    if mine.get(tok) != theirs.get(tok):
      return f"token {tok!r} is id {mine.get(tok)} in the draft's, {theirs.get(tok)} in the target's"
  return None


def truncate_layers(model: Model, n: int) -> Model:
  """The first n layers of `model` + its final norm and head: a real, smaller draft of the same family."""
  if not isinstance(model, Model):
    raise ValueError(f"truncate_layers needs a Model (md.load_model), got {model!r:.80}")
  if not is_int(n) or not 1 <= n <= model.config.num_layers:
    raise ValueError(f"truncate_layers: n must be an integer in [1, {model.config.num_layers}], got {n!r}")
  n = int(n)
  params = dict(model.params)
  params["layers"] = tuple(model.params["layers"][:n])
  return dataclasses.replace(model, config=model.config.replace(num_layers=n), params=params,
                             name=f"{model.name}[:{n} layers]")
