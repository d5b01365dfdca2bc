"""The engine: one object that turns a model and its decoding settings into prefill / insert / decode steps.

Every driver goes through it: `generate` (one fixed batch), `stream.generate_stream` and datagen
(continuous batching: prefill, insert into free slots, decode until rows finish), `prefilled` (prefill
once, decode several ways: the demo, the context sweep, `--mode=bench`). So the decisions are made once:
which draft and what it needs from the target, the tree or chain ("auto": the cost model's choice),
bucketed shapes (batch to a power of two, prompt and new-token lengths to powers of two, so repeated calls
reuse one executable), the cache's slot count, the memory check, the attention implementation, the XLA
options, one device or a mesh. Every argument is validated on the host before anything is traced.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from magicdec_jax import loop, schedule, sharding, shrink, slots
from magicdec_jax import compile as compiling
from magicdec_jax.cache import MAX_CHUNK, aligned_slots
from magicdec_jax.layers.invariant import KEY_BLOCK
from magicdec_jax.model import Model, full_forward
from magicdec_jax.prompts import prompt_ids
from magicdec_jax.settings import DecodeSettings, decode_settings
from magicdec_jax.sharding import planner
from magicdec_jax.trees import AR_TREE, Tree
from magicdec_jax.tuning import autotune

LONG_OUTPUT = 1024        # generate(progress=None) shows a progress bar from this many new tokens
SEGMENT_ROUNDS = 128      # with a progress bar, the loop returns to the host every this many rounds


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


def eos_array(eos: tuple[int, ...]) -> np.ndarray:
  """Stop ids as the loop's [E] int32 array (-1 padded, at least one entry)."""
  out = np.full((max(len(eos), 1),), -1, np.int32)
  out[:len(eos)] = eos
  return out


def stream_keys(seed: int, stream_ids: Sequence[int]) -> jax.Array:
  """Per-row PRNG keys: row i's stream is fold_in(key(seed), stream_ids[i]), whatever its slot."""
  base_key = jax.random.key(seed)
  return jax.vmap(lambda s: jax.random.fold_in(base_key, s))(jnp.asarray(list(stream_ids), jnp.uint32))


def row_stat(new_tokens: int, rounds: int, accepted: int, drafted: int) -> dict[str, Any]:
  """One row's figures: verify steps, accepted draft tokens, acceptance rate (over the draft tokens
  proposed on its rounds' paths: plain rounds of a schedule propose none), mean accepted length."""
  return {"new_tokens": new_tokens, "verify_steps": rounds, "accepted_tokens": accepted, "drafted_tokens": drafted,
          "acceptance_rate": accepted / drafted if drafted else None,
          "mean_accepted_length": (accepted + rounds) / rounds if rounds else None}


