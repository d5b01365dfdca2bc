"""The public entry points: `generate` (autoregressive or speculative) and `logits`.

Everything is validated on the host before anything is traced, shapes are padded to buckets (batch to a
power of two, prompt and new-token lengths to powers of two) so repeated calls reuse one executable.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import drafts, feature_draft, loop, sharding, shrink
from magicdec_jax.tuning import autotune
from magicdec_jax import compile as compiling
from magicdec_jax.cache import aligned_slots
from magicdec_jax.layers.dense import narrow_weights
from magicdec_jax.model import Model, full_forward
from magicdec_jax.sampling import Sampling
from magicdec_jax.sharding import planner
from magicdec_jax.trees import Tree

AR_TREE = Tree((-1,))
MAX_CHUNK = 256


@dataclasses.dataclass
class GenerateResult:
  tokens: list[list[int]]            # new token ids per prompt
  texts: list[str] | None            # decoded new text per prompt (when the model has a tokenizer)
  finish_reasons: list[str]          # "eos" or "length"
  stats: dict[str, Any]              # whole-call figures (times, tokens/s, acceptance)
  row_stats: list[dict[str, Any]]    # per-prompt figures


def bucket(n: int, minimum: int = 16) -> int:
  """The padded size for n: the next power of two, at least `minimum` (one compilation per bucket)."""
  return max(minimum, 1 << max(0, int(n - 1).bit_length()))


def tokenize_prompts(model: Model, prompts) -> list[list[int]]:
  """Strings (needs a tokenizer) or lists of token ids -> validated lists of ids."""
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
    raise ValueError(f"prompts must be a non-empty list of strings or of token-id lists, got {prompts!r:.80}")
  out = []
  vocab = model.config.vocab_size
  for i, p in enumerate(prompts):
    if isinstance(p, str):
      if model.tokenizer is None:
        raise ValueError(f"prompt {i} is text but model {model.name!r} has no tokenizer; pass token ids")
      ids = model.tokenizer.encode(p).ids
    else:
      ids = [int(t) for t in p]
    if not ids:
      raise ValueError(f"prompt {i} is empty")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
      raise ValueError(f"prompt {i} has token id {bad[0]} outside the vocabulary [0, {vocab})")
    out.append(ids)
  return out


def _is_array(x) -> bool:
  return isinstance(x, (np.ndarray, jax.Array))


def _int_array(name: str, x, shape: tuple) -> np.ndarray:
  a = np.asarray(x)
  if a.dtype != np.bool_ and not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
  if a.shape != shape:
    raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
  return a


def array_prompts(model: Model, ids, lengths=None, attention_mask=None) -> list[list[int]]:
  """An integer array [B, T] (+ optional `lengths` [B] or `attention_mask` [B, T]) -> validated id lists."""
  a = np.asarray(ids)
  if a.ndim != 2 or 0 in a.shape:
    raise ValueError(f"token-id array prompts must be 2-D [B, T] with B, T >= 1, got shape {a.shape}")
  if not np.issubdtype(a.dtype, np.integer):
    raise ValueError(f"token-id array prompts must have an integer dtype, got {a.dtype}")
  b, t = a.shape
  if lengths is not None and attention_mask is not None:
    raise ValueError("pass lengths or attention_mask, not both")
  spans = [(0, t)] * b
  if lengths is not None:
    n = _int_array("lengths", lengths, (b,))
    if n.dtype == np.bool_:
      raise ValueError("lengths must be an integer array, got dtype bool")
    bad = np.flatnonzero((n < 1) | (n > t))
    if bad.size:
      raise ValueError(f"lengths[{bad[0]}]={n[bad[0]]} is outside [1, {t}] (T = the array's width)")
    spans = [(0, int(k)) for k in n]
  elif attention_mask is not None:
    m = _int_array("attention_mask", attention_mask, (b, t))
    if m.dtype != np.bool_ and not np.isin(m, (0, 1)).all():
      raise ValueError(f"attention_mask must hold only 0 and 1, found {m[~np.isin(m, (0, 1))][0]}")
    m = m.astype(bool)
    spans = []
    for i, row in enumerate(m):
      k = int(row.sum())
      if k == 0:
        raise ValueError(f"attention_mask row {i} is all padding (an empty prompt)")
      start = int(np.argmax(row))
      if not row[start:start + k].all() or (start != 0 and start + k != t):
        raise ValueError(f"attention_mask row {i} is not one contiguous run of ones at the right or the left "
                         f"end (ones at {np.flatnonzero(row).tolist()[:8]}...)")
      spans.append((start, start + k))
  vocab = model.config.vocab_size
  out = []
  for i, (s, e) in enumerate(spans):
    row = a[i, s:e]
    bad = np.flatnonzero((row < 0) | (row >= vocab))
    if bad.size:
      raise ValueError(f"prompt {i} has token id {row[bad[0]]} (at [{i}, {s + bad[0]}]) outside the "
                       f"vocabulary [0, {vocab})")
    out.append(row.astype(np.int64).tolist())
  return out


def prompt_ids(model: Model, prompts, lengths=None, attention_mask=None) -> list[list[int]]:
  """Strings, token-id lists or an integer array [B, T] (with lengths / attention_mask) -> id lists."""
  if _is_array(prompts):
    return array_prompts(model, prompts, lengths, attention_mask)
  if lengths is not None or attention_mask is not None:
    raise ValueError("lengths / attention_mask apply to array prompts [B, T] only; lists are already ragged")
  return tokenize_prompts(model, prompts)


def resolve_eos(model: Model, eos_token_id) -> tuple[int, ...]:
  if eos_token_id is None:
    return tuple(model.config.eos_token_ids)
  ids = (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else tuple(eos_token_id)
  return tuple(int(t) for t in ids)


def resolve_draft(model: Model, draft, gamma, tree):
  """(static spec, draft params, tree or the string 'auto'), validated."""
  if draft is None:
    return None, None, AR_TREE
  if isinstance(draft, (drafts.ModelDraft, feature_draft.FeatureDraft)):
    draft.check_compatible(model)
  elif not isinstance(draft, (drafts.StreamingDraft, drafts.SnapKVDraft)):
    raise ValueError(f"draft must be StreamingDraft, SnapKVDraft, ModelDraft, FeatureDraft or None, "
                     f"got {draft!r}")
  if tree is None:
    if gamma != "auto" and (not isinstance(gamma, (int, np.integer)) or gamma < 1):
      raise ValueError(f"gamma must be an integer >= 1 or 'auto', got {gamma!r}")
    tree = "auto-chain" if gamma == "auto" else Tree.chain(int(gamma))
  elif tree != "auto" and not isinstance(tree, Tree):
    raise ValueError(f"tree must be a trees.Tree or 'auto', got {tree!r}")
  params = draft.model.params if isinstance(draft, drafts.ModelDraft) else None
  if isinstance(draft, feature_draft.FeatureDraft):
    params = draft.head.params
  if getattr(draft, "weights", None) is not None:
    if jnp.dtype(draft.weights).itemsize >= jnp.dtype(model.config.dtype).itemsize:
      raise ValueError(f"StreamingDraft weights={draft.weights!r} is not narrower than the target's "
                       f"{model.config.dtype}: draft with the target's own weights (weights=None)")
    params = _narrow_copy(model.params, draft.weights)
  return drafts.static_spec(draft), params, tree


_NARROW = {}    # (id of a target's params, dtype) -> (those params, their narrow copy): cast once per model


def _narrow_copy(params, dtype: str):
  """The target's weights cast for a StreamingDraft(weights=dtype), made once per params tree."""
  key = (id(params), dtype)
  if key not in _NARROW or _NARROW[key][0] is not params:
    if len(_NARROW) >= 2:
      _NARROW.clear()
    _NARROW[key] = (params, narrow_weights(params, dtype))
  return _NARROW[key][1]


