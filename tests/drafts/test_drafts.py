"""The draft's ring buffer is exact: at every draft step, across rollbacks, its logits equal a reference
that recomputes the whole sequence on a plain linear cache with an explicit sink + window mask."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax import ModelConfig, Model, init_params, drafts, loop
from magicdec_jax.cache import KVCache, RingCache
from magicdec_jax.drafts import Round
from magicdec_jax.layers.attention import DenseMask
from magicdec_jax.model import forward
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree

CFG = ModelConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, max_position_embeddings=256)
REF_LEN = 64


@functools.partial(jax.jit, static_argnames=("cfg", "sink", "window"))
def reference_logits(params, cfg, tokens, exact_upto, sink, window):
  """tokens [1, REF_LEN]; positions < exact_upto attend causally to everything (the target's exact K/V),
  later positions attend to the sink tokens and the last `window` positions only."""
  t = tokens.shape[1]
  p = jnp.arange(t)[:, None]
  s = jnp.arange(t)[None, :]
  windowed = (s <= p) & ((s < sink) | (s > p - window))
  mask = jnp.where(p < exact_upto, s <= p, windowed)[None]
  pos = jnp.arange(t, dtype=jnp.int32)[None]
  logits, _ = forward(params, cfg, tokens, pos, KVCache.zeros(cfg, 1, t), pos, DenseMask(mask))
  return logits[0]


def _models():
  target = Model(CFG, init_params(CFG, jax.random.key(1), scale=0.35))
  other = Model(CFG, init_params(CFG, jax.random.key(2), scale=0.35))
  return target, other


def _check_rounds(target, draft, tree, prompts, rounds=4):
  spec = draft.spec
  draft_params = draft.params(target)
  ref_params = target.params if draft_params is None else draft_params
  b = len(prompts)
  p_len = 16
  tokens = np.zeros((b, p_len), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  num_slots = p_len + 64 + tree.num_nodes
  tgt, ring = loop.prefill_with_draft(target.params, draft_params, jnp.asarray(tokens), lengths, cfg=CFG, spec=spec,
                                      tree=tree, num_slots=num_slots, chunk=16)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(b))
  state = loop.initial_state(jnp.asarray(tokens), lengths, jnp.full((b,), 40, jnp.int32),
                             jnp.asarray([-1], jnp.int32), keys, tgt, ring, 40 + tree.num_nodes, tree)
  greedy = Sampling()
  propose = jax.jit(lambda ring, last, prev, lengths, keys: spec.propose(
      ring, Round(tree, greedy, target.params, CFG, draft_params, last, prev, lengths, keys)))
  one_round = jax.jit(loop.decode_round, static_argnums=(3, 4, 5, 6, 7))
  exact = spec.uses_target_weights
  worst, rejected = 0.0, 0
  for _ in range(rounds):
    node_tokens, dlogits, _ = propose(state.ring, state.last, state.prev, state.lengths, keys)
    node_tokens, dlogits = np.asarray(node_tokens), np.asarray(dlogits)
    out, n_out, lens = np.asarray(state.out), np.asarray(state.n_out), np.asarray(state.lengths)
    for r in range(b):
      committed = list(prompts[r]) + out[r, :n_out[r]].tolist()
      assert len(committed) == lens[r]
      for u in range(tree.num_nodes):
        if tree.num_children[u] == 0:
          continue
        path, v = [], u
        while v > 0:
          path.append(int(node_tokens[r, v]))
          v = tree.parents[v]
        seq = committed + path[::-1]
        padded = np.zeros((1, REF_LEN), np.int32)
        padded[0, :len(seq)] = seq
        upto = lens[r] - 1 if exact else 0
        ref = np.asarray(reference_logits(ref_params, CFG, jnp.asarray(padded), upto, spec.sink, spec.window))
        err = np.abs(ref[len(seq) - 1] - dlogits[r, u]).max()
        worst = max(worst, err)
    state = one_round(state, target.params, draft_params, CFG, spec, tree, greedy, "xla")
    rejected += int(np.sum(np.asarray(state.rounds) * tree.max_depth - np.asarray(state.accepted)))
  return worst, rejected


PROMPTS = [[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2], [27, 18, 28, 1, 8]]


@pytest.mark.parametrize("sink,window", [(2, 3), pytest.param(0, 5, marks=pytest.mark.slow),
                                         pytest.param(4, 40, marks=pytest.mark.slow)])
def test_streaming_ring_equals_masked_full_attention(sink, window):
  target, _ = _models()
  worst, rejected = _check_rounds(target, drafts.StreamingDraft(sink, window), Tree.chain(3), PROMPTS)
  assert worst < 1e-4, worst
  if window > 30:   # the window covers the whole sequence: the draft is the target, nothing is rejected
    assert rejected == 0
  else:
    assert rejected > 0, "the sweep should include rollbacks"


def test_model_draft_ring_equals_masked_full_attention_tree():
  target, other = _models()
  tree = Tree((-1, 0, 0, 1, 1, 2, 3))
  worst, rejected = _check_rounds(target, drafts.ModelDraft(other, sink=1, window=4), tree, PROMPTS)
  assert worst < 1e-4, worst
  assert rejected > 0


def test_cache_positions_differ_from_absolute_beyond_the_window():
  """StreamingLLM cache positions move the sink keys closer, so they matter once p >= sink + window."""
  target, _ = _models()
  tree = Tree.chain(2)
  results = {}
  for positions in ("absolute", "cache"):
    d = drafts.StreamingDraft(2, 3, positions)
    tgt, ring = loop.prefill_with_draft(target.params, None, jnp.asarray([PROMPTS[0] + [0, 0, 0]]),
                                        jnp.asarray([len(PROMPTS[0])]), cfg=CFG, spec=d, tree=tree, num_slots=40,
                                        chunk=16)
    last, prev = jnp.asarray([PROMPTS[0][-1]]), jnp.asarray([PROMPTS[0][-2]])
    results[positions] = np.asarray(d.propose(ring, Round(tree, Sampling(), target.params, CFG, None, last, prev,
                                                          jnp.asarray([len(PROMPTS[0])]), jax.random.key(0)[None]))[1])
  assert np.abs(results["absolute"] - results["cache"]).max() > 1e-4   # fp32 noise is ~1e-7


def test_ring_write_keeps_only_the_latest_position_per_slot():
  """More positions committed at once than the window holds: each ring slot gets exactly one update,
  the latest position's, whatever order the positions come in (on GPU the winner among duplicate
  scatter indices is unspecified, so the loser must never be written). Numpy reference."""
  cfg = CFG.replace(num_layers=2)
  sink, window = 1, 3
  ring = RingCache.zeros(cfg, 2, sink=sink, num_static=sink, window=window, scratch=2)
  positions = np.array([[7, 6, 5, 4, 3, 0], [0, 2, 3, 4, 5, 9]], np.int32)   # descending / ascending
  valid = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], bool)           # row 1: 9 is not valid
  m = positions.shape[1]
  vals = [jnp.broadcast_to(jnp.asarray(positions + 100 * layer, jnp.float32)[:, None, :, None],
                           (2, cfg.num_kv_heads, m, cfg.head_dim)) for layer in range(cfg.num_layers)]
  out = ring.write_committed(tuple(vals), tuple(v + 0.5 for v in vals), jnp.asarray(positions),
                             jnp.asarray(valid))
  for row in range(2):
    want_pos = np.full(sink + window, -1)
    for p, ok in zip(positions[row], valid[row]):
      slot = p if p < sink else sink + p % window
      if ok and p > want_pos[slot]:
        want_pos[slot] = p
    np.testing.assert_array_equal(np.asarray(out.pos[row]), want_pos)
    for layer in range(cfg.num_layers):
      k = np.asarray(out.k[layer][row, :, :sink + window, :])
      v = np.asarray(out.v[layer][row, :, :sink + window, :])
      want_k = np.where(want_pos >= 0, want_pos + 100.0 * layer, 0.0)[None, :, None]
      want_v = np.where(want_pos >= 0, want_pos + 100.0 * layer + 0.5, 0.0)[None, :, None]
      np.testing.assert_array_equal(k, np.broadcast_to(want_k, k.shape))
      np.testing.assert_array_equal(v, np.broadcast_to(want_v, v.shape))


def test_snapkv_keeps_budget_positions_before_its_recent_window():
  """With exactly `budget` positions before the recent window (prompt = budget + window + 1 tokens), every
  layer and KV head keeps those and no other: the recent window's positions are not candidates (a static
  slot holding one counted its key twice and wasted a slot). Positions are found by matching each static
  slot's key against the target cache's keys, position by position."""
  from magicdec_jax import testing
  model = testing.random_tiny_model(0)
  budget, window, length = 19, 4, 24
  spec = drafts.SnapKVDraft(budget=budget, window=window, observation_window=6, pool_kernel=3)
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, size=(2, 32)), jnp.int32)   # (padded to 32)
  target, ring = loop.prefill_with_draft(model.params, None, tokens, jnp.full((2,), length, jnp.int32),
                                         cfg=model.config, spec=spec, tree=Tree.chain(2), num_slots=64, chunk=32)
  for layer in range(model.config.num_layers):
    tk, rk = np.asarray(target.k[layer]), np.asarray(ring.k[layer])
    for b in range(2):
      for h in range(model.config.num_kv_heads):
        held = {int(np.argmin(np.abs(tk[b, h, :length - 1] - key).sum(-1))) for key in rk[b, h, :budget]}
        assert held == set(range(length - 1 - window)), (layer, b, h, str(sorted(held)))
