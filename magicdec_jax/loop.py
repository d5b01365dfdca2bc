"""The compiled core: chunked prefill and one `lax.while_loop` for autoregressive, chain and tree decoding.

One round: propose (a draft fills the tree; autoregressive = the root-only tree, nothing proposed) ->
verify (one target pass over the tree with a prefix + ancestor mask) -> accept (verify.py) -> commit
(compact the accepted path into the target cache, refresh the draft ring, write tokens at per-row
offsets) -> stop (per-row EOS / max_new_tokens). Every row advances on its own; finished rows freeze.
The row features compiled in (row_features/: per-row sampling, ...) transform the logits the draft draws
its proposals from and the target's that acceptance reads (`row_features.scores_at`), then see the
round's emitted tokens (`row_features.end_and_advance`: their states move, and a feature may end a row).
With several `variants` (adaptive speculation, schedule.py) the loop of one variant returns before a round
the schedule gives another, and the host re-enters that variant's executable (a `lax.switch` of whole
rounds copied the caches every round); a plain-decoding round with a draft still commits its token to the
draft's ring, so the ring holds the recent window when speculation switches on.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import row_features
from magicdec_jax import schedule as sched_lib
from magicdec_jax.cache import KVCache, ring_margin
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts.base import DraftSpec, Prefill, Round
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.layers.prefill_attention import CausalChunk
from magicdec_jax.loop_state import LoopState, Rows, Shared, fresh_rows
from magicdec_jax.model import forward
from magicdec_jax.row_features import Nodes
from magicdec_jax.sampling import Sampling, Scores, position_noise
from magicdec_jax.trees import Tree
from magicdec_jax.verify import accept, simulated_walk

__all__ = ["LoopState", "Rows", "Shared", "decode", "decode_round", "draft_config", "initial_state", "path_logprobs",
           "prefill", "prefill_chunk", "prefill_draft", "prefill_with_draft"]


def prefill_chunk(params, cache: KVCache, tokens: jax.Array, start: jax.Array, lengths: jax.Array | None = None,
                  *, cfg: ModelConfig, impl: str = "xla") -> KVCache:
  """Write the target's K/V of one chunk tokens [B, T] at slots start..start+T-1 (start a multiple of T;
  traced, so one executable serves every chunk of a prompt), computing only the causal triangle.
  lengths [B]: positions at or past a row's length (padding) are not written (a ring layer would lose
  keys its row still needs to them); None: every position is a real token."""
  b, t = tokens.shape
  pos = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
  slots = pos if lengths is None else jnp.where(pos < lengths[:, None], pos, cache.num_slots)
  _, cache = forward(params, cfg, tokens, pos, cache, slots, CausalChunk(jnp.asarray(start, jnp.int32)),
                     impl=impl, compute_logits=False)
  return cache


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots", "margin", "chunk", "impl"))
def prefill(target_params, tokens: jax.Array, lengths: jax.Array, *, cfg: ModelConfig, num_slots: int,
            margin: int, chunk: int, impl: str = "xla") -> KVCache:
  """tokens [B, P] right-padded prompts (P a multiple of `chunk`), lengths [B] -> the target's KVCache of
  `num_slots` slots. Positions 0..L-2 of each row are encoded; the last prompt token stays pending.
  Windowed layers are rings of `margin` slots beyond their window (cache.ring_margin). The draft's ring is
  `prefill_draft`'s: a plain run and a speculative one with the same shapes share this executable."""
  def body(cache, c):
    toks = jax.lax.dynamic_slice_in_dim(tokens, c * chunk, chunk, axis=1)
    return prefill_chunk(target_params, cache, toks, c * chunk, lengths, cfg=cfg, impl=impl), None

  empty = KVCache.zeros(cfg, tokens.shape[0], num_slots, margin)
  target, _ = jax.lax.scan(body, empty, jnp.arange(tokens.shape[1] // chunk, dtype=jnp.int32))
  return target


@functools.partial(jax.jit, static_argnames=("cfg", "spec", "tree", "chunk"))
def prefill_draft(target_params, draft_params, target: KVCache, tokens: jax.Array, lengths: jax.Array, *,
                  cfg: ModelConfig, spec: DraftSpec | None, tree: Tree, chunk: int):
  """The draft's ring for prompts whose target cache is prefilled (None without a draft)."""
  if spec is None:
    return None
  cfg = draft_config(cfg)
  ring = spec.empty_ring(cfg, tokens.shape[0], tree, target.num_slots)
  return spec.prefill_ring(ring, Prefill(target_params, draft_params, cfg, target, tokens, lengths, tree, chunk))


def prefill_with_draft(target_params, draft_params, tokens: jax.Array, lengths: jax.Array, *, cfg: ModelConfig,
                       spec: DraftSpec | None, tree: Tree, num_slots: int, chunk: int, impl: str = "xla"):
  """`prefill`, then `prefill_draft`: (the target's KVCache, the draft's ring or None), the windowed layers'
  rings sized for `tree` (the engine runs the two as separate executables)."""
  target = prefill(target_params, tokens, lengths, cfg=cfg, num_slots=num_slots,
                   margin=ring_margin(tree.num_nodes, chunk), chunk=chunk, impl=impl)
  return target, prefill_draft(target_params, draft_params, target, tokens, lengths, cfg=cfg, spec=spec, tree=tree,
                               chunk=chunk)


def draft_config(cfg: ModelConfig) -> ModelConfig:
  """The config a draft computes with: the target's, without fixed-shape numerics (only the target's
  numbers decide the tokens, so the draft keeps its fastest dots)."""
  return dataclasses.replace(cfg, numerics="fast") if cfg.invariant else cfg


def path_logprobs(scores: Scores, path: jax.Array, emitted: jax.Array, k: int):
  """Log-probabilities of the tokens a round emits, from its verify pass: emitted token i [B, D+1] is
  drawn at the accepted path's node path[:, i], whose scores [B, N, V] (after the row features and the
  sampling filter) give its distribution: greedy rows the model's log_softmax, sampled rows the log of
  the filtered distribution p they are drawn from (not the residual a rejected position's token comes
  from: its probability under p is what a user asks for).
  -> (logprob [B, D+1], and with k > 0 the k most likely tokens [B, D+1, k] and their log-probs)."""
  at = jnp.take_along_axis(scores.x, path[:, :, None], axis=1)                      # [B, D+1, V]
  logp = Scores(at).log_probabilities()
  chosen = jnp.take_along_axis(logp, jnp.maximum(emitted, 0)[:, :, None], axis=2)[:, :, 0]
  if k <= 0:
    return chosen, None, None
  top_lp, top_ids = jax.lax.top_k(logp, k)
  return chosen, top_ids.astype(jnp.int32), top_lp


def decode_round(state: LoopState, target_params, draft_params, cfg: ModelConfig, spec, tree: Tree,
                 sampling: Sampling, impl: str) -> LoopState:
  """One round of the loop for every row: propose `tree` with `spec` (none: a plain step), verify it in one
  target pass, accept and commit, write the emitted tokens. The `while_loop` body of `decode`, public so that
  a round can be stepped from the host (tests compare a round against a reference one at a time)."""
  rs, sh = state.rows, state.shared
  b = rs.lengths.shape[0]
  rows = jnp.arange(b)
  if sampling.per_row and "sampling" not in rs.features:
    raise ValueError("a per-row Sampling needs the state's per-row sampling rows (initial_state features)")
  keys = jax.vmap(jax.random.fold_in)(rs.keys, rs.rounds)   # the row's own round: slot-independent
  draft_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
  verify_keys = jax.vmap(lambda k: jax.random.fold_in(k, 2))(keys)
  base = rs.lengths - 1
  ring, q, noise = state.ring, None, None
  if sampling.noisy_argmax:     # invariant: the noise of the tokens at positions L .. L + D, shared by all
    noise = position_noise(rs.keys, rs.lengths[:, None] + jnp.arange(tree.max_depth + 1)[None, :],
                           cfg.vocab_size)
  scores_at = functools.partial(row_features.scores_at, rs.features, sampling)
  r = Round(tree, sampling, target_params, draft_config(cfg), draft_params, rs.last, rs.prev, rs.lengths,
            draft_keys, noise=noise, scores=scores_at, masks=row_features.masks(rs.features))
  if spec is None or tree.num_nodes == 1:    # plain decoding (with a draft: a plain round of a schedule)
    node_tokens = rs.last[:, None]
  else:
    node_tokens, draft_dist, ring = spec.propose(ring, r)
    if not (sampling.greedy or sampling.noisy_argmax):
      q = draft_dist          # already transformed and filtered: the q the draft sampled from
  n_nodes = tree.num_nodes
  positions = base[:, None] + jnp.asarray(tree.depths)[None, :]
  slots = base[:, None] + jnp.arange(n_nodes)[None, :]      # virtual: a ring layer keeps them at slot % R
  logits, target, *feats = forward(target_params, cfg, node_tokens, positions, state.target, slots,
                                   PrefixTree(base, np.asarray(tree.ancestor_mask, bool)), impl=impl,
                                   feature_layers=() if spec is None else spec.feature_layers)
  scores = scores_at(logits, Nodes(tree, node_tokens, jnp.arange(n_nodes, dtype=jnp.int32)))
  if sampling.greedy:
    path, n, nxt, acc_at = accept(tree, True, scores.x, None, node_tokens, verify_keys)
  elif sampling.noisy_argmax:   # the target's token at each node: argmax of its scores + that noise
    path, n, nxt, acc_at = accept(tree, True, scores.noisy(noise[:, np.asarray(tree.depths)]), None, node_tokens,
                                  verify_keys)
  else:   # (argmax rows: one-hot p and q, so acceptance is the greedy comparison)
    path, n, nxt, acc_at = accept(tree, False, scores.probabilities(), q, node_tokens, verify_keys)
  if sampling.simulated_acceptance and tree.max_depth:     # a benchmark's acceptance: the path replaced
    sim_path, sim_n, acc_at = simulated_walk(tree, sampling.simulated_acceptance, verify_keys)
    path, n = sim_path.astype(path.dtype), sim_n.astype(n.dtype)
  if not tree.is_chain:   # move the accepted path's K/V to consecutive (virtual) slots (a chain already is)
    k, v = target.gather(base[:, None] + path)
    target = target.put(base[:, None] + jnp.arange(path.shape[1])[None, :], k, v)
  if spec is not None:
    ring = spec.commit(ring, dataclasses.replace(r, target=target, path=path, n=n, node_tokens=node_tokens,
                                                 features=feats[0] if feats else None))

  # tokens emitted this round: the accepted candidates, then the bonus / residual token
  i = jnp.arange(path.shape[1])[None, :]
  cand = jnp.take_along_axis(node_tokens, path[:, 1:], axis=1)                  # [B, D]
  cand = jnp.concatenate([cand, jnp.zeros((b, 1), jnp.int32)], axis=1)
  emitted = jnp.where(i < n[:, None], cand, jnp.where(i == n[:, None], nxt[:, None], -1))
  is_eos = (emitted[:, :, None] == sh.eos[None, None, :]).any(-1) & (i <= n[:, None])
  hit_eos = is_eos.any(-1)
  count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=-1) + 1, n + 1)
  count = jnp.minimum(count, rs.max_new - rs.n_out)
  active = ~rs.done
  count = jnp.where(active, count, 0)
  count, ended, features = row_features.end_and_advance(rs.features, emitted, count)
  finished = hit_eos | (ended if ended is not None else False)
  write_at = jnp.where(i < count[:, None], rs.n_out[:, None] + i, rs.out.shape[1])
  out = rs.out.at[rows[:, None], write_at].set(emitted, mode="drop")
  lp = {}
  if rs.out_logprob.shape[1]:    # static shapes: without the buffers, the round computes none of this
    k = rs.out_top_ids.shape[2]
    chosen, top_ids, top_lp = path_logprobs(scores, path, emitted, k)
    lp["out_logprob"] = rs.out_logprob.at[rows[:, None], write_at].set(chosen, mode="drop")
    if k:
      lp["out_top_ids"] = rs.out_top_ids.at[rows[:, None], write_at].set(top_ids, mode="drop")
      lp["out_top_logprob"] = rs.out_top_logprob.at[rows[:, None], write_at].set(top_lp, mode="drop")
  n_out = rs.n_out + count
  prev_tok = jnp.where(n > 0, jnp.take_along_axis(emitted, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0], rs.last)
  rs = rs.replace(
      out=out, n_out=n_out,
      lengths=jnp.where(active, rs.lengths + n + 1, rs.lengths),
      last=jnp.where(active, nxt, rs.last), prev=jnp.where(active, prev_tok, rs.prev),
      done=rs.done | (active & (finished | (n_out >= rs.max_new))),
      rounds=rs.rounds + active, accepted=rs.accepted + jnp.where(active, n, 0),
      drafted=rs.drafted + jnp.where(active, tree.max_depth, 0),
      accepted_at=rs.accepted_at + jnp.pad(acc_at & active[:, None],
                                           ((0, 0), (0, rs.accepted_at.shape[1] - acc_at.shape[1]))),
      features=features, **lp)
  return LoopState(rs, target, ring, sh.replace(step=sh.step + 1))


