"""Prefill a batch once, then decode it several ways from the same caches (the demo, the context sweep).

At long context the prefill costs far more than the decode being compared (8 x 4096 tokens: minutes on a
CPU), and comparing methods through separate `generate` calls prefills the same prompts again for each.
`prefill` runs the target's chunked prefill as one jitted call per chunk — a single executable, since the
chunk's start is traced — so a progress bar can follow it. `decode` copies the prefilled target cache,
builds the draft's ring from it (`loop.prefill_draft`: self drafts copy it, a model draft runs its own
windowed prefill) and runs the compiled decode loop: every method sees identical prompts and K/V.

Shared prefixes: leading chunks that every prompt has in common (several questions about one document,
several samples of one prompt) are prefilled once, for one row, and that row's K/V is copied to every
row; the rest of the prompts is then prefilled for the whole batch. The cache each row ends with holds the
same values as its own prefill (bit for bit with fixed-shape numerics; with fast numerics to float
rounding, as a 1-row matmul may round differently from an 8-row one), and decoding still reads every row's
own copy, so decode costs are unchanged. The prefill computes with the numerics its decodes will use (they
refuse others), so a decode gives `generate`'s output.

Executables go through the engine's bounded LRU (compile.py); compile seconds are reported apart.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from magicdec_jax import backend
from magicdec_jax import compile as compiling
from magicdec_jax import engine, generation, loop
from magicdec_jax.cache import KVCache, ring_margin
from magicdec_jax.model import Model
from magicdec_jax.options import check_count
from magicdec_jax.backend import FixedShapes
from magicdec_jax.plan import (bucket, cache_slots, check_attention_impl, make_plan, numerics_config,
                               numerics_options)
from magicdec_jax.prompts import pad_prompts, prompt_ids
from magicdec_jax.settings import DecodeSettings, decode_settings

MAX_TREE_NODES = 16     # room left in the cache for any chain / tree up to this many nodes


@dataclasses.dataclass
class Prefilled:
  """A prefilled batch: prompts padded to [B, P], the target cache after the prefill, and its timing."""
  tokens: jax.Array        # [B, P] int32, right-padded
  lengths: jax.Array       # [B] int32
  target: KVCache          # slots 0..P-1 hold the prompts' K/V; room for max_new_tokens + a tree after it
  chunk: int               # prefill chunk (P is a multiple of it)
  num_prompts: int         # real rows (B may be padded)
  max_new_tokens: int
  prefill_s: float         # seconds without compilation
  compile_s: float
  shared_tokens: int = 0   # leading prompt tokens common to every prompt, prefilled once for all rows
  model: Any = None        # the Model prefilled with (decode refuses another: its cache holds this one's K/V)
  numerics: str = "fast"   # the numerics the K/V were computed with (decode's default; it refuses others)
  fixed: FixedShapes | None = None   # invariant numerics' shapes the K/V were computed at (likewise)

  @property
  def batch(self) -> int:
    return int(self.tokens.shape[0])


def shared_chunks(ids: Sequence[Sequence[int]], chunk: int) -> int:
  """How many leading `chunk`-token chunks all prompts `ids` have in common (0 for a single prompt)."""
  if len(ids) < 2:
    return 0
  m = min(len(r) for r in ids)
  arr = np.asarray([r[:m] for r in ids])
  same = (arr == arr[0]).all(axis=0)
  common = m if same.all() else int(np.argmin(same))
  return common // chunk


def _copy_row(cache: KVCache, *, rows: int) -> KVCache:
  """A 1-row cache -> the same K/V in each of `rows` rows (new buffers)."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (rows,) + x.shape[1:]), cache)