def cache_slots(prompt_bucket: int, max_new_tokens: int, tree_nodes: int, whole_blocks: bool = False) -> int:
  """Target-cache slots for prompts of `prompt_bucket` tokens: the prompt, the new tokens' bucket, a
  round's tree and the pending token (rounded for the attention tile; whole_blocks: to whole KEY_BLOCKs,
  which fixed-shape attention sums one by one, layers/invariant.py)."""
  n = aligned_slots(prompt_bucket + bucket(max_new_tokens) + tree_nodes + 1)
  return -(-n // KEY_BLOCK) * KEY_BLOCK if whole_blocks else n


def attention_reads_live_range(impl: str) -> bool:
  """Whether the target's attention reads only each row's live KV (the Pallas kernel on GPU) rather than
  the whole cache (XLA's dense attention, CPU): what a round's cost grows with."""
  return jax.default_backend() == "gpu" and impl in ("auto", "pallas_triton")


def check_shrink_batch(shrink_batch, mesh=None) -> None:
  """ValueError (before anything compiles) for a shrink_batch that is not a bool, or set with a mesh."""
  if not isinstance(shrink_batch, bool):
    raise ValueError(f"shrink_batch must be True or False, got {shrink_batch!r}")
  if shrink_batch and mesh is not None:
    raise ValueError("shrink_batch is not supported with a mesh (the batch must stay a multiple of the data "
                     "shards)")


class Engine:
  """`model` decoded with `settings` on one device or a `mesh` (device_memory: bytes per device for the
  memory check; default the device's own limit where it reports one)."""

  def __init__(self, model: Model, settings: DecodeSettings, *, mesh=None, device_memory: int | None = None):
    if not isinstance(settings, DecodeSettings):
      raise ValueError(f"settings must be a DecodeSettings, got {settings!r:.80}")
    # the target computes with the settings' numerics (fixed-shape dots: layers/invariant.py)
    self.model, self.settings = model, settings
    self.cfg = dataclasses.replace(model.config, numerics=settings.numerics)
    self.mesh, self.device_memory = mesh, device_memory
    self.sampling = settings.sampler
    self.eos = self._eos(settings.eos_token_id)
    draft_options = {} if settings.draft is None else settings.draft.xla_options()
    self.options = compiling.engine_options({**draft_options, **(settings.xla_options or {})})
    self.impl = settings.attention_impl
    self.draft = settings.draft
    self.spec, self.draft_params, self.tree = None, None, AR_TREE
    self.plan: dict | None = None
    self.variants: tuple[Tree, ...] | None = None     # adaptive speculation: the settings rounds switch between
    self.thresholds = None                            # (at, variant) host arrays for LoopState.sched
    self.learning: schedule.Learning | None = None    # adaptive chains: acceptance and speed learned so far
    self.progress = None                              # a tqdm bar: decode in segments of SEGMENT_ROUNDS
    if self.draft is not None:
      self.draft.check_compatible(model)
      self.spec = self.draft.spec
      self.tree = settings.speculation
      if self.tree != "auto-chain":
        self.spec.check_tree(self.tree)
      self.draft_params = self.draft.params(model)

  def _eos(self, eos_token_id) -> tuple[int, ...]:
    if eos_token_id is None:
      return tuple(self.cfg.eos_token_ids)
    ids = (eos_token_id,) if isinstance(eos_token_id, (int, np.integer)) else tuple(eos_token_id)
    return tuple(int(t) for t in ids)

  @property
  def draft_name(self) -> str | None:
    return None if self.spec is None else type(self.draft).__name__

  # ---- host-side decisions --------------------------------------------------------------------------------
  def check_prompts(self, ids: Sequence[Sequence[int]], first: int = 0) -> None:
    """Each prompt fits the context with max_new_tokens, and suits the draft (SnapKV's minimum length)."""
    limit, new = self.cfg.max_position_embeddings, self.settings.max_new_tokens
    for i, p in enumerate(ids, first):
      if len(p) + new > limit:
        raise ValueError(f"prompt {i}: {len(p)} prompt tokens + max_new_tokens={new} exceed the model's "
                         f"context of {limit}")
    if self.spec is not None and ids:
      self.spec.check_prompts(ids)

  def resolve_auto(self, batch: int, lo: int, hi: int, prompt_bucket: int, fixed_batch: bool = False) -> "Engine":
    """gamma / tree = "auto" (or a forced `schedule`): adaptive speculation for contexts lo .. hi
    (schedule.py). The rounds switch between plain decoding (with auto_fallback, where the draft allows it)
    and chains of gamma 1..3 (tree="auto": the cost model's Sequoia tree for the middle context) at the
    contexts where the cost model's choice for this batch changes (`plan` holds its predictions). A round
    is priced at the KV its attention reads: the live range where the kernel walks only that (Pallas on
    GPU), else the whole cache (XLA's dense attention: prompt_bucket + room for the new tokens), which
    makes the choice one setting per call. fixed_batch: rows run together until the slowest is done
    (generate), so a chain is priced with that tail over max_new_tokens (batch_tail); not for refilled
    slots (stream, datagen). Where plain decoding is predicted best everywhere, the draft is dropped."""
    st = self.settings
    if st.schedule is not None:
      if self.spec is None:
        raise ValueError("schedule needs a draft")
      variants, self.thresholds = schedule.forced(st.schedule)
      if variants[0].num_nodes == 1 and not self.spec.commits_plain_rounds:
        raise ValueError(f"{self.draft_name} cannot keep its ring through plain rounds: schedule gamma 0 "
                         f"is not available with it")
      self._adapt(variants)
      self.plan = {"speculate": True, "schedule": "forced"}
      return self
    if not isinstance(self.tree, str):
      return self
    want_tree = self.tree == "auto"
    plain = st.auto_fallback and self.spec.commits_plain_rounds

    @functools.lru_cache(maxsize=None)
    def priced(context, allow, alpha=None):
      return autotune.choose(self.cfg, self.spec, batch, context, want_tree=want_tree, hardware=st.hardware,
                             alpha=alpha, acceptance_vector=st.acceptance, allow_autoregressive=allow,
                             max_gamma=max(schedule.AUTO_GAMMAS),
                             new_tokens=st.max_new_tokens if fixed_batch else None)

    tree = priced((lo + hi) // 2, False)[0] if want_tree else None
    variants = schedule.variants_for(schedule.AUTO_GAMMAS, plain, tree)
    whole_cache = cache_slots(prompt_bucket, st.max_new_tokens, schedule.widest(variants).num_nodes)
    live = attention_reads_live_range(self.impl)

    def from_cost_model(alpha=None, top=hi):       # thresholds over lo .. top (alpha None: the profiled one)
      return schedule.from_cost_model(lambda c: priced(c if live else whole_cache, plain, alpha), variants, lo,
                                      top, max_points=32 if want_tree else schedule.GRID_POINTS)

    self.thresholds, points = from_cost_model()
    used = sorted({p["variant"] for p in points})
    self.plan = {"speculate": used != [0] or not plain, "hardware": priced(hi, plain)[1].get("hardware"),
                 "settings": ", ".join(schedule.names([variants[v] for v in used])),
                 "contexts": f"{lo}..{hi}", "priced_at": "live range" if live else f"whole cache ({whole_cache})",
                 "speedup": max(p["speedup"] for p in points)}     # the best predicted over the contexts
    if plain and used == [0]:     # predicted to lose everywhere: plain decoding (same distribution, no draft)
      self.draft = self.spec = self.draft_params = None
      self.tree, self.thresholds = AR_TREE, None
      return self
    self._adapt(variants)
    self.plan["schedule_points"] = points
    if st.learn_acceptance and not want_tree:      # re-plan the call with the acceptance and speed it has
      depth = [t.max_depth for t in variants]

      def replan(alpha, ctx):
        alpha = round(alpha, 3)
        # every context of the call (refilled rows bring the mean back down); also what a later state starts from
        self.thresholds = from_cost_model(alpha, max(hi, ctx + 1))[0]
        if live:                       # the choice moves with the context: the cost model's thresholds
          return self.thresholds, []
        band = autotune.chain_band(self.cfg, self.spec, batch, whole_cache, hardware=st.hardware, alpha=alpha,
                                   max_gamma=max(schedule.AUTO_GAMMAS), allow_autoregressive=plain,
                                   new_tokens=st.max_new_tokens if fixed_batch else None)
        return self.thresholds, [depth.index(g) for g in band]

      self.learning = schedule.Learning(autotune.chain_alpha(st.hardware, st.acceptance), replan,
                                        clock=lambda: time.perf_counter() - compiling.compile_seconds())
    return self

  def _adapt(self, variants: tuple[Tree, ...]) -> None:
    for t in variants:
      if t.num_nodes > 1:
        self.spec.check_tree(t)
    self.variants, self.tree = variants, schedule.widest(variants)

  def with_schedule(self, state: loop.LoopState) -> loop.LoopState:
    """The state with this engine's thresholds (adaptive speculation; fixed settings: as it is)."""
    if self.thresholds is None:
      return state
    return state.replace(sched=schedule.with_thresholds(state.sched, *self.thresholds))

  @property
  def num_variants(self) -> int:
    return 1 if self.variants is None else len(self.variants)

  def num_slots(self, prompt_bucket: int) -> int:
    return cache_slots(prompt_bucket, self.settings.max_new_tokens, self.tree.num_nodes, self.cfg.invariant)

  def prompt_bucket(self, longest: int) -> int:
    """The padded prompt length for prompts of up to `longest` tokens. With fixed-shape numerics at least
    MAX_CHUNK, so every prefill runs in chunks of MAX_CHUNK whatever the batch's prompts (a row's prompt
    is then encoded with the same dots alone or beside a longer one)."""
    return bucket(longest, MAX_CHUNK if self.cfg.invariant else 16)

  def out_len(self) -> int:
    return bucket(self.settings.max_new_tokens) + self.tree.num_nodes

  @staticmethod
  def chunk(prompt_bucket: int) -> int:
    return min(prompt_bucket, MAX_CHUNK)

  def batch_rows(self, n: int) -> int:
    """The batch bucket for n rows, whole rows on every data shard of the mesh."""
    return sharding.pad_batch(bucket(n, 1), self.mesh)

  def check_memory(self, batch: int, num_slots: int, prompt_bucket: int) -> None:
    """Refuse (ValueError naming the figures) a configuration the memory planner says does not fit."""
    limit = self.device_memory if self.device_memory is not None else planner.device_memory(self.mesh)
    if limit is None:
      return
    plan = planner.plan_memory(self.cfg, self.mesh, batch=batch, max_context=num_slots, draft=self.spec,
                               tree_nodes=self.tree.num_nodes, prompt_len=prompt_bucket,
                               chunk=self.chunk(prompt_bucket))
    planner.check_fits(plan, int(limit))

  # ---- device steps ----------------------------------------------------------------------------------------
  def _static(self, **extra) -> dict:
    return dict(cfg=self.cfg, spec=self.spec, tree=self.tree, **extra)

  def prefill(self, tokens: jax.Array, lengths: jax.Array, num_slots: int) -> tuple[Any, Any]:
    """Right-padded prompts [B, P] -> (target cache with num_slots slots, the draft's ring or None)."""
    static = self._static(num_slots=num_slots, chunk=self.chunk(int(tokens.shape[1])), impl=self.impl)
    if self.mesh is not None:
      return sharding.prefill(self.mesh, self.model.params, self.draft_params, tokens, lengths,
                              options=self.options, **static)
    args = (self.model.params, self.draft_params, tokens, lengths)
    return compiling.jit_executable("prefill", loop.prefill, args, static, options=self.options)(*args)

  def prefill_draft(self, target, tokens: jax.Array, lengths: jax.Array, chunk: int):
    """The draft's ring for prompts whose target cache is already prefilled (prefilled.py)."""
    if self.spec is None:
      return None
    args = (self.model.params, self.draft_params, target, tokens, lengths)
    return compiling.jit_executable("prefill_draft", loop.prefill_draft, args, self._static(chunk=chunk),
                                    options=self.options)(*args)

  def initial_state(self, tokens, lengths, max_new, keys, target, ring) -> loop.LoopState:
    """The loop state of a freshly prefilled batch: one executable in the LRU (eager, its ops would compile
    one small executable each per shape), the caches donated into it (not donated, XLA copies the whole
    target cache: 0.6 s at SmolLM2 8 x 2048 on CPU, ten AR steps); with a mesh, eager as placed."""
    args = (tokens, lengths, max_new, jnp.asarray(eos_array(self.eos)), keys, target, ring)
    static = dict(out_len=self.out_len(), tree=self.tree, num_variants=self.num_variants)
    if self.mesh is not None:
      return self.with_schedule(loop.initial_state(*args, **static))
    return self.with_schedule(compiling.jit_executable(
        "initial_state", loop.initial_state, args, static, options=self.options,
        donate_argnames=("target", "ring"))(*args))

  def empty_state(self, batch: int, num_slots: int) -> loop.LoopState:
    """`batch` free slots for continuous batching (stream.py)."""
    args = (jnp.asarray(eos_array(self.eos)),)
    static = self._static(batch=batch, num_slots=num_slots, out_len=self.out_len(),
                          num_variants=self.num_variants)
    if self.mesh is not None:
      return self.with_schedule(sharding.empty_state(self.mesh, *args, options=self.options, **static))
    return self.with_schedule(compiling.jit_executable("empty_state", slots.empty_state, args, static,
                                                       options=self.options)(*args))

  def insert(self, state, prefilled, slot_ids, rows, stream_ids, max_new, seed) -> loop.LoopState:
    """Prefilled rows (target, ring, tokens, lengths) into free slots of the donated state (slots.insert)."""
    args = (state, *prefilled, slot_ids, rows, stream_ids, max_new, seed)
    if self.mesh is not None:
      return sharding.insert(self.mesh, *args, cfg=self.cfg, spec=self.spec, options=self.options)
    return compiling.jit_executable("insert", slots.insert, args, {"spec": self.spec}, options=self.options,
                                    donate_argnames=("state",))(*args)

  def decode_fn(self):
    """(target_params, draft_params, state, **static) -> state: the compiled loop on one device or the mesh."""
    fn = functools.partial(sharding.decode, self.mesh) if self.mesh is not None else _decode_loop
    if self.variants is not None:    # adaptive: each variant's executable in turn (schedule.run)
      fn = functools.partial(schedule.run, fn, variants=self.variants, learning=self.learning)
    return fn if self.progress is None else functools.partial(_segmented, fn, self.progress)

  def decode(self, state: loop.LoopState) -> loop.LoopState:
    """Rounds until `state.refill_at` rows are done (the state is donated)."""
    return self.decode_fn()(self.model.params, self.draft_params, state, **self._decode_static())

  def _decode_static(self) -> dict:
    return self._static(sampling=self.sampling, impl=self.impl, options=self.options)

  def run(self, state: loop.LoopState, shrink_batch: bool = False) -> shrink.Finished:
    """The decode loop to the end, in one batch or (shrink_batch) in shrinking stages; per-row results."""
    if shrink_batch:
      return shrink.decode(self.decode_fn(), self.model.params, self.draft_params, state,
                           **self._decode_static())
    return shrink.finished(self.decode(state))

  # ---- results ---------------------------------------------------------------------------------------------
  def result(self, fin: shrink.Finished, n: int, prefill_s: float, decode_s: float) -> GenerateResult:
    """The first n rows' tokens, texts, finish reasons and figures."""
    out, n_out = fin.out, fin.n_out
    rounds, accepted, acc_at, drafted = fin.rounds[:n], fin.accepted[:n], fin.accepted_at[:n], fin.drafted[:n]
    toks = [out[i, :n_out[i]].tolist() for i in range(n)]
    reasons = ["eos" if t and t[-1] in self.eos else "length" for t in toks]
    row_stats = [row_stat(len(toks[i]), int(rounds[i]), int(accepted[i]), int(drafted[i])) for i in range(n)]
    total_new = sum(len(t) for t in toks)
    total_rounds = int(rounds.sum())
    stats = {
        "prefill_s": max(prefill_s, 0.0), "decode_s": max(decode_s, 0.0), "new_tokens": total_new,
        "tokens_per_s": total_new / decode_s if decode_s > 0 else None, "verify_steps": total_rounds,
        "loop_rounds": fin.step,     # rounds the batch ran: its slowest row's (summed over shrinking stages)
        "batch_stages": [list(x) for x in fin.stages],   # [batch, rounds, seconds] per stage (shrink_batch)
        "shrink_gather_s": list(fin.gather_s),           # seconds of each copy into a smaller batch
        "draft": self.draft_name, "tree_nodes": self.tree.num_nodes,
        "acceptance_rate": float(accepted.sum()) / float(drafted.sum()) if drafted.sum() else None,
        "mean_accepted_length": float(accepted.sum() + total_rounds) / total_rounds if total_rounds else None,
        "per_position_acceptance": (acc_at.sum(0) / total_rounds).tolist() if total_rounds else [],
    }
    if self.plan is not None:
      stats["auto_plan"] = {k: v for k, v in self.plan.items() if isinstance(v, (int, float, str))}
      stats["tree_depth"] = self.tree.max_depth
    if self.variants is not None and fin.sched is not None:
      stats["schedule"] = schedule.report(self.variants, fin.sched)
      if self.learning is not None:
        stats["schedule"]["learning"] = self.learning.report(self.variants)
    texts = None
    if self.model.tokenizer is not None:
      texts = [self.model.tokenizer.decode(t, skip_special_tokens=False) for t in toks]
    return GenerateResult(toks, texts, reasons, stats, row_stats)


def _segmented(decode_fn, bar, target_params, draft_params, state, **static):
  """decode_fn in segments of SEGMENT_ROUNDS rounds (the same executable: the limit is data), the bar
  updated with the tokens written after each; returns when decode_fn would have."""
  while True:
    limit = int(state.step) + SEGMENT_ROUNDS
    state = decode_fn(target_params, draft_params, schedule.with_limit(state, limit), **static)
    bar.update(int(np.asarray(state.n_out).sum()) - bar.n)
    if int(state.step) < limit:
      return schedule.with_limit(state, schedule.NO_LIMIT)


def _decode_loop(target_params, draft_params, state, *, options=None, **static):
  """loop.decode through the executable LRU; the LoopState is donated (caches updated in place)."""
  args = (target_params, draft_params, state)
  return compiling.jit_executable("decode", loop.decode, args, static, options=options,
                                  donate_argnames=("state",))(*args)


def generate(model: Model, prompts, *, settings: DecodeSettings | None = None, stream_ids: Sequence[int] | None = None,
             mesh=None, device_memory: int | None = None, lengths=None, attention_mask=None,
             shrink_batch: bool = False, progress: bool | None = None, **kwargs) -> GenerateResult:
  """Generate up to `max_new_tokens` per prompt; speculative when `draft` is given, same distribution.

  Decoding settings: a `DecodeSettings` (settings=) and/or its fields as keywords (max_new_tokens,
  temperature, top_k, top_p, seed, eos_token_id, draft, gamma, tree, attention_impl, hardware, acceptance,
  auto_fallback, xla_options; see settings.py). draft: None (autoregressive) or a drafts.Draft
  (StreamingDraft, SnapKVDraft, ModelDraft, FeatureDraft, PromptLookupDraft); gamma: chain length, or
  "auto": adaptive speculation (schedule.py): every round of the loop picks plain decoding (with
  auto_fallback) or a chain of gamma 1..3 from the batch's current context, at thresholds the cost model
  computes (tuning/autotune.py; `hardware` names the device or is a profile JSON from `run.py
  --mode=calibrate`, `acceptance` an acceptance vector or its JSON path from `run.py
  --mode=profile_acceptance`); stats["schedule"] says what ran at which context; `schedule` forces the
  thresholds ([(from_context, gamma), ...], gamma 0: plain). tree: a trees.Tree to speculate instead of a
  chain, or "auto" (adaptive between plain decoding and the cost model's Sequoia tree).

  stream_ids: per-prompt random-stream ids (default 0..n-1); a row's samples depend only on (seed, stream
  id), never on the rest of the batch. mesh: a sharding.make_mesh mesh (same tokens as one device; place
  the params once with sharding.shard_model). device_memory: bytes per device for the memory check;
  configurations that do not fit are refused before compiling. shrink_batch: once half the rows are done,
  go on with the rest in a batch half as large, and so on (shrink.py); same tokens; not with a mesh.
  progress: a tqdm bar (tokens, tokens/s) while decoding, the loop returning to the host every
  SEGMENT_ROUNDS rounds (same tokens); None: for max_new_tokens >= LONG_OUTPUT.

  prompts: a list of strings or of token-id lists (ragged is fine), or an integer array [B, T] (numpy or
  jax) with `lengths` [B] or an HF-style `attention_mask` [B, T] (prompts.py).
  """
  st = decode_settings(settings, **kwargs)
  check_shrink_batch(shrink_batch, mesh)
  eng = Engine(model, st, mesh=mesh, device_memory=device_memory)
  ids = prompt_ids(model, prompts, lengths=lengths, attention_mask=attention_mask)
  eng.check_prompts(ids)
  n = len(ids)
  stream_ids = list(range(n)) if stream_ids is None else [int(s) for s in stream_ids]
  if len(stream_ids) != n:
    raise ValueError(f"stream_ids has {len(stream_ids)} entries for {n} prompts")
  eng.resolve_auto(n, min(len(p) for p in ids), max(len(p) for p in ids) + st.max_new_tokens,
                   eng.prompt_bucket(max(len(p) for p in ids)), fixed_batch=True)

  b = eng.batch_rows(n)
  p_bucket = eng.prompt_bucket(max(len(p) for p in ids))
  num_slots = eng.num_slots(p_bucket)
  eng.check_memory(b, num_slots, p_bucket)
  tokens = np.zeros((b, p_bucket), np.int32)
  row_lengths = np.ones((b,), np.int32)
  for i, p in enumerate(ids):
    tokens[i, :len(p)] = p
    row_lengths[i] = len(p)
  max_new = np.zeros((b,), np.int32)
  max_new[:n] = st.max_new_tokens
  keys = stream_keys(st.seed, stream_ids + [2**31 - 1 - i for i in range(b - n)])
  compiling.ensure_persistent_cache()
  c0 = compiling.compile_seconds()
  t0 = time.perf_counter()
  tokens_j, lengths_j = jnp.asarray(tokens), jnp.asarray(row_lengths)
  target, ring = eng.prefill(tokens_j, lengths_j, num_slots)
  jax.block_until_ready(target)
  t1 = time.perf_counter()
  c1 = compiling.compile_seconds()
  state = eng.initial_state(tokens_j, lengths_j, jnp.asarray(max_new), keys, target, ring)
  if progress or (progress is None and st.max_new_tokens >= LONG_OUTPUT):
    eng.progress = tqdm.tqdm(total=n * st.max_new_tokens, unit="tok", desc="generate", leave=False)
  try:
    fin = eng.run(state, shrink_batch)
  finally:
    if eng.progress is not None:
      eng.progress.close()
  t2 = time.perf_counter()
  c2 = compiling.compile_seconds()
  # compilation (first call of a bucket) is reported apart from the prefill / decode times
  result = eng.result(fin, n, t1 - t0 - (c1 - c0), t2 - t1 - (c2 - c1))
  result.stats.update(compile_s=c2 - c0, prefill_compile_s=c1 - c0, decode_compile_s=c2 - c1)
  return result


def logits(model: Model, token_ids) -> np.ndarray:
  """A plain full forward: equal-length token-id lists [B][T] or an integer array [B, T] (numpy or jax)
  -> float32 numpy [B, T, V]."""
  ids = prompt_ids(model, token_ids)
  if len({len(t) for t in ids}) != 1:
    raise ValueError("logits() needs prompts of equal length")
  return np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)))