@functools.partial(jax.jit, static_argnames=("cfg", "spec", "tree", "sampling", "impl", "variants", "variant"),
                   donate_argnames=("state",))
def decode(target_params, draft_params, state: LoopState, *, cfg: ModelConfig, spec, tree: Tree,
           sampling: Sampling, impl: str = "xla", variants: tuple[Tree, ...] | None = None,
           variant: int = 0) -> LoopState:
  """Run rounds until `state.refill_at` rows are done (all of them: refill_at = B) or `state.step` reaches
  `state.sched.limit`: one `lax.while_loop`, no host round trip. Every active row emits >= 1 token a
  round, so no row runs more than M rounds. variants: the settings of an adaptive schedule (the state
  sized for `tree`, the widest): this executable runs `variants[variant]` and also returns before a round
  for which the schedule picks another (schedule.run re-enters that one's executable); None: `tree`.
  Log-probabilities are written where the state has room for them (initial_state's `logprobs`): the
  buffers' static shapes decide, so a state without them compiles the loop without them."""
  max_rounds = state.out.shape[1]
  variants = (tree,) if variants is None else tuple(variants)

  def cond(s):
    go = (s.done.sum() < s.refill_at) & (s.rounds.max() < max_rounds) & (s.step < s.sched.limit)
    if len(variants) > 1:
      go &= sched_lib.pick(s.sched, sched_lib.context(s.lengths, s.done)) == variant
    return go

  def body(s):
    v = jnp.asarray(variant, jnp.int32)
    s = s.replace(sched=sched_lib.record(s.sched, v, sched_lib.context(s.lengths, s.done), s.step))
    return decode_round(s, target_params, draft_params, cfg, spec, variants[variant], sampling, impl)

  return jax.lax.while_loop(cond, body, state)


def initial_state(tokens: jax.Array, lengths: jax.Array, max_new: jax.Array, eos: jax.Array,
                  keys: jax.Array, target: KVCache, ring: Any, out_len: int,
                  tree: Tree, num_variants: int = 1, logprobs: int = -1,
                  features: dict | None = None) -> LoopState:
  """The loop state of prefilled rows tokens [B, P] / lengths [B]. logprobs (static: settings.logprob_width)
  sizes the log-probability buffers: -1 off ([B, 0] placeholders: the loop compiles as without them), 0 the
  emitted tokens' only, k > 0 also k alternatives per position. features: the row features compiled in,
  name -> its rows' state [B, ...] (row_features.fill; None: none)."""
  b = tokens.shape[0]
  rows = fresh_rows(tokens, lengths, max_new, keys, out_len=out_len, depth=tree.max_depth, logprobs=logprobs,
                    features=features)
  shared = Shared(eos=eos, step=jnp.zeros((), jnp.int32), refill_at=jnp.asarray(b, jnp.int32),
                  sched=sched_lib.empty(num_variants))
  return LoopState(rows, target, ring, shared)
