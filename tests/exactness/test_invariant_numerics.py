"""Fixed-shape numerics (`numerics="invariant"`, layers/invariant.py): bitwise plain decoding in bfloat16.

The reference everywhere is plain autoregressive decoding of the same model (`generate(..., draft=None)`,
itself checked against HF and a full-forward argmax in test_generate.py / test_hf_parity.py): greedy and
drafter-invariant sampled output with any draft speculating a chain, in any batch, slot, order or refill
pattern, must equal it token for token. The first test is the root property at the level of one forward: a
verify pass's logits at each position are bitwise the logits plain decoding computes one token at a time.
Trees too: a node's ancestors are summed at the slots plain decoding holds them in (their depths), so a
Sequoia tree's nodes are bitwise the one-token steps along their paths.

The default run covers a tiny bfloat16 model (every draft) and SmolLM2-135M in bfloat16 (the bfloat16
mismatch's first reproduction: 4 held-out prompts of 512 tokens, a StreamingLLM chain of gamma 3); the full
matrix on SmolLM2 (8 x 512 + 256 new tokens, every chain draft, greedy and invariant sampling, rows alone,
reversed and through continuous batching) is marked slow. Sensitivity: with numerics="fast" the SmolLM2
forward test fails (its logits differ in the last bits), and 2 of the chain test's 4 rows leave plain
decoding within its 48 tokens; the tiny model's tests pass either way (its shapes are too small for XLA:CPU
to change algorithms), so they check that every draft's path runs through the invariant target, not the
numerics themselves.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import compile as compiling, feature_head
from magicdec_jax.cache import KVCache
from magicdec_jax.drafts import (FeatureDraft, ModelDraft, PromptLookupDraft, SnapKVDraft, StreamingDraft,
                                 truncate_layers)
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.model import Model, forward
from magicdec_jax.textdata import shakespeare_text
from magicdec_jax.trees import default_tree

from conftest import REAL_MODEL_XLA, random_prompts, tiny_model

NEW = 24
LENGTHS = (9, 16, 12, 14, 10)
SAMPLED = dict(temperature=0.8, top_p=0.95, sampling="invariant", seed=3)


def bf16(model: Model) -> Model:
  """The model with bfloat16 params and caches (the dtype every GPU user runs)."""
  cfg = dataclasses.replace(model.config, dtype="bfloat16")
  return Model(cfg, jax.tree.map(lambda a: a.astype(jnp.bfloat16), model.params), name=model.name + "-bf16")


@functools.lru_cache(maxsize=None)
def target() -> Model:
  return bf16(tiny_model(0, attn_scale=10.0, hidden=64, heads=4, kv_heads=2, layers=2))


def invariant_cfg(model: Model):
  return dataclasses.replace(model.config, numerics="invariant")


def _forward(params, cache, tokens, positions, slots, base, *, cfg, anc):
  return forward(params, cfg, tokens, positions, cache, slots, PrefixTree(base, np.asarray(anc, bool)))


def forward_pass(model, cfg, cache, tokens, positions, slots, base, anc):
  """forward(...) under PrefixTree(base, anc) -> (logits, cache), compiled as the engine compiles an invariant
  plan's executables (compile.jit_executable with the fixed shapes' compiler options; tokens, positions,
  slots and base are arguments, as in the engine's loop, so one executable per shape serves every step)."""
  args = (model.params, cache, tokens, jnp.asarray(positions), jnp.asarray(slots), jnp.asarray(base))
  static = dict(cfg=cfg, anc=tuple(map(tuple, np.asarray(anc, bool).tolist())))
  return compiling.jit_executable("test_forward", _forward, args, static,
                                  options=cfg.fixed.compiler_options())(*args)


