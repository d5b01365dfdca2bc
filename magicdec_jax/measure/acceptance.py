"""Measure a Sequoia acceptance vector for a (target, draft) pair on real text.

p[k] = probability that the k-th child a node draws from the draft is the one the target accepts (Sequoia's
"acceptance vector"; sum(p) < 1 is the chance that none of the W children is accepted). We run one plain
full forward of the target and one of the draft over a text window, then at every position t:
  greedy:   rank of the target's argmax among the draft's top-W tokens (no rank if absent);
  sampling: Sequoia's sequential rejection, simulated: child x ~ q_res, accepted with min(1, p_res/q_res);
            on rejection p_res <- norm(max(p_res - q_res, 0)) and x is removed from q_res (what verify.py does).
The self-speculation draft is the target's own weights with StreamingLLM attention (sink + last window
tokens) over a linear cache, i.e. `drafts.base.windowed_mask`; a ModelDraft uses its own model the same way.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.drafts.base import windowed_mask
from magicdec_jax.cache import KVCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.attention import DenseMask
from magicdec_jax.model import forward, full_forward
from magicdec_jax.sampling import Sampling, probabilities


@functools.partial(jax.jit, static_argnames=("cfg", "sink", "window"))
def windowed_logits(params, cfg: ModelConfig, tokens: jax.Array, sink: int, window: int) -> jax.Array:
  """tokens [B, T] -> float32 logits [B, T, V] where position t attends to keys < sink and > t - window."""
  b, t = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  mask = windowed_mask(sink, window, pos, t)
  logits, _ = forward(params, cfg, tokens, pos, KVCache.zeros(cfg, b, t), pos, DenseMask(mask))
  return logits


def greedy_ranks(target_logits: np.ndarray, draft_logits: np.ndarray, width: int) -> np.ndarray:
  """[N, V] each -> [N] rank (0-based) of the target's argmax among the draft's top-`width`, -1 if absent."""
  top = np.argsort(-draft_logits, axis=-1, kind="stable")[:, :width]            # [N, W]
  hit = top == np.argmax(target_logits, axis=-1)[:, None]
  return np.where(hit.any(-1), np.argmax(hit, -1), -1)


def sampled_ranks(p: np.ndarray, q: np.ndarray, width: int, rng: np.random.Generator) -> np.ndarray:
  """p, q [N, V] target / draft probabilities -> [N] accepted child rank (-1 if none), one simulation each."""
  out = np.full(p.shape[0], -1)
  for i in range(p.shape[0]):
    pr, qr = p[i].astype(np.float64), q[i].astype(np.float64)
    for k in range(width):
      qs = qr.sum()
      if qs <= 0:
        break
      x = rng.choice(qr.shape[0], p=qr / qs)
      if rng.random() * qr[x] < pr[x]:
        out[i] = k
        break
      res = np.maximum(pr - qr, 0.0)
      pr = res / res.sum() if res.sum() > 0 else pr
      qr = qr.copy()
      qr[x] = 0.0
      qr = qr / qr.sum() if qr.sum() > 0 else qr
  return out


def profile(target, draft, windows: list[list[int]], *, width: int = 8, sampling: Sampling = Sampling(),
            seed: int = 0) -> dict:
  """Acceptance vector of `draft` (one that runs a network over a sink + window cache: StreamingDraft,
  ModelDraft) against `target` over token windows. The draft's network runs in its own precision, so a
  draft with a weight copy (weights=...) is refused rather than profiled as the full-precision one. A
  window no longer than sink + window + 16 tokens is measured whole for a model draft and skipped for the
  target's own (self-draft), which sees all of it and would accept everything; ValueError if none is left."""
  if getattr(draft.spec, "weights", None) is not None:
    raise ValueError(f"{draft!r}: acceptance is profiled on the draft's network in its own precision, not on "
                     "a weight copy (profile the draft without weights=)")
  d_params, d_cfg, sink, window = draft.windowed_network(target)
  self_draft = d_params is target.params
  rng = np.random.default_rng(seed)
  ranks = []
  for toks in windows:
    t = len(toks)
    if self_draft and t <= sink + window + 16:
      continue
    arr = jnp.asarray([toks], jnp.int32)
    tl = np.asarray(full_forward(target.params, target.config, arr))[0]
    dl = np.asarray(windowed_logits(d_params, d_cfg, arr, sink, window))[0]
    start = sink + window if t > sink + window + 16 else 0      # positions where the window really cuts
    tl, dl = tl[start:t - 1], dl[start:t - 1]
    if sampling.greedy:
      ranks.append(greedy_ranks(tl, dl, width))
    else:
      p = np.asarray(probabilities(jnp.asarray(tl), sampling))
      q = np.asarray(probabilities(jnp.asarray(dl), sampling))
      ranks.append(sampled_ranks(p, q, width, rng))
  if not ranks:
    raise ValueError(f"no window is longer than the draft's sink + window + 16 = {sink + window + 16} tokens "
                     f"(longest {max(map(len, windows), default=0)}): the target's own draft sees all of such a "
                     "window and accepts everything; profile longer windows or a smaller window")
  r = np.concatenate(ranks)
  vec = [float(np.mean(r == k)) for k in range(width)]
  return {"acceptance_vector": vec, "sum": float(sum(vec)), "positions": int(r.size), "width": width,
          "mode": "greedy" if sampling.greedy else "sampling", "temperature": sampling.temperature,
          "top_k": sampling.top_k, "top_p": sampling.top_p, "sink": sink, "window": window,
          "window_tokens": [len(w) for w in windows], "windows_profiled": len(ranks), "target": target.name,
          "draft": repr(draft)}
