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
same values as its own prefill (to float rounding: a 1-row matmul may round differently from an 8-row
one), and decoding still reads every row's own copy, so decode costs are unchanged.

Executables go through the engine's bounded LRU (compile.py); compile seconds are reported apart.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from magicdec_jax import compile as compiling
from magicdec_jax import drafts, engine, loop
from magicdec_jax.cache import KVCache, aligned_slots
from magicdec_jax.model import Model
from magicdec_jax.trees import Tree

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
            options: dict | None = None) -> Prefilled:
  """Prefill token-id prompts (ragged is fine) chunk by chunk, with a progress bar over the tokens computed.

  share_prefix: leading chunks common to every prompt are computed once (one row) and copied to all rows.
  """
  ids = engine.prompt_ids(model, list(prompts))
  cfg = model.config
  if not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
  longest = max(len(p) for p in ids)
  if longest + max_new_tokens > cfg.max_position_embeddings:
    raise ValueError(f"{longest} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's context "
                     f"of {cfg.max_position_embeddings}")
  n = len(ids)
  b = engine.bucket(n, 1)
  p = -(-longest // chunk) * chunk
  num_slots = aligned_slots(p + engine.bucket(max_new_tokens) + max_tree_nodes + 1)
  tokens = np.zeros((b, p), np.int32)
  lengths = np.ones((b,), np.int32)
  for i, row in enumerate(ids):
    tokens[i, :len(row)] = row
    lengths[i] = len(row)
  shared = shared_chunks(ids, chunk) if share_prefix else 0
  compiling.ensure_persistent_cache()
  options = compiling.engine_options(options)
  c0 = compiling.compile_seconds()
  step_args = lambda cache, rows, c: (model.params, cache, jnp.asarray(tokens[:rows, c * chunk:(c + 1) * chunk]),
                                      jnp.int32(c * chunk))
  step_for = lambda cache, rows: compiling.jit_executable(
      "prefill_chunk", loop.prefill_chunk, step_args(cache, rows, 0), {"cfg": cfg}, options=options,
      donate_argnames=("cache",))
  cache = KVCache.zeros(cfg, 1 if shared else b, num_slots)
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
                   time.perf_counter() - t0, compile_s, shared * chunk)


def decode(model: Model, pre: Prefilled, *, draft=None, gamma: int = 4, tree: Tree | None = None,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, eos_token_id=None,
           max_new_tokens: int | None = None, options: dict | None = None,
           shrink_batch: bool = False) -> engine.GenerateResult:
  """Decode the prefilled batch (its caches are copied, so it can be decoded again). Same arguments and
  result as `engine.generate`; `stats["ring_s"]` is the time taken to build the draft's cache."""
  engine.check_shrink_batch(shrink_batch)
  max_new = pre.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
  if not 1 <= max_new <= pre.max_new_tokens:
    raise ValueError(f"max_new_tokens must be in [1, {pre.max_new_tokens}] (the prefill's room), got {max_new}")
  st = engine.settings(model, max_new_tokens=max_new, temperature=temperature, top_k=top_k, top_p=top_p,
                       eos_token_id=eos_token_id, draft=draft, gamma=gamma, tree=tree, xla_options=options)
  sampling, spec, draft_params, tree, eos, options = (st.sampling, st.spec, st.draft_params, st.tree, st.eos,
                                                      st.options)
  if isinstance(tree, str):
    raise ValueError("decode takes a fixed gamma or trees.Tree; 'auto' is resolved by generate")
  if tree.num_nodes > pre.target.num_slots - int(pre.tokens.shape[1]) - engine.bucket(pre.max_new_tokens):
    raise ValueError(f"tree of {tree.num_nodes} nodes does not fit the prefill's room")
  cfg, b, n = model.config, pre.batch, pre.num_prompts
  budget = np.zeros((b,), np.int32)
  budget[:n] = max_new
  keys = engine.stream_keys(seed, list(range(n)) + [2**31 - 1 - i for i in range(b - n)])
  c0 = compiling.compile_seconds()
  t0 = time.perf_counter()
  target = jax.tree.map(jnp.copy, pre.target)
  ring_args = (model.params, draft_params, target, pre.tokens, pre.lengths)
  ring = compiling.jit_executable("prefill_draft", loop.prefill_draft, ring_args,
                                  {"cfg": cfg, "spec": spec, "tree": tree, "chunk": pre.chunk}, options=options
                                  )(*ring_args) if spec is not None else None
  jax.block_until_ready((target, ring))
  t1 = time.perf_counter()
  c1 = compiling.compile_seconds()
  state = engine.initial_state(pre.tokens, jnp.array(pre.lengths), jnp.asarray(budget), jnp.asarray(engine.eos_array(eos)),
                               keys, target, ring, out_len=engine.bucket(pre.max_new_tokens) + tree.num_nodes,
                               tree=tree, options=options)
  fin = engine.run_decode(engine.decode_loop, model.params, draft_params, state, shrink_batch=shrink_batch,
                          cfg=cfg, spec=spec, tree=tree, sampling=sampling, impl="xla", options=options)
  t2 = time.perf_counter()
  c2 = compiling.compile_seconds()
  res = engine.collect_result(model, fin, n, eos, tree, spec, pre.prefill_s, t2 - t1 - (c2 - c1))
  res.stats.update(ring_s=t1 - t0 - (c1 - c0), compile_s=c2 - c0, prefill_compile_s=pre.compile_s,
                   decode_compile_s=c2 - c1)
  return res