@pytest.mark.parametrize("name", ["tiny", "smollm2"])
def test_verify_pass_logits_are_the_one_token_steps_bit_for_bit(name):
  """Positions 0..T-1 verified in one pass (T = 1, 3, 6, 11: one and several query tiles, one and several
  row tiles) give bitwise the logits and K/V that T one-token steps give, in bfloat16, for every row."""
  model = target() if name == "tiny" else md.load_model("smollm2-135m", dtype="bfloat16")
  if name == "smollm2":
    model = Model(dataclasses.replace(model.config, num_layers=2), dict(model.params, layers=model.params["layers"][:2]))
  cfg = invariant_cfg(model)
  rng = np.random.default_rng(0)
  b, base, slots = 3, 37, 256
  cache = KVCache.zeros(cfg, b, slots)
  cache = cache.replace(k=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.k),
                        v=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.v))
  tokens = jnp.asarray(rng.integers(0, min(cfg.vocab_size, 1000), (b, 11)), jnp.int32)
  bases = jnp.asarray([base, base + 5, base + 9], jnp.int32)

  def run(cache, start, t):
    pos = bases[:, None] + start + jnp.arange(t)[None]
    return forward_pass(model, cfg, cache, tokens[:, start:start + t], pos, pos, bases + start,
                        np.tri(t, dtype=bool))

  steps, c = [], cache
  for j in range(11):
    lg, c = run(c, j, 1)
    steps.append(np.asarray(lg[:, 0], np.float32))
  steps = np.stack(steps, 1)
  for t in (1, 3, 6, 11):
    lg, ct = run(cache, 0, t)
    np.testing.assert_array_equal(np.asarray(lg, np.float32), steps[:, :t], err_msg=f"T={t}")
    for layer in range(cfg.num_layers):
      for r in range(b):
        got = np.asarray(ct.k[layer][r, :, int(bases[r]):int(bases[r]) + t], np.float32)
        want = np.asarray(c.k[layer][r, :, int(bases[r]):int(bases[r]) + t], np.float32)
        np.testing.assert_array_equal(got, want, err_msg=f"T={t} layer {layer} row {r} keys")


def smol_layers(layers: int, dtype: str = "bfloat16") -> Model:
  model = md.load_model("smollm2-135m", dtype=dtype)
  return Model(dataclasses.replace(model.config, num_layers=layers),
               dict(model.params, layers=model.params["layers"][:layers]))


def random_cache(cfg, batch: int, slots: int, seed: int = 0) -> KVCache:
  rng = np.random.default_rng(seed)
  cache = KVCache.zeros(cfg, batch, slots)
  return cache.replace(k=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.k),
                       v=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.v))


def pass_logits(model, cfg, cache, tokens, positions, slots, base, anc):
  lg, _ = forward_pass(model, cfg, cache, tokens, positions, slots, base, anc)
  return np.asarray(lg, np.float32)


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_a_row_is_the_same_bits_alone_in_any_batch_and_at_any_slot_count(batch):
  """SmolLM2 (2 layers, bfloat16): chains of 4, 9 and 12 tokens verified in one pass (token-wise work in one
  and in several calls, attention in one and several query tiles) over a cache of 1024 slots give every
  row bitwise the one-token steps over a cache of 1536 slots holding the same prefix, in a batch of 1, 2
  or 8 rows; and row 0 alone gives the same bits as among the batch."""
  model = smol_layers(2)
  cfg = invariant_cfg(model)
  rng = np.random.default_rng(batch)
  small = random_cache(cfg, batch, 1024, seed=batch)
  big = small.replace(k=tuple(jnp.pad(c, ((0, 0), (0, 0), (0, 512), (0, 0))) for c in small.k),
                      v=tuple(jnp.pad(c, ((0, 0), (0, 0), (0, 512), (0, 0))) for c in small.v), length=1536)
  tokens = jnp.asarray(rng.integers(0, 49152, (batch, 12)), jnp.int32)
  base = jnp.asarray(rng.integers(500, 1000, (batch,)), jnp.int32)
  steps, c = [], big
  for j in range(12):
    pos = base[:, None] + j
    lg, c = forward_pass(model, cfg, c, tokens[:, j:j + 1], pos, pos, base + j, np.ones((1, 1), bool))
    steps.append(np.asarray(lg[:, 0], np.float32))
  steps = np.stack(steps, 1)
  for t in (4, 9, 12):          # batch 8: 32 token rows in one call; 72 = a loop of 2 tiles + 8; 96 = 3 tiles
    pos = base[:, None] + jnp.arange(t)[None]
    got = pass_logits(model, cfg, small, tokens[:, :t], pos, pos, base, jnp.tril(jnp.ones((t, t), bool)))
    np.testing.assert_array_equal(got, steps[:, :t], err_msg=f"batch {batch}, {t} tokens")
  alone = pass_logits(model, cfg, jax.tree.map(lambda x: x[:1], small), tokens[:1, :4], base[:1, None] +
                      jnp.arange(4)[None], base[:1, None] + jnp.arange(4)[None], base[:1],
                      jnp.tril(jnp.ones((4, 4), bool)))
  np.testing.assert_array_equal(alone, steps[:1, :4])


