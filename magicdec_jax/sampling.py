"""Sampling settings and the one filter that turns logits into probabilities.

Target (p) and draft (q) distributions both come from `probabilities`, so temperature / top-k / top-p are
always applied identically to both — a precondition of lossless speculative sampling.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampling:
  """temperature 0 means greedy; top_k 0 means no top-k cut; top_p 1 means no nucleus cut."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not (self.temperature >= 0.0):
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not (0.0 < self.top_p <= 1.0):
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def probabilities(logits: jax.Array, s: Sampling) -> jax.Array:
  """float32 logits [..., V] -> float32 probabilities [..., V] after temperature, top-k and top-p."""
  logits = logits.astype(jnp.float32)
  if s.greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  logits = logits / s.temperature
  if s.top_k and s.top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, s.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if s.top_p < 1.0:
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold is kept)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep = mass_before < s.top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return jax.nn.softmax(logits, axis=-1)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """One token per row from probabilities [..., V] (keys [...] of the same leading shape)."""
  return jax.vmap(lambda k, p: jax.random.categorical(k, jnp.log(p)))(
      key.reshape(-1), probs.reshape(-1, probs.shape[-1])).reshape(probs.shape[:-1]).astype(jnp.int32)


def sample_without_replacement(key: jax.Array, probs: jax.Array, n: int) -> jax.Array:
  """n distinct tokens per row, in draw order (Gumbel top-n == sequential draws without replacement)."""
  def one(k, p):
    g = jax.random.gumbel(k, p.shape)
    return jax.lax.top_k(jnp.where(p > 0, jnp.log(p) + g, -jnp.inf), n)[1]
  flat = jax.vmap(one)(key.reshape(-1), probs.reshape(-1, probs.shape[-1]))
  return flat.reshape(probs.shape[:-1] + (n,)).astype(jnp.int32)