@dataclasses.dataclass(frozen=True)
class Settings:
  """generate()'s validated decoding settings, shared with stream.generate_stream."""
  max_new_tokens: int
  sampling: Sampling
  spec: Any                  # static draft spec (drafts.static_spec) or None
  draft_params: Any
  draft: Any                 # the user's draft object (for the memory planner) or None
  tree: Any                  # a Tree, or "auto" / "auto-chain" until resolve_auto
  eos: tuple[int, ...]
  options: dict


def settings(model: Model, *, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, eos_token_id=None,
             draft=None, gamma=4, tree=None, xla_options=None) -> Settings:
  """Validate generate()'s decoding arguments (ValueErrors naming the value) before anything compiles."""
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  sampling = Sampling(float(temperature), int(top_k), float(top_p))
  spec, draft_params, tree = resolve_draft(model, draft, gamma, tree)
  return Settings(int(max_new_tokens), sampling, spec, draft_params, draft, tree,
                  resolve_eos(model, eos_token_id), compiling.engine_options(xla_options))


def check_prompts(model: Model, st: Settings, ids: Sequence[Sequence[int]], first: int = 0):
  """Each prompt fits the context with max_new_tokens, and is long enough for a SnapKV draft."""
  limit = model.config.max_position_embeddings
  for i, p in enumerate(ids, first):
    if len(p) + st.max_new_tokens > limit:
      raise ValueError(f"prompt {i}: {len(p)} prompt tokens + max_new_tokens={st.max_new_tokens} exceed the "
                       f"model's context of {limit}")
  if isinstance(st.spec, drafts.SnapKVDraft) and ids:
    need = max(st.spec.budget + st.spec.window, st.spec.observation_window) + 1
    short = min(len(p) for p in ids)
    if short < need:
      raise ValueError(f"SnapKVDraft budget={st.spec.budget} + window={st.spec.window} is larger than the "
                       f"shortest prompt ({short} tokens; needs >= {need})")