def assert_nodes_are_their_chains(model, cfg, cache, tree, nodes, base):
  """The tree's nodes [B, n] verified in one pass at slots base + index give each node bitwise the logits of
  the chain of its path verified alone."""
  n = tree.num_nodes
  got = pass_logits(model, cfg, cache, nodes, base[:, None] + jnp.asarray(tree.depths)[None],
                    base[:, None] + jnp.arange(n)[None], base, jnp.asarray(tree.ancestor_mask))
  for node in range(n):
    path = [node]
    while tree.parents[path[-1]] != -1:
      path.append(tree.parents[path[-1]])
    path = path[::-1]
    t = len(path)
    pos = base[:, None] + jnp.arange(t)[None]
    want = pass_logits(model, cfg, cache, nodes[:, jnp.asarray(path)], pos, pos, base,
                       jnp.tril(jnp.ones((t, t), bool)))[:, -1]
    np.testing.assert_array_equal(got[:, node], want, err_msg=f"node {node} (path {path})")


@pytest.mark.parametrize("name", ["sequoia16", "sequoia32"])
def test_a_tree_nodes_logits_are_the_chain_along_its_path_bit_for_bit(name):
  """A Sequoia tree verified in one pass (nodes at slots base + index, ancestors elsewhere than plain
  decoding holds them) gives every node bitwise the logits of the chain of its path (which the tests above
  equate with one-token steps), SmolLM2 (2 layers, bfloat16), 4 rows."""
  from magicdec_jax import trees
  tree = trees.build_default_tree(name)
  model = smol_layers(2)
  cfg = invariant_cfg(model)
  rng = np.random.default_rng(7)
  b, n = 4, tree.num_nodes
  cache = random_cache(cfg, b, 1024, seed=7)
  nodes = jnp.asarray(rng.integers(0, 49152, (b, n)), jnp.int32)
  base = jnp.asarray(rng.integers(400, 1024 - n - 1, (b,)), jnp.int32)
  assert_nodes_are_their_chains(model, cfg, cache, tree, nodes, base)


@pytest.mark.parametrize("cache_kind,window", [("ring", 40), ("ring", 5), ("linear", 40)])
def test_tree_nodes_on_windowed_layers_are_the_chain_along_their_paths(cache_kind, window):
  """The same on a sliding-window layer (SmolLM2's first layer given a window; the second stays global):
  held as a ring (cache.ring_sizes: the round's nodes overwrite slots of old positions, the tree's ancestors
  sit at other ring slots than their depths') and as a linear cache with a window mask. A window of 5 hides
  a deep node's first ancestors."""
  from magicdec_jax import trees
  from magicdec_jax.cache import ring_margin
  tree = trees.build_default_tree("sequoia16")
  model = smol_layers(2, "float32")
  cfg = dataclasses.replace(invariant_cfg(model), layer_windows=(window, 0))
  rng = np.random.default_rng(5)
  b, n = 3, tree.num_nodes
  cache = KVCache.zeros(cfg, b, 1024, ring_margin(n) if cache_kind == "ring" else None)
  assert cache.is_ring(0) == (cache_kind == "ring") and not cache.is_ring(1)
  cache = cache.replace(k=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.k),
                        v=tuple(jnp.asarray(rng.normal(size=c.shape) * 0.5, c.dtype) for c in cache.v))
  nodes = jnp.asarray(rng.integers(0, 49152, (b, n)), jnp.int32)
  base = jnp.asarray([300, 517, 1024 - n - 1], jnp.int32)     # the ring's slots wrap inside the last row's round
  assert_nodes_are_their_chains(model, cfg, cache, tree, nodes, base)



