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

from magicdec_jax import autotune, drafts, loop
from magicdec_jax.model import Model, full_forward
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree

AR_TREE = Tree((-1,))
MAX_CHUNK = 256
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compile_seconds = [0.0]


def _on_duration(event: str, seconds: float, **_):
  if event in _COMPILE_EVENTS:
    _compile_seconds[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_on_duration)


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


def resolve_eos(model: Model, eos_token_id) -> tuple[int, ...]:
  if eos_token_id is None:
    return tuple(model.config.eos_token_ids)
  ids = (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else tuple(eos_token_id)
  return tuple(int(t) for t in ids)


def _resolve_draft(model: Model, draft, gamma, tree):
  """(static spec, draft params, tree or the string 'auto'), validated."""
  if draft is None:
    return None, None, AR_TREE
  if isinstance(draft, drafts.ModelDraft):
    draft.check_compatible(model)
  elif not isinstance(draft, (drafts.StreamingDraft, drafts.SnapKVDraft)):
    raise ValueError(f"draft must be StreamingDraft, SnapKVDraft, ModelDraft or None, got {draft!r}")
  if tree is None:
    if gamma != "auto" and (not isinstance(gamma, (int, np.integer)) or gamma < 1):
      raise ValueError(f"gamma must be an integer >= 1 or 'auto', got {gamma!r}")
    tree = "auto-chain" if gamma == "auto" else Tree.chain(int(gamma))
  elif tree != "auto" and not isinstance(tree, Tree):
    raise ValueError(f"tree must be a trees.Tree or 'auto', got {tree!r}")
  params = draft.model.params if isinstance(draft, drafts.ModelDraft) else None
  return drafts.static_spec(draft), params, tree


def generate(model: Model, prompts, *, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, eos_token_id=None, draft=None, gamma: int = 4,
             tree: Tree | str | None = None, attention_impl: str = "auto",
             stream_ids: Sequence[int] | None = None, hardware=None, mesh=None,
             device_memory: int | None = None) -> GenerateResult:
  """Generate up to `max_new_tokens` per prompt; speculative when `draft` is given, same distribution.

  draft: None (autoregressive), StreamingDraft, SnapKVDraft or ModelDraft; gamma: chain length, or "auto"
  (cost model, see autotune.py; `hardware` names the device, default detected); tree: a trees.Tree to
  speculate instead of a chain, or "auto" for the hardware-aware Sequoia tree. stream_ids: per-prompt random-stream ids (default 0..n-1);
  a row's samples depend only on (seed, stream id), never on the rest of the batch.
  mesh: a sharding.make_mesh mesh: run tensor/data parallel on it (same tokens as one device; place the
  params once with sharding.shard_model). device_memory: bytes per device for the memory check (default:
  the device's own limit where it reports one); configurations that do not fit are refused before compiling.
  """
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  sampling = Sampling(float(temperature), int(top_k), float(top_p))
  spec, draft_params, tree = _resolve_draft(model, draft, gamma, tree)
  ids = tokenize_prompts(model, prompts)
  cfg = model.config
  for i, p in enumerate(ids):
    if len(p) + max_new_tokens > cfg.max_position_embeddings:
      raise ValueError(f"prompt {i}: {len(p)} prompt tokens + max_new_tokens={max_new_tokens} exceed the "
                       f"model's context of {cfg.max_position_embeddings}")
  if isinstance(spec, drafts.SnapKVDraft):
    need = max(spec.budget + spec.window, spec.observation_window) + 1
    short = min(len(p) for p in ids)
    if short < need:
      raise ValueError(f"SnapKVDraft budget={spec.budget} + window={spec.window} is larger than the "
                       f"shortest prompt ({short} tokens; needs >= {need})")
  eos = resolve_eos(model, eos_token_id)
  n = len(ids)
  plan = None
  if isinstance(tree, str):
    context = max(len(p) for p in ids) + max_new_tokens // 2
    tree, plan = autotune.choose(cfg, spec, n, context, want_tree=(tree == "auto"), hardware=hardware)
  stream_ids = list(range(n)) if stream_ids is None else [int(s) for s in stream_ids]
  if len(stream_ids) != n:
    raise ValueError(f"stream_ids has {len(stream_ids)} entries for {n} prompts")

  b = bucket(n, 1)
  if mesh is not None:
    from magicdec_jax import sharding
    b = sharding.pad_batch(b, mesh)     # whole rows on every data shard
  p_bucket = bucket(max(len(p) for p in ids))
  new_bucket = bucket(max_new_tokens)
  chunk = min(p_bucket, MAX_CHUNK)
  num_slots = p_bucket + new_bucket + tree.num_nodes + 1
  _check_memory(cfg, mesh, draft, tree, b, num_slots, p_bucket, chunk, device_memory)
  tokens = np.zeros((b, p_bucket), np.int32)
  lengths = np.ones((b,), np.int32)
  for i, p in enumerate(ids):
    tokens[i, :len(p)] = p
    lengths[i] = len(p)
  max_new = np.zeros((b,), np.int32)
  max_new[:n] = max_new_tokens
  eos_arr = np.full((max(len(eos), 1),), -1, np.int32)
  eos_arr[:len(eos)] = eos
  base_key = jax.random.key(seed)
  keys = jax.vmap(lambda s: jax.random.fold_in(base_key, s))(
      jnp.asarray(stream_ids + [2**31 - 1 - i for i in range(b - n)], jnp.uint32))

  prefill_fn, decode_fn = loop.prefill, loop.decode
  if mesh is not None:
    prefill_fn, decode_fn = (functools.partial(f, mesh) for f in (sharding.prefill, sharding.decode))
  c0 = _compile_seconds[0]
  t0 = time.perf_counter()
  tokens_j, lengths_j = jnp.asarray(tokens), jnp.asarray(lengths)
  target, ring = prefill_fn(model.params, draft_params, tokens_j, lengths_j, cfg=cfg, spec=spec,
                            tree=tree, num_slots=num_slots, chunk=chunk, impl=attention_impl)
  jax.block_until_ready(target)
  t1 = time.perf_counter()
  c1 = _compile_seconds[0]
  state = loop.initial_state(tokens_j, lengths_j, jnp.asarray(max_new), jnp.asarray(eos_arr), keys,
                             target, ring, new_bucket + tree.num_nodes, tree)
  state = decode_fn(model.params, draft_params, state, cfg=cfg, spec=spec, tree=tree,
                    sampling=sampling, impl=attention_impl)
  out, n_out = np.asarray(state.out), np.asarray(state.n_out)
  t2 = time.perf_counter()
  c2 = _compile_seconds[0]
  # compilation (first call of a bucket) is reported apart from the prefill / decode times
  result = _result(model, state, out, n_out, n, eos, tree, spec, t1 - t0 - (c1 - c0), t2 - t1 - (c2 - c1))
  result.stats["compile_s"] = c2 - c0
  if plan is not None:
    result.stats["auto_plan"] = {k: v for k, v in plan.items() if isinstance(v, (int, float, str))}
    result.stats["tree_depth"] = tree.max_depth
  return result


def _check_memory(cfg, mesh, draft, tree, b, num_slots, p_bucket, chunk, device_memory):
  """Refuse (ValueError naming the figures) a configuration the memory planner says does not fit."""
  from magicdec_jax.sharding import planner
  limit = device_memory if device_memory is not None else planner.device_memory(mesh)
  if limit is None:
    return
  plan = planner.plan_memory(cfg, mesh, batch=b, max_context=num_slots, draft=draft,
                             tree_nodes=tree.num_nodes, prompt_len=p_bucket, chunk=chunk)
  planner.check_fits(plan, int(limit))


def _result(model, state, out, n_out, n, eos, tree, spec, prefill_s, decode_s) -> GenerateResult:
  rounds, accepted = np.asarray(state.rounds)[:n], np.asarray(state.accepted)[:n]
  acc_at = np.asarray(state.accepted_at)[:n]
  toks = [out[i, :n_out[i]].tolist() for i in range(n)]
  reasons = ["eos" if t and t[-1] in eos else "length" for t in toks]
  depth = tree.max_depth
  row_stats = []
  for i in range(n):
    drafted = int(rounds[i]) * depth
    row_stats.append({
        "new_tokens": len(toks[i]), "verify_steps": int(rounds[i]), "accepted_tokens": int(accepted[i]),
        "acceptance_rate": accepted[i] / drafted if drafted else None,
        "mean_accepted_length": (accepted[i] + rounds[i]) / rounds[i] if rounds[i] else None})
  total_new = sum(len(t) for t in toks)
  total_rounds = int(rounds.sum())
  stats = {
      "prefill_s": max(prefill_s, 0.0), "decode_s": max(decode_s, 0.0), "new_tokens": total_new,
      "tokens_per_s": total_new / decode_s if decode_s > 0 else None, "verify_steps": total_rounds,
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
  """A plain full forward: equal-length token-id lists [B][T] -> float32 numpy [B, T, V]."""
  ids = tokenize_prompts(model, token_ids)
  if len({len(t) for t in ids}) != 1:
    raise ValueError("logits() needs prompts of equal length")
  return np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)))