def resolve_auto(model: Model, st: Settings, batch: int, context: int, hardware, acceptance,
                 auto_fallback: bool, fixed_batch: bool = False) -> tuple[Settings, dict | None]:
  """gamma / tree = "auto": the cost model's choice for this batch and context -> (settings, plan).
  fixed_batch: the rows run together until the slowest is done (generate), so a chain is priced with
  that tail over st.max_new_tokens (batch_tail); not for refilled slots (stream, datagen)."""
  if not isinstance(st.tree, str):
    return st, None
  tree, plan = autotune.choose(model.config, st.spec, batch, context, want_tree=(st.tree == "auto"),
                               hardware=hardware, acceptance_vector=acceptance,
                               allow_autoregressive=auto_fallback,
                               new_tokens=st.max_new_tokens if fixed_batch else None)
  st = dataclasses.replace(st, tree=tree)
  if not plan["speculate"]:          # predicted to lose: plain decoding (same distribution, no draft)
    st = dataclasses.replace(st, spec=None, draft_params=None, draft=None)
  return st, plan


def eos_array(eos: tuple[int, ...]) -> np.ndarray:
  """Stop ids as the loop's [E] int32 array (-1 padded, at least one entry)."""
  out = np.full((max(len(eos), 1),), -1, np.int32)
  out[:len(eos)] = eos
  return out


def stream_keys(seed: int, stream_ids: Sequence[int]) -> jax.Array:
  """Per-row PRNG keys: row i's stream is fold_in(key(seed), stream_ids[i]), whatever its slot."""
  base_key = jax.random.key(seed)
  return jax.vmap(lambda s: jax.random.fold_in(base_key, s))(jnp.asarray(list(stream_ids), jnp.uint32))


def device_fns(mesh):
  """(prefill, decode) for one device (executable LRU) or for `mesh` (sharding.runtime)."""
  if mesh is None:
    return _prefill, decode_loop
  return functools.partial(sharding.prefill, mesh), functools.partial(sharding.decode, mesh)