def prefill(model: Model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, chunk: int = 256,
            max_tree_nodes: int = MAX_TREE_NODES, share_prefix: bool = True, progress: bool = True,
            attention_impl: str = "auto", options: dict | None = None, numerics: str | None = None,
            fixed_shapes: FixedShapes | None = None) -> Prefilled:
  """Prefill token-id prompts (ragged is fine) chunk by chunk, with a progress bar over the tokens computed.

  share_prefix: leading chunks common to every prompt are computed once (one row) and copied to all rows.
  numerics, fixed_shapes: as DecodeSettings' (None: the backend's), compiled with their prefill options, so
  the K/V are those `generate` computes with the same settings.
  """
  ids = prompt_ids(model, list(prompts))
  st = DecodeSettings(max_new_tokens=1, numerics=numerics, fixed_shapes=fixed_shapes)   # checks both
  cfg = numerics_config(model.config, st)
  for name, v in (("max_new_tokens", max_new_tokens), ("chunk", chunk), ("max_tree_nodes", max_tree_nodes)):
    check_count(name, v, 1)
  max_new_tokens, chunk, max_tree_nodes = int(max_new_tokens), int(chunk), int(max_tree_nodes)
  if not isinstance(progress, bool) or not isinstance(share_prefix, bool):
    raise ValueError(f"progress and share_prefix must be True or False, got {progress!r}, {share_prefix!r}")
  check_attention_impl(attention_impl)
  longest = max(len(p) for p in ids)
  if longest + max_new_tokens > cfg.max_position_embeddings:
    raise ValueError(f"{longest} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's context "
                     f"of {cfg.max_position_embeddings}")
  n = len(ids)
  b = bucket(n, 1)
  p = -(-longest // chunk) * chunk
  multiple = (cfg.fixed or backend.fixed_shapes()).cache_multiple       # fast numerics: the backend's too
  num_slots = cache_slots(p, max_new_tokens, max_tree_nodes, multiple)
  tokens, lengths = pad_prompts(ids, b, p)
  shared = shared_chunks(ids, chunk) if share_prefix else 0
  compiling.ensure_persistent_cache()
  options = compiling.engine_options(backend.merged_options(numerics_options(cfg, prefill=True), options or {}))
  c0 = compiling.compile_seconds()
  row_lengths = lambda rows: jnp.asarray(lengths[:rows] if rows == b else [min(lengths[:n])], jnp.int32)
  step_args = lambda cache, rows, c: (model.params, cache, jnp.asarray(tokens[:rows, c * chunk:(c + 1) * chunk]),
                                      jnp.int32(c * chunk), row_lengths(rows))
  step_for = lambda cache, rows: compiling.jit_executable(
      "prefill_chunk", loop.prefill_chunk, step_args(cache, rows, 0), {"cfg": cfg, "impl": attention_impl},
      options=options,
      donate_argnames=("cache",))
  cache = KVCache.zeros(cfg, 1 if shared else b, num_slots, ring_margin(max_tree_nodes, chunk))
  step = step_for(cache, 1 if shared else b)
  compile_s = compiling.compile_seconds() - c0
  t0 = time.perf_counter()

  def widen(cache):
    """The 1-row cache copied to all b rows, and the b-row chunk step (compile time kept out of t0)."""
    nonlocal compile_s, t0
    c1 = compiling.compile_seconds()
    cache = compiling.jit_executable("prefill_copy_row", _copy_row, (cache,), {"rows": b}, options=options)(cache)
    step = step_for(cache, b)
    compile_s += compiling.compile_seconds() - c1
    t0 += compiling.compile_seconds() - c1
    return cache, step
  desc = f"prefill {n} x {longest} tokens" + (f" ({shared * chunk} shared, computed once)" if shared else "")
  with tqdm(total=shared * chunk + (p // chunk - shared) * chunk * b, desc=desc, unit="tok",
            disable=not progress, leave=False) as bar:
    for c in range(p // chunk):
      if shared and c == shared:                 # the common prefix is done: copy it to every row
        cache, step = widen(cache)
      rows = 1 if c < shared else b
      cache = step(*step_args(cache, rows, c))
      jax.block_until_ready(cache.k[-1])
      bar.update(rows * chunk)
    if cache.k[0].shape[0] != b:                 # every chunk was shared (identical prompts)
      cache, _ = widen(cache)
  return Prefilled(jnp.asarray(tokens), jnp.asarray(lengths), cache, chunk, n, int(max_new_tokens),
                   time.perf_counter() - t0, compile_s, shared * chunk, model, cfg.numerics, cfg.fixed)


def decode(model: Model, pre: Prefilled, *, settings: DecodeSettings | None = None, options: dict | None = None,
           shrink_batch: bool = False, row_sampling=None, json_schema=None, regex=None, choices=None,
           **kwargs) -> engine.GenerateResult:
  """Decode the prefilled batch (its caches are copied, so it can be decoded again). Settings, row_sampling,
  json_schema / regex / choices and result as `generation.generate`'s (max_new_tokens defaults to the
  prefill's room, numerics and fixed_shapes to the prefill's, and others are refused; "auto" is planned for
  this batch and its contexts); `stats["ring_s"]` is the time taken to build the draft's cache."""
  if pre.model is not None and (model.config != pre.model.config or model.params is not pre.model.params):
    raise ValueError(f"prefilled.decode: model {model.name!r} is not the one this batch was prefilled with "
                     f"({pre.model.name!r}: its config or its params differ); prefill with it")
  if settings is None:
    kwargs.setdefault("max_new_tokens", pre.max_new_tokens)
    if kwargs.get("numerics") is None:
      kwargs["numerics"] = pre.numerics
    if kwargs.get("fixed_shapes") is None and kwargs["numerics"] == pre.numerics:
      kwargs["fixed_shapes"] = pre.fixed
  if options is not None:
    kwargs["xla_options"] = options
  st = decode_settings(settings, **kwargs)
  if st.numerics != pre.numerics:
    raise ValueError(f"prefilled.decode: numerics={st.numerics!r}, but the batch was prefilled with "
                     f"numerics={pre.numerics!r} (its K/V would not be the ones generate computes); prefill with "
                     f"numerics={st.numerics!r}, or decode with numerics={pre.numerics!r} (a DecodeSettings: "
                     f"settings.replace(numerics={pre.numerics!r}))")
  fixed = numerics_config(model.config, st).fixed
  if fixed != pre.fixed:
    raise ValueError(f"prefilled.decode: fixed_shapes={fixed!r:.200} differ from the prefill's {pre.fixed!r:.200} "
                     f"(its K/V would not be the ones generate computes); prefill with fixed_shapes= the same")
  st, rows_o = generation.with_row_sampling(st, row_sampling, pre.num_prompts)
  st, rows_o = generation.with_constraint(st, rows_o, pre.num_prompts, model, json_schema=json_schema, regex=regex,
                                      choices=choices)
  if not 1 <= st.max_new_tokens <= pre.max_new_tokens:
    raise ValueError(f"max_new_tokens must be in [1, {pre.max_new_tokens}] (the prefill's room), got "
                     f"{st.max_new_tokens}")
  b, n = pre.batch, pre.num_prompts
  lengths = np.asarray(pre.lengths)[:n]
  p = make_plan(model, st, batch=n, shortest=int(lengths.min()), longest=int(lengths.max()), fixed_batch=True)
  engine.check_shrink_batch(shrink_batch, p)
  if p.tree.num_nodes > pre.target.num_slots - int(pre.tokens.shape[1]) - bucket(pre.max_new_tokens):
    raise ValueError(f"tree of {p.tree.num_nodes} nodes does not fit the prefill's room")
  eng = engine.Engine(model, p)
  if rows_o is not None:
    eng.fit(rows_o)
  budget = np.zeros((b,), np.int32)
  budget[:n] = st.max_new_tokens
  keys = engine.stream_keys(st.seed, range(n), b)

  def ring():
    target = jax.tree.map(jnp.copy, pre.target)
    return target, eng.prefill_draft(target, pre.tokens, pre.lengths, pre.chunk)
  (target, draft_ring), ring_s, ring_compile_s = compiling.timed(ring)
  # the out buffer is sized for the prefill's room, so a shorter budget reuses one executable
  opts = generation.padded(rows_o, b)
  feats = None if opts is None else eng.feature_rows(opts)
  fin, decode_s, decode_compile_s = compiling.timed(lambda: eng.run(eng.initial_state(
      pre.tokens, jnp.array(pre.lengths), jnp.asarray(budget), keys, target, draft_ring, feats), shrink_batch))
  res = eng.result(fin, n, pre.prefill_s, decode_s)
  res.stats.update(ring_s=ring_s, compile_s=ring_compile_s + decode_compile_s, prefill_compile_s=pre.compile_s,
                   decode_compile_s=decode_compile_s)
  return res
