"""`PromptLookupDraft(max_ngram, min_ngram)`: drafting with no model, by looking the text up in itself.

Long documents, code, extraction and rewriting repeat their own text. Each round, for n from `max_ngram`
down to `min_ngram`, the row's last n tokens are searched for in its prompt + output so far; at the
latest earlier occurrence of the longest n that has one, the tokens that followed it are the chain's
proposal (what HF's `prompt_lookup_num_tokens`, vLLM's and tpu-inference's n-gram drafts do), here on
device inside the compiled loop. Where nothing matches, the row proposes its last token again: any
proposal is lossless, verification decides. Where a row feature may rule tokens out (a constraint:
`Round.masks`), each proposal goes through the round's `scores` as a one-hot logit row and the best token
left stands in for it: an allowed proposal is kept, a disallowed one replaced (at a forced position by the
forced token, which is then accepted), so a proposal never dies on a token the target cannot take.

The ring is the row's token history [B, S] (S: the target cache's slot count, so it holds prompt and
output), positions 0 .. L-1 committed. `propose` writes the pending token at L-1 and its proposals after
it (a continuation that runs past L-1 keeps copying from what it has just proposed: periodic text
continues); `commit` writes the accepted path. Matching reads positions < L only, so stale proposals past
the committed length are never seen. Under sampling the draft is deterministic: q is one-hot on each
proposed token (verification accepts it with probability p(token) and resamples the residual).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import Draft, DraftSpec, Footprint, Prefill, Round
from magicdec_jax.options import check_count
from magicdec_jax.row_features import Nodes
from magicdec_jax.trees import Tree
from magicdec_jax.tuning.draft_cost import DraftCost

DEFAULT_MAX_NGRAM = 3
MAX_NGRAM = 64       # the match unrolls over n-gram lengths: compile time grows with the square of max_ngram


@dataclasses.dataclass(frozen=True)
class PromptLookupDraft(DraftSpec, Draft):
  """n-gram drafting from the row's own prompt and output (see the module docstring)."""
  max_ngram: int = DEFAULT_MAX_NGRAM
  min_ngram: int = 1

  name = "lookup"
  proposes_trees: ClassVar[bool] = False

  def __post_init__(self):
    for field, v in (("max_ngram", self.max_ngram), ("min_ngram", self.min_ngram)):
      check_count(f"PromptLookupDraft {field}", v, 1, MAX_NGRAM)
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"PromptLookupDraft min_ngram={self.min_ngram} is larger than max_ngram={self.max_ngram}")

  # ---- ring: the token history -------------------------------------------------------------------------
  def empty_ring(self, cfg: ModelConfig, batch: int, tree: Tree, num_slots: int) -> jax.Array:
    return jnp.zeros((batch, num_slots), jnp.int32)

  def prefill_ring(self, history: jax.Array, p: Prefill) -> jax.Array:
    return history.at[:, :p.tokens.shape[1]].set(p.tokens)

  def insert_rows(self, history: jax.Array, new: jax.Array, dst: jax.Array, rows: jax.Array) -> jax.Array:
    """A fresh prefill's history is as wide as its prompt bucket: it fills the first columns."""
    return history.at[dst, :new.shape[1]].set(new[rows], mode="drop")

  def _match(self, h: jax.Array, lengths: jax.Array) -> jax.Array:
    """[B] the position after the latest earlier occurrence of the longest matching suffix n-gram of
    h[:, :L] (-1: none). A match ends before L-1, so at least one following token is known."""
    b, s = h.shape
    j = jnp.arange(s)[None, :]
    start = jnp.full((b,), -1, jnp.int32)
    for n in range(min(self.max_ngram, s - 1), self.min_ngram - 1, -1):   # (a match needs n <= s - 1)
      suffix = jnp.take_along_axis(h, jnp.maximum(lengths[:, None] - n + jnp.arange(n)[None, :], 0), axis=1)
      hit = jnp.ones((b, s), bool)
      for t in range(n):          # h[:, j + t] == suffix[t] for every window start j
        shifted = jnp.pad(h[:, t:], ((0, 0), (0, t)), constant_values=-1)
        hit = hit & (shifted == suffix[:, t:t + 1])
      hit = hit & (j + n <= lengths[:, None] - 1) & (lengths[:, None] > n)
      latest = jnp.max(jnp.where(hit, j, -1), axis=1)
      start = jnp.where((start < 0) & (latest >= 0), latest + n, start)
    return start

  def propose(self, history: jax.Array, r: Round):
    tree = r.tree
    b, gamma = r.last.shape[0], tree.num_nodes - 1
    rows = jnp.arange(b)
    h = history.at[rows, r.lengths - 1].set(r.last)
    start = self._match(h, r.lengths)
    start = jnp.where(start >= 0, start, r.lengths - 1)            # no match: repeat the last token
    tokens = [r.last]
    v = r.cfg.vocab_size
    for d in range(1, gamma + 1):
      tok = h[rows, jnp.minimum(start + d - 1, r.lengths - 2 + d)]
      if r.masks and r.scores is not None:      # the best allowed token in its place (itself if allowed)
        so_far = jnp.stack(tokens + [tok] * (gamma + 1 - len(tokens)), axis=1)
        x = jnp.where(jax.nn.one_hot(tok, v, dtype=bool), 0.0, -1.0)[:, None, :]
        tok = jnp.argmax(r.scores(x, Nodes(tree, so_far, jnp.asarray([d - 1], jnp.int32))).x[:, 0],
                         axis=-1).astype(jnp.int32)
      h = h.at[rows, r.lengths - 1 + d].set(tok, mode="drop")
      tokens.append(tok)
    node_tokens = jnp.stack(tokens, axis=1)                         # [B, gamma + 1]
    if r.sampling.greedy:
      dist = jnp.zeros((b, gamma + 1, v), jnp.float32)              # greedy verification reads no q
    else:                                                           # node d's child is node d + 1
      dist = jnp.concatenate([jax.nn.one_hot(node_tokens[:, 1:], v, dtype=jnp.float32),
                              jnp.zeros((b, 1, v), jnp.float32)], axis=1)
    return node_tokens, dist, h

  def commit(self, history: jax.Array, r: Round) -> jax.Array:
    """Tokens L-1 .. L-1+n: the pending token and the accepted path (the next pending token is written
    by the next propose)."""
    i = jnp.arange(r.path.shape[1])[None, :]
    toks = jnp.take_along_axis(r.node_tokens, r.path, axis=1)
    pos = jnp.where(i <= r.n[:, None], (r.lengths - 1)[:, None] + i, history.shape[1])
    return history.at[jnp.arange(history.shape[0])[:, None], pos].set(toks, mode="drop")

  # ---- tuning ---------------------------------------------------------------------------------------------
  def cost(self) -> DraftCost:
    return DraftCost(0, runs_network=False, label="lookup")

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    return Footprint(row_bytes=4 * max_context)