def generate(model: Model, prompts, *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, eos_token_id=None, draft=None, gamma: int = 4,
             tree: Tree | str | None = None, attention_impl: str = "auto",
             stream_ids: Sequence[int] | None = None, hardware=None, acceptance=None,
             auto_fallback: bool = True, mesh=None, device_memory: int | None = None, lengths=None,
             attention_mask=None, xla_options: dict | None = None, shrink_batch: bool = False) -> GenerateResult:
  """Generate up to `max_new_tokens` per prompt; speculative when `draft` is given, same distribution.

  draft: None (autoregressive), StreamingDraft, SnapKVDraft, ModelDraft or FeatureDraft; gamma: chain length,
  or "auto"
  (cost model, see autotune.py; `hardware` names the device or is a hardware profile JSON path from
  `run.py --mode=calibrate`, default detected; `acceptance` an acceptance vector or its JSON path from
  `run.py --mode=profile_acceptance`, for "auto" only; with auto_fallback, "auto" decodes autoregressively,
  the draft unused, where the cost model predicts every chain / tree slower than that: stats["auto_plan"]
  ["speculate"] says which); tree: a trees.Tree to
  speculate instead of a chain, or "auto" for the hardware-aware Sequoia tree. stream_ids: per-prompt random-stream ids (default 0..n-1);
  a row's samples depend only on (seed, stream id), never on the rest of the batch.
  mesh: a sharding.make_mesh mesh: run tensor/data parallel on it (same tokens as one device; place the
  params once with sharding.shard_model). device_memory: bytes per device for the memory check (default:
  the device's own limit where it reports one); configurations that do not fit are refused before compiling.
  shrink_batch: once half the rows are done, go on with the rest in a batch half as large, and so on
  (shrink.py): finished rows stop costing compute; same tokens; each smaller batch compiles once more.
  Not with a mesh.

  prompts: a list of strings or of token-id lists (ragged is fine), or an integer array [B, T] (numpy or
  jax) of token ids. Ragged rows in an array: `lengths` [B] (row i is ids[i, :lengths[i]]) or an HF-style
  `attention_mask` [B, T] of 0/1, padding on the right or on the left (each row's ones contiguous and
  touching one end); the padding ids are ignored. Same tokens as the list form.
  xla_options: XLA compiler options for this call's executables only (e.g. {"xla_cpu_enable_fast_math":
  False}); on GPU they extend compile.GPU_DECODE_OPTIONS. Never set through XLA_FLAGS, so nothing else in
  the process is affected. Executables are kept in a bounded LRU (compile.py, MAGICDEC_MAX_EXECUTABLES).
  """
  st = settings(model, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                eos_token_id=eos_token_id, draft=draft, gamma=gamma, tree=tree, xla_options=xla_options)
  check_shrink_batch(shrink_batch, mesh)
  ids = prompt_ids(model, prompts, lengths=lengths, attention_mask=attention_mask)
  check_prompts(model, st, ids)
  n = len(ids)
  st, plan = resolve_auto(model, st, n, max(len(p) for p in ids) + max_new_tokens // 2, hardware, acceptance,
                          auto_fallback, fixed_batch=True)
  sampling, spec, draft_params, draft, tree, eos, options = (st.sampling, st.spec, st.draft_params, st.draft,
                                                             st.tree, st.eos, st.options)
  cfg = model.config
  stream_ids = list(range(n)) if stream_ids is None else [int(s) for s in stream_ids]
  if len(stream_ids) != n:
    raise ValueError(f"stream_ids has {len(stream_ids)} entries for {n} prompts")

  b = bucket(n, 1)
  if mesh is not None:
    b = sharding.pad_batch(b, mesh)     # whole rows on every data shard
  p_bucket = bucket(max(len(p) for p in ids))
  new_bucket = bucket(max_new_tokens)
  chunk = min(p_bucket, MAX_CHUNK)
  num_slots = aligned_slots(p_bucket + new_bucket + tree.num_nodes + 1)
  _check_memory(cfg, mesh, draft, tree, b, num_slots, p_bucket, chunk, device_memory)
  tokens = np.zeros((b, p_bucket), np.int32)
  row_lengths = np.ones((b,), np.int32)
  for i, p in enumerate(ids):
    tokens[i, :len(p)] = p
    row_lengths[i] = len(p)
  max_new = np.zeros((b,), np.int32)
  max_new[:n] = max_new_tokens
  keys = stream_keys(seed, stream_ids + [2**31 - 1 - i for i in range(b - n)])
  prefill_fn, decode_fn = device_fns(mesh)
  compiling.ensure_persistent_cache()
  c0 = compiling.compile_seconds()
  t0 = time.perf_counter()
  tokens_j, lengths_j = jnp.asarray(tokens), jnp.asarray(row_lengths)
  target, ring = prefill_fn(model.params, draft_params, tokens_j, lengths_j, cfg=cfg, spec=spec,
                            tree=tree, num_slots=num_slots, chunk=chunk, impl=attention_impl, options=options)
  jax.block_until_ready(target)
  t1 = time.perf_counter()
  c1 = compiling.compile_seconds()
  init_args = (tokens_j, lengths_j, jnp.asarray(max_new), jnp.asarray(eos_array(eos)), keys, target, ring)
  init_static = dict(out_len=new_bucket + tree.num_nodes, tree=tree)
  if mesh is None:    # one executable in the LRU; with a mesh the inputs are sharded: eager, as placed
    state = initial_state(*init_args, options=options, **init_static)
  else:
    state = loop.initial_state(*init_args, **init_static)
  fin = run_decode(decode_fn, model.params, draft_params, state, shrink_batch=shrink_batch, cfg=cfg, spec=spec,
                   tree=tree, sampling=sampling, impl=attention_impl, options=options)
  t2 = time.perf_counter()
  c2 = compiling.compile_seconds()
  # compilation (first call of a bucket) is reported apart from the prefill / decode times
  result = collect_result(model, fin, n, eos, tree, spec, t1 - t0 - (c1 - c0), t2 - t1 - (c2 - c1))
  result.stats.update(compile_s=c2 - c0, prefill_compile_s=c1 - c0, decode_compile_s=c2 - c1)
  if plan is not None:
    result.stats["auto_plan"] = {k: v for k, v in plan.items() if isinstance(v, (int, float, str))}
    result.stats["tree_depth"] = tree.max_depth
  return result