def at_xla_defaults(script: str, timeout: int) -> dict:
  """The JSON `script` prints last, run in a Python process at XLA's default compile settings (without the
  suite's XLA_FLAGS and its session compilation cache)."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "MAGICDEC_COMPILATION_CACHE")}
  r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1])


DEFAULT_FLAGS_SCRIPT = r"""
import json
import jax, numpy as np
import magicdec_jax as md
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params
out = {}
for hidden, hd, heads, kv in ((576, 64, 9, 3), (256, 128, 2, 1), (32, 8, 4, 2)):   # SmolLM2's; head dims 128, 8
  cfg = ModelConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=2, num_heads=heads,
                    num_kv_heads=kv, head_dim=hd, max_position_embeddings=512)
  params = init_params(cfg, jax.random.key(0), scale=0.5)
  params["layers"] = tuple(dict(lp, attn=jax.tree.map(lambda a: a * 10.0, lp["attn"])) for lp in params["layers"])
  model = Model(cfg, params, name=f"tiny-f32-hd{hd}")
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 64, n).tolist() for n in (300, 37)]
  kw = dict(max_new_tokens=16, temperature=0.0, eos_token_id=[], logprobs=True, numerics="invariant")
  runs = {"plain": md.generate(model, prompts, **kw),
          "chain": md.generate(model, prompts, draft=md.StreamingDraft(2, 4), gamma=3, **kw),
          "tree": md.generate(model, prompts, draft=md.StreamingDraft(2, 4),
                              tree=md.trees.default_tree("sequoia16"), **kw)}
  rows = {k: [{"tokens": t, "logprobs": [float(x) for x in lp]} for t, lp in zip(r.tokens, r.logprobs)]
          for k, r in runs.items()}
  alone = md.generate(model, prompts[1:], **kw)                 # one 64-token prefill chunk, not 256-token ones
  stream = {r.index: r for r in md.generate_stream(model, prompts, batch_size=1, **kw)}   # the second: a refill
  rows["alone"] = [{"tokens": r.tokens[0], "logprobs": [float(x) for x in r.logprobs[0]]} for r in (alone,)]
  rows["refilled"] = [{"tokens": stream[1].tokens, "logprobs": [float(x) for x in stream[1].logprobs]}]
  out[hd] = rows
