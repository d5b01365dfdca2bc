"""The one interface every draft answers, and the helpers the drafts share.

A `Draft` is what the user passes (`generate(..., draft=StreamingDraft(4, 256))`): its `spec` (a
`DraftSpec`) is the static, hashable part the compiled loop is specialised on (a jit static argument),
`params(target)` its runtime weights (None where it runs the target's own or none). A draft without
weights is its own spec (StreamingDraft, SnapKVDraft, PromptLookupDraft); ModelDraft and FeatureDraft
hold a network and a spec. What the engine, the loop, the memory planner and the sharded runtime need to
know about a draft, they ask through these two classes' methods; the cost model gets plain numbers
(`DraftSpec.cost()`, a `tuning.draft_cost.DraftCost`), measurement the network a draft runs (`forward_network`,
`windowed_network`), and the command line builds drafts from flags in `cli/draft_flags.py`. So nothing
outside `drafts/` asks which draft it is, and a new draft is one module plus one line in
`drafts/__init__.py`'s registry (and one in the command line's, to be `--draft=<name>`).

In the compiled loop a draft owns `LoopState.ring`, a pytree whose leaves all lead with the batch axis:
  * `empty_ring` -> a ring of free rows; `prefill_ring` fills it for prompts whose target cache is
    prefilled (positions 0 .. L-2 committed; token L-1 is the pending root);
  * `propose` drafts the tree's candidates: node tokens [B, N] and the distribution each expanded node's
    children were drawn from [B, N, V] (logits under greedy, the filtered probabilities q under sampling);
  * `commit` writes what verification accepted (path, n) into the ring: only committed positions ever
    enter a ring, so a rejection never evicts a live entry.

The helpers below are the StreamingLLM ring rules (which positions a sink + window ring holds, its mask)
and the level-by-level tree driver with the child-token choice, shared by every drafting network.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.cache import KVCache, RingCache
from magicdec_jax.config import ModelConfig
from magicdec_jax.layers.attention import DenseMask
from magicdec_jax.options import check_count
from magicdec_jax.row_features import Nodes
from magicdec_jax.sampling import Sampling, Scores, sample_without_replacement, with_static_filter
from magicdec_jax.trees import Tree
from magicdec_jax.tuning.draft_cost import DraftCost


@dataclasses.dataclass(frozen=True)
class Prefill:
  """What `prefill_ring` gets: prompts [B, P] right-padded with lengths [B], the prefilled target cache."""
  target_params: Any
  draft_params: Any
  cfg: ModelConfig          # the target's
  target: KVCache
  tokens: jax.Array
  lengths: jax.Array
  tree: Tree
  chunk: int


@dataclasses.dataclass(frozen=True)
class Round:
  """What `propose` and `commit` get: the round's tree and sampling, both networks' params, the rows'
  pending token (position L-1), previous token (L-2), lengths L and PRNG keys; after verification also
  the target cache (accepted path compacted to slots L-1 ..), the accepted path [B, D+1], count n [B],
  the node tokens [B, N] and the target's features at every node (drafts with `feature_layers`). Under
  invariant sampling, `noise[:, d]` is the noise of the token a node at depth d proposes (position L + d).
  `scores` turns a level's logits into what its children are drawn from (`choose_children` calls it): the
  loop's row features and sampling filter, the same the target's logits go through."""
  tree: Tree
  sampling: Sampling
  target_params: Any
  cfg: ModelConfig
  draft_params: Any
  last: jax.Array
  prev: jax.Array
  lengths: jax.Array
  keys: jax.Array
  target: KVCache | None = None
  path: jax.Array | None = None
  n: jax.Array | None = None
  node_tokens: jax.Array | None = None
  features: jax.Array | None = None
  noise: jax.Array | None = None      # [B, D+1, V] invariant sampling: the noise of the tokens at depth 1..D+1
  scores: Callable[[jax.Array, Nodes], Scores] | None = None   # (logits [B, E, V], nodes) -> Scores;
                                      # None: the static sampling's filter alone
  masks: bool = False                 # a row feature may rule tokens out (a constraint): a draft that
                                      # proposes without logits passes its proposals through `scores`


@dataclasses.dataclass(frozen=True)
class Footprint:
  """A draft's device memory for the planner, in the planner's terms (it applies the mesh's splits):
  weights: the config of a network of its own (None: it runs the target's weights or none);
  ring: the config whose K/V layout its ring has, with `ring_slots` slots (None: no K/V ring);
  row_bytes: other per-row state (ring positions, token history);
  prefill_cache: a linear cache of the prompt's length its prefill builds (a model draft's own prefill);
  prefill_score_buffers: float32 [L, K, context] buffers per row its prefill keeps (SnapKV's scores);
  weight_copy: the dtype or quantization of a copy of its network's weights it also holds ("bfloat16",
  "int8", "int4"; the network is `weights`, or the target's when that is None)."""
  weights: ModelConfig | None = None
  ring: ModelConfig | None = None
  ring_slots: int = 0
  row_bytes: int = 0
  prefill_cache: ModelConfig | None = None
  prefill_score_buffers: int = 0
  weight_copy: str | None = None


class Draft:
  """The object a user passes as `draft=`: the static `spec` the loop runs, and what needs the target."""

  name: ClassVar[str] = "draft"       # the registry name (`--draft=<name>`)
  weight_copies: ClassVar[bool] = False   # takes `weights=` (a narrower or quantized copy; --draft_weights)

  @property
  def spec(self) -> "DraftSpec":
    """The static, hashable part the compiled loop sees (the draft itself where it holds no weights)."""
    return self

  def params(self, target) -> Any:
    """Runtime weights the loop passes as draft_params (None: the target's own, or none)."""
    return None

  def check_compatible(self, target) -> None:
    """ValueError where this draft cannot serve `target` (vocabulary, hidden size, dtype)."""

  def xla_options(self) -> dict[str, Any]:
    """XLA compiler options the executables running this draft need (a caller's own options win)."""
    return {}

  def forward_network(self, target) -> tuple[Any, ModelConfig] | None:
    """(params, config) of the transformer its draft step runs through `model.forward`, in their own
    precision (a weight copy is `spec.cost().weights_dtype`): the target's for self drafts, its model's
    for a model draft; None where it runs none (a feature head, prompt lookup)."""
    return None

  def windowed_network(self, target) -> tuple[Any, ModelConfig, int, int]:
    """(params, config, sink, window) where that network attends over a StreamingLLM sink + window cache
    (what an acceptance profile replays over a text); ValueError where the draft is not one."""
    raise ValueError(f"windowed_network: needs a draft that runs a network over a sink + window cache "
                     f"(streaming or model), got {type(self).__name__}")


class DraftSpec:
  """The static part: a frozen, hashable dataclass the compiled loop is specialised on."""

  @property
  def spec(self) -> "DraftSpec":
    return self

  # what it needs from the target
  uses_target_weights: ClassVar[bool] = False   # drafts with the target's own weights (self-speculation)
  needs_prev_token: ClassVar[bool] = False      # re-encodes the token at L-2 every round
  proposes_trees: ClassVar[bool] = True         # False: chains only (gamma, not tree)
  feature_layers: tuple[int, ...] = ()          # target layers whose features the verify pass returns
  # `commit` with a plain-decoding round (path = the pending token alone, its K/V in the target cache)
  # keeps the ring current, so an adaptive schedule may switch speculation off and on (schedule.py)
  commits_plain_rounds: ClassVar[bool] = True

  def check_prompts(self, ids: Sequence[Sequence[int]]) -> None:
    """ValueError naming the value where a prompt is too short for this draft."""

  def check_tree(self, tree) -> None:
    """ValueError where this draft cannot propose `tree` (a trees.Tree, or "auto" for a Sequoia tree)."""
    if not self.proposes_trees and (tree == "auto" or not tree.is_chain):
      raise ValueError(f"{type(self).__name__} proposes one continuation per row: pass gamma (a chain), "
                       f"not tree={tree!r}")

  # ---- the compiled loop ---------------------------------------------------------------------------------
  def empty_ring(self, cfg: ModelConfig, batch: int, tree: Tree, num_slots: int) -> Any:
    """A ring of `batch` free rows; num_slots: the target cache's slot count (prompt + output room)."""
    raise NotImplementedError

  def prefill_ring(self, ring: Any, p: Prefill) -> Any:
    raise NotImplementedError

  def propose(self, ring: Any, r: Round) -> tuple[jax.Array, jax.Array, Any]:
    raise NotImplementedError

  def commit(self, ring: Any, r: Round) -> Any:
    raise NotImplementedError

  def insert_rows(self, ring: Any, new: Any, dst: jax.Array, rows: jax.Array) -> Any:
    """Continuous batching: rows `dst` [n] of `ring` take rows `rows` of a freshly prefilled ring `new`
    (dst == batch marks padding, dropped). Every leaf leads with the batch axis and has one shape in
    both rings (drafts whose ring grows with the cache override this)."""
    return jax.tree.map(lambda c, x: c.at[dst].set(x[rows].astype(c.dtype), mode="drop"), ring, new)

  # ---- tuning: cost model, memory planner, sharding -----------------------------------------------------
  def cost(self) -> DraftCost:
    """One draft step as plain numbers (the network it runs, the KV it reads, its weights' bytes) for the
    cost model, which prices them without asking which draft this is."""
    raise NotImplementedError

  def network_config(self, cfg: ModelConfig) -> ModelConfig | None:
    """The network whose weights the draft runs (the target's for self drafts; None: none)."""
    return cfg if self.uses_target_weights else None

  def footprint(self, cfg: ModelConfig, tree_nodes: int, max_context: int) -> Footprint:
    """Its device memory with a tree of `tree_nodes` nodes and a target cache of `max_context` slots."""
    raise NotImplementedError


# ------------------------------------------------------------------------------------------------ checks

def check_sink_window(sink: int, window: int) -> None:
  check_count("draft sink", sink, 0)
  check_count("draft window", window, 1)


def check_positions(positions: str) -> None:
  if positions not in ("absolute", "cache"):
    raise ValueError(f"draft positions must be 'absolute' or 'cache', got {positions!r}")


# ------------------------------------------------------------------------------------ StreamingLLM rings

def window_attention(spec, mask: jax.Array, q_pos: jax.Array, num_static: int,
                     key_pos: jax.Array | None = None) -> DenseMask:
  """The draft's visibility rule, with StreamingLLM cache positions for static slots if asked; key_pos
  [B, S]: the position each slot holds (rings; None: slot == position)."""
  if getattr(spec, "positions", "absolute") == "absolute" or num_static == 0:
    return DenseMask(mask, key_pos=key_pos)
  alt_pos = jnp.minimum(q_pos, spec.sink + spec.window - 1)
  return DenseMask(mask, alt_pos, jnp.arange(mask.shape[-1]) < num_static, key_pos)


def windowed_mask(sink: int, window: int, q_pos: jax.Array, num_slots: int) -> jax.Array:
  """[B, T] query positions -> [B, T, S] StreamingLLM visibility over a linear cache (slot == position)."""
  s = jnp.arange(num_slots)[None, None, :]
  p = q_pos[:, :, None]
  return (s <= p) & ((s < sink) | (s > p - window))


def ring_positions(sink: int, window: int, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Positions [B, sink + window] a ring holds after the prefill (the sinks and the last `window` before
  L-1) and whether each is committed and in its region."""
  recent = (lengths - 1 - window)[:, None] + jnp.arange(window)[None, :]
  sinks = jnp.broadcast_to(jnp.arange(sink), (lengths.shape[0], sink))
  pos = jnp.concatenate([sinks, recent], axis=1)
  in_region = jnp.concatenate([jnp.ones_like(sinks, bool), recent >= sink], axis=1)
  return pos, in_region & (pos >= 0) & (pos <= (lengths - 2)[:, None])


def copy_from_linear(ring: RingCache, sink: int, window: int, cache: KVCache, lengths: jax.Array) -> RingCache:
  """Fill a ring with the exact K/V of its sink and recent positions from a linear cache (slot ==
  position): the target's own (self drafts) or a draft network's windowed prefill."""
  pos, valid = ring_positions(sink, window, lengths)
  k, v = cache.gather(pos)
  return ring.write_committed(k, v, pos, valid)


def ring_key_positions(ring: RingCache, scratch_pos: jax.Array) -> jax.Array:
  """[B, slots] the position each slot of a ring holds this round: its static / ring slots' committed
  positions, the scratch nodes' positions, -1 for alignment slots (a target layer with a sliding window
  reads it to keep only the keys inside its window)."""
  pad = jnp.full((ring.pos.shape[0], ring.num_slots - ring.scratch_start - scratch_pos.shape[1]), -1, jnp.int32)
  return jnp.concatenate([ring.pos, scratch_pos.astype(jnp.int32), pad], axis=1)


def scratch_mask(ring: RingCache, sink: int, window: int, anc: jax.Array, q_pos: jax.Array,
                 scratch_pos: jax.Array, before: jax.Array) -> jax.Array:
  """[B, T, slots] visibility of a level's queries: committed ring slots (`RingCache.visible`), this
  round's scratch nodes that are their ancestors and inside the sink + window rule, alignment slots never.
  anc [T, N'] ancestor rows of the queries; scratch_pos [B, N'] the scratch nodes' positions."""
  sc = scratch_pos[:, None, :]
  sc_vis = anc[None] & ((sc < sink) | (sc > q_pos[:, :, None] - window)) & (sc >= 0)
  pad = jnp.zeros(sc_vis.shape[:2] + (ring.num_slots - ring.scratch_start - sc_vis.shape[2],), bool)
  return jnp.concatenate([ring.visible(q_pos, before), sc_vis, pad], axis=2)


# ------------------------------------------------------------------------------------------ tree levels

def choose_children(logits: jax.Array, r: Round, d, width: int, expanding: jax.Array,
                    node_tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
  """A level's child tokens [B, E, W] from its logits [B, E, V] at nodes `expanding` [E] (node_tokens
  [B, N]: the levels drawn so far), and the distribution recorded for verification. The logits go through
  the round's `scores` (the row features, then the sampling filter); then greedy: the top W, recording the
  scores; invariant sampling: the top W of the scores plus the level's position noise noise[:, d], the
  same noise the target's token there gets (argmax rows: of the scores alone); rejection sampling: q, the
  scores' probabilities the W children are drawn from without replacement (level d's keys
  fold_in(row key, 7919 + d); an argmax row's q is one-hot)."""
  nodes = Nodes(r.tree, node_tokens, expanding)
  s = r.scores(logits, nodes) if r.scores is not None else with_static_filter(Scores(logits), r.sampling)
  if r.sampling.greedy:
    return jax.lax.top_k(s.x, width)[1].astype(jnp.int32), s.x
  if r.sampling.noisy_argmax:
    return jax.lax.top_k(s.noisy(r.noise[:, d][:, None, :]), width)[1].astype(jnp.int32), s.x
  q = s.probabilities()
  level_keys = jax.vmap(lambda k: jax.random.fold_in(k, 7919 + d))(r.keys)
  keys_e = jax.vmap(lambda k: jax.random.split(k, logits.shape[1]))(level_keys)
  return sample_without_replacement(keys_e, q, width), q


def draft_levels(tree: Tree, level: Callable, carry: Any, unrolled: int) -> Any:
  """Run `level(carry, d, expanding [E], children [E, W]) -> carry` over the levels of `tree` that have
  children. Levels of different widths are unrolled; the trailing levels that expand one node into one
  child (a chain's levels, a Sequoia tree's tail), past the first `unrolled`, run as one fori_loop whose
  body compiles once (an unrolled 30-layer forward per level would compile a copy per level)."""
  n_nodes = tree.num_nodes
  levels = tree.levels[:-1]
  shapes = []
  for lvl in levels:
    expanding = np.asarray([u for u in lvl if tree.num_children[u] > 0], np.int32)
    width = int(tree.num_children[expanding].max())
    children = np.full((len(expanding), width), n_nodes, np.int32)
    for j, u in enumerate(expanding):
      children[j, :len(tree.children[u])] = tree.children[u]
    shapes.append((expanding, children))
  loop_from = len(levels)
  while loop_from > min(unrolled, len(levels)) and shapes[loop_from - 1][1].shape == (1, 1):
    loop_from -= 1
  for d, (expanding, children) in enumerate(shapes[:loop_from]):
    carry = level(carry, d, jnp.asarray(expanding), jnp.asarray(children))
  if loop_from < len(levels):     # level d expands node nodes[d] into kids[d]
    nodes = jnp.asarray(np.concatenate([e for e, _ in shapes[loop_from:]]))
    kids = jnp.asarray(np.concatenate([c[0] for _, c in shapes[loop_from:]]))
    carry = jax.lax.fori_loop(
        loop_from, len(levels),
        lambda d, c: level(c, d, nodes[d - loop_from][None], kids[d - loop_from][None, None]), carry)
  return carry