def _prefill(target_params, draft_params, tokens, lengths, *, options=None, **static):
  """loop.prefill through the executable LRU (compile.py)."""
  args = (target_params, draft_params, tokens, lengths)
  return compiling.jit_executable("prefill", loop.prefill, args, static, options=options)(*args)


def initial_state(*args, options=None, **static):
  """loop.initial_state as one executable in the LRU (run eagerly, its ops would compile one small
  executable each per shape and stay in jax's caches for good). The prefilled caches are donated: the
  state takes them over in place (not donated, XLA copies the whole target cache into the state, which
  measured 0.6 s at SmolLM2 8 x 2048 on CPU, ten AR steps)."""
  return compiling.jit_executable("initial_state", loop.initial_state, args, static, options=options,
                                  donate_argnames=("target", "ring"))(*args)


def decode_loop(target_params, draft_params, state, *, options=None, **static):
  """loop.decode through the executable LRU; the LoopState is donated (caches updated in place)."""
  args = (target_params, draft_params, state)
  return compiling.jit_executable("decode", loop.decode, args, static, options=options,
                                  donate_argnames=("state",))(*args)


def check_shrink_batch(shrink_batch, mesh=None) -> None:
  """ValueError (before anything compiles) for a shrink_batch that is not a bool, or set with a mesh."""
  if not isinstance(shrink_batch, bool):
    raise ValueError(f"shrink_batch must be True or False, got {shrink_batch!r}")
  if shrink_batch and mesh is not None:
    raise ValueError("shrink_batch is not supported with a mesh (the batch must stay a multiple of the data "
                     "shards)")