print(json.dumps(out))
"""


def test_identity_holds_at_xla_default_flags():
  """The suite compiles at its own fast-compile flags (conftest.py); users compile at XLA's defaults. In a
  process without them, float32 models of SmolLM2's width and heads (576, 9 / 3 heads of 64: where XLA's own
  row reductions rounded a norm by its program), of head dim 128 and of head dim 8 (where a query tile of
  fewer than 8 rows rounded otherwise: FixedShapes.tile_floor): a chain's and a Sequoia tree's rows have
  plain decoding's tokens and log-probs bit for bit, and so has a row prefilled alone in a chunk of another
  size or refilled into a stream's slot (the prefill executable's own options, backend.CPU_PREFILL). (What
  still differs there: docs/decisions.md#identity-at-defaults.)"""
  for hd, runs in at_xla_defaults(DEFAULT_FLAGS_SCRIPT, timeout=900).items():
    plain = runs["plain"]
    assert runs["chain"] == plain, hd
    assert runs["tree"] == plain, hd
    assert runs["alone"] == plain[1:], hd
    assert runs["refilled"] == plain[1:], hd


NORM_SCRIPT = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from magicdec_jax import backend
from magicdec_jax.layers import rms_norm
from magicdec_jax.layers.invariant import tile_map
opts = backend.fixed_shapes().compiler_options()
rng = np.random.default_rng(0)
out = {}
for d in (384, 512, 576):
  g = jnp.asarray(1 + 0.1 * rng.standard_normal(d), jnp.float32)
  w = jnp.asarray(rng.standard_normal((2 * d, d)) * 0.05, jnp.float32)
  a, u = (jnp.asarray(rng.standard_normal((4, 4, n)), jnp.float32) for n in (d, 2 * d))
  residual = lambda a, u: a + tile_map(lambda u: jnp.einsum("btf,fd->btd", u, w), (9, 32), u)
  program = lambda a, u: tile_map(lambda x: rms_norm(x, g, 1e-5, fixed_order=True), (9, 32), residual(a, u))
  # the add fused into the norm (16 rows), or materialised and padded (4 rows to 9)
  rows = {t: np.asarray(jax.jit(program).lower(a[:, :t], u[:, :t]).compile(compiler_options=opts)(
      a[:, :t], u[:, :t]))[:, 0] for t in (1, 4)}
  x = np.asarray(jax.jit(residual)(a, u))[:, 0].astype(np.float64)
  ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * np.asarray(g, np.float64)
  out[d] = {"same_bits": bool((rows[1] == rows[4]).all()), "max_err": float(np.abs(rows[4] - ref).max())}
print(json.dumps(out))
"""


def test_norm_rounds_a_row_alike_in_any_program_at_xla_default_flags():
  """XLA:CPU's own row reduction vectorises by what is fused into it (at its default settings, not the suite's
  -O0): a norm computed right after a residual add in 16 rows and the same rows materialised and padded to 9
  rounded differently. The fixed-shape norm (`fixed_order`) sums in one order: the same bits in both
  programs, and within float32 rounding of a float64 numpy norm."""
  for d, res in at_xla_defaults(NORM_SCRIPT, timeout=300).items():
    assert res["same_bits"], d
    assert res["max_err"] < 1e-5, (d, res)


def head():
  return feature_head.init_head(target(), seed=1)


DRAFTS = {
    "chain1": lambda: dict(draft=StreamingDraft(sink=2, window=4), gamma=1),
    "chain3": lambda: dict(draft=StreamingDraft(sink=2, window=4), gamma=3),
    "chain6": lambda: dict(draft=StreamingDraft(sink=2, window=4), gamma=6),
    # 32 nodes, more than the canonical tail's 16 slots hold (only the depth must fit in them)
    "tree": lambda: dict(draft=StreamingDraft(sink=2, window=4), tree=default_tree("sequoia32")),
    "snapkv": lambda: dict(draft=SnapKVDraft(budget=6, window=2, observation_window=8, pool_kernel=5), gamma=3),
    "lookup": lambda: dict(draft=PromptLookupDraft(2), gamma=3),
    "model": lambda: dict(draft=ModelDraft(truncate_layers(target(), 1), sink=1, window=8), gamma=3),
    "feature": lambda: dict(draft=FeatureDraft(head(), sink=1, window=8), gamma=3),
}


@functools.lru_cache(maxsize=None)
def plain(sampled: bool):
  prompts = random_prompts(LENGTHS, 64, seed=11)
  return prompts, md.generate(target(), prompts, max_new_tokens=NEW, **(SAMPLED if sampled else {}))


@pytest.mark.heavy
@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_every_draft_gives_plain_decodings_tokens_in_bfloat16(draft):
  for sampled in (False, True):
    prompts, ref = plain(sampled)
    res = md.generate(target(), prompts, max_new_tokens=NEW, **DRAFTS[draft](), **(SAMPLED if sampled else {}))
    assert res.tokens == ref.tokens, (draft, sampled)


def test_rows_alone_reordered_and_refilled_give_the_batch_tokens():
  prompts, ref = plain(False)
  kw = dict(max_new_tokens=NEW, draft=StreamingDraft(sink=2, window=4), gamma=3)
  for i, p in enumerate(prompts[:2]):                                  # alone: batch 1, another slot count
    assert md.generate(target(), [p], max_new_tokens=NEW).tokens[0] == ref.tokens[i]
    assert md.generate(target(), [p], **kw).tokens[0] == ref.tokens[i]
  rev = md.generate(target(), prompts[::-1], **kw)                    # every row in another slot
  assert rev.tokens[::-1] == ref.tokens
  out = {r.index: r.tokens for r in md.generate_stream(target(), prompts, batch_size=2, **kw)}
  assert [out[i] for i in range(len(prompts))] == ref.tokens          # refills into freed slots


def test_an_adaptive_schedule_switching_inside_the_output_gives_plain_tokens():
  prompts, ref = plain(False)
  first = min(LENGTHS)
  res = md.generate(target(), prompts, max_new_tokens=NEW, draft=StreamingDraft(sink=2, window=4),
                    schedule=[(0, 2), (first + 6, 0), (first + 12, 3)])
  assert res.tokens == ref.tokens


def test_fast_numerics_is_accepted_and_close():
  """numerics="fast" decodes too (no identity promised: the same tokens up to bfloat16 rounding of the
  logits, asserted here only on the first tokens, where no rounding has yet compounded)."""
  prompts, ref = plain(False)
  res = md.generate(target(), prompts, max_new_tokens=NEW, numerics="fast", draft=StreamingDraft(2, 4), gamma=3)
  assert [t[:2] for t in res.tokens] == [t[:2] for t in ref.tokens]
  with pytest.raises(ValueError, match="numerics must be one of"):
    md.generate(target(), prompts, max_new_tokens=NEW, numerics="exact")


@functools.lru_cache(maxsize=None)
def smol():
  return md.load_model("smollm2-135m", dtype="bfloat16")


def held_out_prompts(n: int, tokens: int) -> list[list[int]]:
  text = shakespeare_text(60_000 + 5_000 * n, held_out=True)
  ids = smol().tokenizer.encode(text).ids
  return [ids[i * 2500:i * 2500 + tokens] for i in range(n)]


@pytest.mark.heavy
def test_smollm2_bfloat16_streaming_chain_gives_plain_decodings_tokens():
  """The bfloat16 mismatch as first reproduced (with the backend's own shapes 1 of 4 rows identical, first
  differences at tokens 30, 22, 14): 4 held-out prompts of 512 tokens, greedy, StreamingDraft(sink 4,
  window 64), gamma 3 (gamma 1 on SmolLM2 with the slow matrix below; on the tiny model by default)."""
  prompts = held_out_prompts(4, 512)
  ref = md.generate(smol(), prompts, max_new_tokens=48, xla_options=REAL_MODEL_XLA)
  res = md.generate(smol(), prompts, max_new_tokens=48, draft=StreamingDraft(4, 64), gamma=3,
                    xla_options=REAL_MODEL_XLA)
  assert res.tokens == ref.tokens
  assert 0.3 < res.stats["acceptance_rate"] < 1.0


SMOL_DRAFTS = {
    "chain1": lambda: dict(draft=StreamingDraft(4, 64), gamma=1),
    "chain3": lambda: dict(draft=StreamingDraft(4, 64), gamma=3),
    "sequoia16": lambda: dict(draft=StreamingDraft(4, 64), tree=default_tree("sequoia16")),
    "snapkv": lambda: dict(draft=SnapKVDraft(budget=128, window=64), gamma=3),
    "lookup": lambda: dict(draft=PromptLookupDraft(3), gamma=3),
    "model": lambda: dict(draft=ModelDraft(truncate_layers(smol(), 8), sink=4, window=64), gamma=3),
    "feature": lambda: dict(draft=FeatureDraft(feature_head.init_head(smol(), seed=1), sink=4, window=64), gamma=3),
}


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True])
def test_smollm2_bfloat16_every_draft_batch_and_refill(sampled):
  """The full matrix: 8 held-out prompts x 512 + 256 new tokens, every draft (chains, a Sequoia-16 tree,
  SnapKV, prompt lookup, a model draft, a feature head); then the rows alone, reversed, and through
  continuous batching with refills."""
  prompts = held_out_prompts(8, 512)
  kw = dict(max_new_tokens=256, xla_options=REAL_MODEL_XLA, **(SAMPLED if sampled else {}))
  ref = md.generate(smol(), prompts, **kw)
  differing = lambda tokens: [i for i in range(8) if tokens[i] != ref.tokens[i]]   # noqa: E731
  got = {}                              # every draft and batching, then one assertion naming each miss
  for name, draft in SMOL_DRAFTS.items():
    res = md.generate(smol(), prompts, **kw, **draft())
    got[name] = differing(res.tokens)
    print(f"{name}: acceptance {res.stats['acceptance_rate']:.3f}, rows differing {got[name]}")
  chain = SMOL_DRAFTS["chain3"]()             # a row samples by (seed, stream id, position): ids kept
  alone = md.generate(smol(), [prompts[5]], stream_ids=[5], **kw, **chain).tokens[0]
  got["alone"] = [] if alone == ref.tokens[5] else [5]
  got["reversed"] = differing(md.generate(smol(), prompts[::-1], stream_ids=list(range(8))[::-1], **kw,
                                          **chain).tokens[::-1])
  out = {r.index: r.tokens for r in md.generate_stream(smol(), prompts, batch_size=4, **kw, **chain)}
  got["stream"] = differing([out[i] for i in range(8)])
  assert not any(got.values()), got
