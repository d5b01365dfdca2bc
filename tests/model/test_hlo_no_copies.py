"""The compiled decode loop reads weights and KV caches where they lie.

From the optimized HLO of `loop.decode` (CPU), for autoregressive, chain (StreamingDraft), tree
(SnapKVDraft), model-draft and adaptive decoding (a schedule's plain round with a draft and its chain-1
variant, each loop returning where the schedule picks another: schedule.py) of a small model with distinctive dimensions: no op inside the
while-loop body produces a buffer shaped like a weight matrix or a layer's KV cache except the in-place
cache writes (magicdec_jax/tuning/hlo.py). A control with the old layout (a scan over stacked weights and a
stacked cache) must be flagged, so the check is known to see copies when they are there.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import magicdec_jax as md
from magicdec_jax import drafts, engine, loop, plan
from magicdec_jax.cache import KVCache
from magicdec_jax.prompts import pad_prompts
from magicdec_jax.tuning import hlo
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params
from magicdec_jax.trees import Tree
from conftest import compiled_decode

CFG = ModelConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_layers=3, num_heads=6,
                  num_kv_heads=2, head_dim=8, max_position_embeddings=512)
DRAFT_CFG = CFG.replace(num_layers=1, vocab_size=96)
B, P, NEW = 3, 64, 16


def big_shapes(params, *caches) -> set:
  shapes = {tuple(a.shape) for a in jax.tree.leaves(params) if a.ndim >= 2}
  for c in caches:
    if c is not None:
      shapes |= {tuple(a.shape) for a in c.k}
  return shapes


CASES = {
    "ar": (None, Tree((-1,))),
    "chain": (drafts.StreamingDraft(sink=2, window=8), Tree.chain(3)),
    "tree": (drafts.SnapKVDraft(budget=8, window=8, observation_window=4), Tree((-1, 0, 0, 1))),
    "model_draft": ("model", Tree.chain(2)),
    "adaptive_plain": (drafts.StreamingDraft(sink=2, window=8), Tree.chain(3)),
    "adaptive_chain1": (drafts.StreamingDraft(sink=2, window=8), Tree.chain(3)),
}
ADAPTIVE = (Tree((-1,)), Tree.chain(1), Tree.chain(3))        # the variants (the state sized for the last)
VARIANT = {"adaptive_plain": 0, "adaptive_chain1": 1}


@pytest.mark.parametrize("case,batch", [pytest.param(c, B, marks=pytest.mark.slow) if c == "ar" else (c, B)
                                        for c in CASES] + [("ar", 1), pytest.param("chain", 1, marks=pytest.mark.slow)])
def test_decode_loop_copies_no_weight_or_cache(case, batch):
  """batch 1 too: a one-row, one-token cache write once became a dynamic-update-slice that XLA duplicated
  out of place for the attention's operand (copies of every layer's cache each step)."""
  B = batch
  params = init_params(CFG, jax.random.key(0))
  spec, tree = CASES[case]
  dparams = None
  if spec == "model":
    dparams = init_params(DRAFT_CFG, jax.random.key(1))
    spec = drafts.ModelDraft(Model(DRAFT_CFG, dparams), sink=2, window=8).spec
  text, target, ring = compiled_decode(params, dparams, CFG, spec, tree, B, P, NEW,
                                       ADAPTIVE if case in VARIANT else None, VARIANT.get(case, 0))
  comps, bodies = hlo.while_body_computations(text)
  assert bodies, "no while loop found in the compiled decode"
  shapes = big_shapes(params, target, ring) | (big_shapes(dparams) if dparams is not None else set())
  bad = hlo.loop_body_copies(text, shapes)
  assert not bad, "\n".join(f"{i.op} {i.shape}: {i.line[:200]}" for i in bad)
  # no op re-reads a whole cache layer besides the attention dots, the commit's gather and the writes
  cache_shapes = {tuple(k.shape) for c in (target, ring) if c is not None for k in c.k}   # ring layers too
  passes = hlo.loop_body_cache_passes(text, cache_shapes)
  assert not passes, "\n".join(f"{i.op} {i.shape}: {i.line[:200]}" for i in passes)
  # the cache writes are really there, in place
  target_shapes = {tuple(k.shape) for k in target.k}
  writes = sum(1 for c in bodies for i in comps[c]
               if i.shape in target_shapes and i.op in ("fusion", "scatter"))
  assert writes >= 2 * CFG.num_layers


def test_detector_flags_the_stacked_layout():
  """Control: a scan over stacked weights and a stacked cache inside a while loop is flagged."""
  l, b, k, s, d, dm = 3, 2, 2, 128, 8, 48
  w = jax.random.normal(jax.random.key(0), (l, dm, dm))
  cache = jax.random.normal(jax.random.key(1), (l, b, k, s, d))

  def step(carry):
    i, x, c, w = carry

    def layer(x, xs):
      wl, cl = xs
      y = jnp.einsum("bd,de->be", x, wl)
      att = jnp.einsum("bksd,bkd->bks", cl, y[:, :k * d].reshape(b, k, d))
      return y + att.sum(), None

    x, _ = jax.lax.scan(layer, x, (w, c))
    return i + 1, x, c.at[:, :, :, i].set(1.0), w

  f = jax.jit(lambda x, c, w: jax.lax.while_loop(lambda t: t[0] < 4, step, (0, x, c, w)))
  text = f.lower(jnp.ones((b, dm)), cache, w).compile().as_text()
  flagged = {i.shape for i in hlo.loop_body_copies(text, {(dm, dm), (b, k, s, d)})}
  assert flagged == {(dm, dm), (b, k, s, d)}, f"the detector missed a per-layer slice: {flagged}"


def test_detector_flags_an_extra_pass_over_the_cache():
  """Control: a masked `where` over the cache (an elementwise pass inside the loop body) is flagged, while
  the dot reading the same cache is not."""
  b, k, s, d = 2, 2, 128, 8
  cache = jax.random.normal(jax.random.key(1), (b, k, s, d))

  def step(carry):
    i, x, c = carry
    masked = jnp.where(jnp.arange(s)[None, None, :, None] < i + 64, c, 0.0)
    y = jnp.einsum("bksd,bkd->bks", masked, x).sum(-1)[..., None] + x
    return i + 1, y, c.at[:, :, i].set(1.0)

  f = jax.jit(lambda x, c: jax.lax.while_loop(lambda t: t[0] < 4, step, (0, x, c)))
  text = f.lower(jnp.ones((b, k, d)), cache).compile().as_text()
  assert hlo.loop_body_cache_passes(text, {(b, k, s, d)}), "the detector missed a masked pass over the cache"

  def clean(carry):     # write first, then read (as the engine does): nothing to copy
    i, x, c = carry
    c = c.at[:, :, i].set(1.0)
    return i + 1, jnp.einsum("bksd,bkd->bks", c, x).sum(-1)[..., None] + x, c

  g = jax.jit(lambda x, c: jax.lax.while_loop(lambda t: t[0] < 4, clean, (0, x, c)))
  text = g.lower(jnp.ones((b, k, d)), cache).compile().as_text()
  assert not hlo.loop_body_cache_passes(text, {(b, k, s, d)})


def test_the_engines_own_executable_copies_nothing():
  """The executable the Engine runs (its plan's 1 x 1 mesh, in/out shardings, donated state) for a chain:
  the same checks as the bare loop above, so compiling on a mesh adds no copy of a weight or a cache."""
  model = Model(CFG, init_params(CFG, jax.random.key(0)))
  st = md.DecodeSettings(max_new_tokens=NEW, draft=drafts.StreamingDraft(sink=2, window=8), gamma=3,
                         numerics="fast")
  p = plan.make_plan(model, st, batch=B, shortest=P, longest=P)
  eng = engine.Engine(model, p)
  tokens, lengths = pad_prompts([[1] * P] * B, B, p.prompt_bucket(P))
  target, ring = eng.prefill(tokens, lengths, p.num_slots(p.prompt_bucket(P)))
  state = eng.initial_state(tokens, lengths, jnp.full((B,), NEW, jnp.int32),
                            jax.random.split(jax.random.key(0), B), target, ring)
  text = eng.compiled_text("decode", state)
  assert hlo.while_body_computations(text)[1], "no while loop found in the engine's decode"
  shapes = big_shapes(model.params, state.target, state.ring)
  bad = hlo.loop_body_copies(text, shapes)
  assert not bad, "\n".join(f"{i.op} {i.shape}: {i.line[:200]}" for i in bad)
  cache_shapes = {tuple(k.shape) for c in (state.target, state.ring) for k in c.k}
  assert not hlo.loop_body_cache_passes(text, cache_shapes)


def test_a_fresh_states_leaves_are_distinct_buffers():
  """loop.initial_state built outside jit (as benchmarks and prefilled inputs do) gives every leaf its own
  buffer: the decode loop donates each leaf, and a GPU refuses one buffer donated twice (XLA:CPU does not)."""
  tree = Tree.chain(3)
  st = loop.initial_state(jnp.zeros((B, P), jnp.int32), jnp.full((B,), P, jnp.int32), jnp.full((B,), NEW, jnp.int32),
                          jnp.array([-1], jnp.int32), jax.random.split(jax.random.key(0), B),
                          KVCache.zeros(CFG, B, 64), None, NEW + tree.num_nodes, tree)
  pointers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(st) if x.size]
  assert len(set(pointers)) == len(pointers)