def run_decode(decode_fn, target_params, draft_params, state, *, shrink_batch: bool = False,
               **kw) -> shrink.Finished:
  """The decode loop to the end, in one batch or (shrink_batch) in shrinking stages; per-row results."""
  if shrink_batch:
    return shrink.decode(decode_fn, target_params, draft_params, state, **kw)
  return shrink.finished(decode_fn(target_params, draft_params, state, **kw))


def _check_memory(cfg, mesh, draft, tree, b, num_slots, p_bucket, chunk, device_memory):
  """Refuse (ValueError naming the figures) a configuration the memory planner says does not fit."""
  limit = device_memory if device_memory is not None else planner.device_memory(mesh)
  if limit is None:
    return
  plan = planner.plan_memory(cfg, mesh, batch=b, max_context=num_slots, draft=draft,
                             tree_nodes=tree.num_nodes, prompt_len=p_bucket, chunk=chunk)
  planner.check_fits(plan, int(limit))


def row_stat(new_tokens: int, rounds: int, accepted: int, depth: int) -> dict[str, Any]:
  """One row's figures: verify steps, accepted draft tokens, acceptance rate, mean accepted length."""
  drafted = rounds * depth
  return {"new_tokens": new_tokens, "verify_steps": rounds, "accepted_tokens": accepted,
          "acceptance_rate": accepted / drafted if drafted else None,
          "mean_accepted_length": (accepted + rounds) / rounds if rounds else None}


def collect_result(model, fin: shrink.Finished, n, eos, tree, spec, prefill_s, decode_s) -> GenerateResult:
  out, n_out = fin.out, fin.n_out
  rounds, accepted, acc_at = fin.rounds[:n], fin.accepted[:n], fin.accepted_at[:n]
  toks = [out[i, :n_out[i]].tolist() for i in range(n)]
  reasons = ["eos" if t and t[-1] in eos else "length" for t in toks]
  depth = tree.max_depth
  row_stats = [row_stat(len(toks[i]), int(rounds[i]), int(accepted[i]), depth) for i in range(n)]
  total_new = sum(len(t) for t in toks)
  total_rounds = int(rounds.sum())
  stats = {
      "prefill_s": max(prefill_s, 0.0), "decode_s": max(decode_s, 0.0), "new_tokens": total_new,
      "tokens_per_s": total_new / decode_s if decode_s > 0 else None, "verify_steps": total_rounds,
      "loop_rounds": fin.step,     # rounds the batch ran: its slowest row's (summed over shrinking stages)
      "batch_stages": [list(x) for x in fin.stages],   # [batch, rounds, seconds] per stage (shrink_batch)
      "shrink_gather_s": list(fin.gather_s),           # seconds of each copy into a smaller batch
      "draft": None if spec is None else type(spec).__name__, "tree_nodes": tree.num_nodes,
      "acceptance_rate": float(accepted.sum()) / (total_rounds * depth) if depth and total_rounds else None,
      "mean_accepted_length": float(accepted.sum() + total_rounds) / total_rounds if total_rounds else None,
      "per_position_acceptance": (acc_at.sum(0) / total_rounds).tolist() if total_rounds else [],
  }
  texts = None
  if model.tokenizer is not None:
    texts = [model.tokenizer.decode(t, skip_special_tokens=False) for t in toks]
  return GenerateResult(toks, texts, reasons, stats, row_stats)


def logits(model: Model, token_ids) -> np.ndarray:
  """A plain full forward: equal-length token-id lists [B][T] or an integer array [B, T] (numpy or jax)
  -> float32 numpy [B, T, V]."""
  ids = prompt_ids(model, token_ids)
  if len({len(t) for t in ids}) != 1:
    raise ValueError("logits() needs prompts of equal length")
  return np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)))
