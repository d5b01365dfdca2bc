"""The decode plan: every decision about a run made once, before anything compiles, as one frozen value.

`make_plan(model, settings, batch=, shortest=, longest=)` decides which draft runs (or none), what it
speculates (a fixed chain / tree, or adaptive speculation's variants and thresholds from the cost model),
the XLA options, the attention choice, the stop ids, and the mesh (a 1 x 1 mesh on one device: there is
one execution path). Every driver (generate, generate_stream and datagen, prefilled's demo and bench, the
CLI modes) plans once through it and hands the plan to an `engine.Engine`, which only executes it.
Re-planning from learned acceptance (schedule.Learning) returns a new plan (`replan`); nothing is
rewritten after construction. Pure host code: no array is built here.
"""
from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from magicdec_jax import backend
from magicdec_jax import compile as compiling
from magicdec_jax import schedule
from magicdec_jax.cache import MAX_CHUNK, aligned_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.drafts import Draft
from magicdec_jax.options import check_count
from magicdec_jax.pallas import IMPLS
from magicdec_jax.settings import DecodeSettings
from magicdec_jax.sharding import mesh as meshes
from magicdec_jax.sharding import planner
from magicdec_jax.trees import AR_TREE, Tree
from magicdec_jax.tuning import autotune, profiles


def bucket(n: int, minimum: int = 16) -> int:
  """The padded size for n: the next power of two, at least `minimum` (one compilation per bucket)."""
  return max(minimum, 1 << max(0, int(n - 1).bit_length()))


def cache_slots(prompt_bucket: int, max_new_tokens: int, tree_nodes: int, multiple: int = 1) -> int:
  """Target-cache slots for prompts of `prompt_bucket` tokens: the prompt, the new tokens' bucket, a
  round's tree and the pending token (rounded for the attention tile, and to a multiple of `multiple`:
  with fixed-shape numerics FixedShapes.cache_multiple, whole key blocks in one slot-count class)."""
  n = aligned_slots(prompt_bucket + bucket(max_new_tokens) + tree_nodes + 1)
  return -(-n // multiple) * multiple


def attention_reads_live_range(impl: str) -> bool:
  """Whether the target's attention reads only each row's live KV (the Pallas kernel on GPU) rather than
  the whole cache (XLA's dense attention, CPU): what a round's cost grows with."""
  return backend.name() == "gpu" and impl in ("auto", "pallas_triton")


def check_attention_impl(impl: str) -> None:
  """ValueError for an attention implementation that is none of IMPLS or that this backend cannot run (it
  failed deep in tracing or compiling): Mosaic GPU is not written, and Triton lowers only on a GPU."""
  if impl not in IMPLS:
    raise ValueError(f"attention_impl must be one of {IMPLS}, got {impl!r}")
  if impl == "pallas_mosaic":
    raise ValueError("attention_impl='pallas_mosaic': no Mosaic GPU kernel is written; use 'auto', 'xla', "
                     "'pallas_triton' (GPU) or 'pallas_interpret'")
  if impl == "pallas_triton" and backend.name() != "gpu":
    raise ValueError(f"attention_impl='pallas_triton' lowers to Triton, which needs a GPU (this backend: "
                     f"{backend.name()}); 'pallas_interpret' runs the same kernel here")


def numerics_options(cfg: ModelConfig, prefill: bool = False) -> dict[str, Any]:
  """The XLA options `cfg`'s numerics compile with: fixed shapes' (backend.FixedShapes.compiler_options, a
  prefill's when `prefill`), none for fast numerics."""
  return cfg.fixed.compiler_options(prefill) if cfg.invariant else {}


def numerics_config(config: ModelConfig, st: DecodeSettings) -> ModelConfig:
  """`config` computing with `st`'s numerics and fixed shapes (ModelConfig resolves None to the backend's)."""
  return dataclasses.replace(config, numerics=st.numerics, fixed=st.fixed_shapes)


def eos_ids(cfg: ModelConfig, eos_token_id) -> tuple[int, ...]:
  """The stop ids: the settings' (an id or a list of ids, each in the vocabulary; [] none: every row runs to
  max_new_tokens), else the model's own. ValueError naming eos_token_id for anything else (an id outside
  the vocabulary can never be drawn: it stopped nothing, silently)."""
  if eos_token_id is None:
    return tuple(cfg.eos_token_ids)
  ids = (eos_token_id,) if not isinstance(eos_token_id, (list, tuple, np.ndarray)) else tuple(eos_token_id)
  if not all(isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
             and 0 <= t < cfg.vocab_size for t in ids):
    raise ValueError(f"eos_token_id must be a token id or a list of them, each in [0, {cfg.vocab_size}) ([]: no "
                     f"stop id), got {eos_token_id!r:.80}")
  return tuple(int(t) for t in ids)


@dataclasses.dataclass(frozen=True)
class DecodePlan:
  """What a run executes. tree: the (widest) tree the loop is compiled for (AR_TREE: plain decoding);
  variants / thresholds: adaptive speculation's settings and the contexts where the choice switches
  ((at, variant) as tuples; None: one fixed setting); learn: re-plan from the acceptance the call has
  (schedule.Learning, from prior_alpha); report: the cost model's predictions (stats["auto_plan"])."""
  settings: DecodeSettings
  cfg: ModelConfig                            # the target's config with the settings' numerics
  mesh: Any                                   # a jax Mesh: 1 x 1 on one device
  draft: Draft | None
  tree: Tree = AR_TREE
  variants: tuple[Tree, ...] | None = None
  thresholds: tuple[tuple[int, ...], tuple[int, ...]] | None = None
  eos: tuple[int, ...] = ()
  options: tuple[tuple[str, Any], ...] = ()   # XLA options of the run's executables
  prefill_options: tuple[tuple[str, Any], ...] = ()   # those of its prefill executable
  batch: int = 1                              # rows planned for (before bucketing)
  contexts: tuple[int, int] = (1, 1)          # the contexts the run spans: shortest prompt .. longest + new
  fixed_batch: bool = False                   # rows run together until the slowest is done (generate)
  device_memory: int | None = None            # bytes per device for the memory check (None: the device's)
  learn: bool = False
  prior_alpha: float | None = None
  report: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

  # ---- what the plan says ------------------------------------------------------------------------------
  @property
  def spec(self):
    return None if self.draft is None else self.draft.spec

  @property
  def sampling(self):
    return self.settings.sampler

  @property
  def impl(self) -> str:
    return self.settings.attention_impl

  @property
  def xla_options(self) -> dict[str, Any]:
    return dict(self.options)

  @property
  def prefill_xla_options(self) -> dict[str, Any]:
    return dict(self.prefill_options)

  @property
  def max_new_tokens(self) -> int:
    return self.settings.max_new_tokens

  @property
  def device_rows(self) -> int:
    """The rows one device decodes (the data axis splits the batch): what the cost model prices, a device's
    step. (A model axis splits weights and caches alike, which the price does not yet count.)"""
    return -(-self.batch // meshes.axis_sizes(self.mesh)[0]) if self.mesh is not None else self.batch

  @property
  def draft_name(self) -> str | None:
    return None if self.draft is None else type(self.draft).__name__

  @property
  def num_variants(self) -> int:
    return 1 if self.variants is None else len(self.variants)

  @property
  def draft_shapes_samples(self) -> bool:
    """Whether the draft and what it speculates can change the tokens drawn (settings.draft_shapes_samples
    for the tree as planned: adaptive variants are chains or a tree)."""
    chains = all(t.is_chain or t.num_nodes == 1 for t in (self.variants or (self.tree,)))
    return self.settings.replace(tree=None if chains else self.tree, schedule=None).draft_shapes_samples

  def threshold_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
    """The thresholds as the loop state's host arrays (schedule.with_thresholds)."""
    if self.thresholds is None:
      return None
    return np.asarray(self.thresholds[0], np.int32), np.asarray(self.thresholds[1], np.int32)

  def fingerprint(self) -> dict[str, Any]:
    """The settings as run: the draft, tree and schedule as planned (datagen's resume fingerprint)."""
    fp = self.settings.fingerprint()
    fp["draft"] = None if self.draft is None else repr(self.draft)
    fp["tree"] = repr(self.tree)
    fp["schedule"] = None if self.variants is None else \
        (schedule.names(self.variants), [list(x) for x in self.thresholds])
    return fp

  # ---- shapes ------------------------------------------------------------------------------------------
  def prompt_bucket(self, longest: int) -> int:
    """The padded prompt length for prompts of up to `longest` tokens (a power of two, at least 16). Either
    numerics: with fixed-shape numerics a prompt's K/V are the same bits whatever the chunk the bucket
    gives (layers/invariant.chunk_attention), so a row is encoded the same alone or beside a longer one."""
    return bucket(longest, 16)

  def num_slots(self, prompt_bucket: int) -> int:
    return cache_slots(prompt_bucket, self.max_new_tokens, self.tree.num_nodes,
                       self.cfg.fixed.cache_multiple if self.cfg.invariant else 1)

  def out_len(self) -> int:
    return bucket(self.max_new_tokens) + self.tree.num_nodes

  @staticmethod
  def chunk(prompt_bucket: int) -> int:
    return min(prompt_bucket, MAX_CHUNK)

  def whole_rows(self, n: int) -> int:
    """n rounded up to whole rows on every data shard of the mesh."""
    d = meshes.axis_sizes(self.mesh)[0]
    return -(-n // d) * d

  def batch_rows(self, n: int) -> int:
    """The batch bucket for n rows (a power of two), whole rows on every data shard."""
    return self.whole_rows(bucket(n, 1))

  # ---- checks (host, before anything compiles) ---------------------------------------------------------
  def check_prompts(self, ids: Sequence[Sequence[int]], max_new_tokens: int | None = None, *, first: int = 0,
                    label: str = "prompt") -> None:
    """Each prompt fits the context with max_new_tokens (None: the plan's), and suits the draft (SnapKV's
    minimum length). Errors name the prompt as f"{label} {index}" (index from `first`)."""
    limit = self.cfg.max_position_embeddings
    new = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
    for i, p in enumerate(ids, first):
      if len(p) + new > limit:
        raise ValueError(f"{label} {i}: {len(p)} prompt tokens + max_new_tokens={new} exceed the model's "
                         f"context of {limit}")
    if self.spec is not None and ids:
      try:
        self.spec.check_prompts(ids)
      except ValueError as e:
        raise ValueError(f"{label} {first}: {e}" if len(ids) == 1 else str(e)) from None

  def check_memory(self, batch: int, num_slots: int, prompt_bucket: int) -> None:
    """Refuse (ValueError naming the figures) a configuration the memory planner says does not fit."""
    limit = self.device_memory if self.device_memory is not None else planner.device_memory(self.mesh)
    if limit is None:
      return
    mem = planner.plan_memory(self.cfg, self.mesh, batch=batch, max_context=num_slots, draft=self.spec,
                              tree_nodes=self.tree.num_nodes, prompt_len=prompt_bucket,
                              chunk=self.chunk(prompt_bucket))
    planner.check_fits(mem, int(limit))


@functools.lru_cache(maxsize=None)
def one_device_mesh():
  """The 1 x 1 ("data", "model") mesh on the first local device: a run without a mesh runs on this one."""
  return meshes.make_mesh("data:1,model:1", devices=jax.local_devices()[:1])


def make_plan(model, settings: DecodeSettings, *, batch: int, shortest: int, longest: int, fixed_batch: bool = False,
         mesh=None, device_memory: int | None = None) -> DecodePlan:
  """The plan for `batch` rows whose prompts hold shortest .. longest tokens (model: a model.Model).

  gamma / tree = "auto" (or a forced `schedule`): adaptive speculation for contexts shortest .. longest +
  max_new_tokens (schedule.py). The rounds switch between plain decoding (with auto_fallback, where the
  draft allows it) and chains of gamma 1..3 (tree="auto": the cost model's Sequoia tree for the middle
  context) at the contexts where the cost model's choice for this batch changes. A round is priced at the
  KV its attention reads: the live range where the kernel walks only that (Pallas on GPU), else the whole
  cache, which makes the choice one setting per call. fixed_batch: rows run together until the slowest is
  done (generate), so a chain is priced with that tail over max_new_tokens (batch_tail); not for refilled
  slots (stream, datagen). Where plain decoding is predicted best everywhere, the draft is dropped.
  """
  if not isinstance(settings, DecodeSettings):
    raise ValueError(f"settings must be a DecodeSettings, got {settings!r:.80}")
  for name, v in (("batch", batch), ("shortest", shortest), ("longest", longest)):
    check_count(name, v, 1)
  if device_memory is not None:
    check_count("device_memory (bytes)", device_memory, 1)
  if mesh is not None and (not isinstance(mesh, jax.sharding.Mesh) or set(mesh.axis_names) != set(meshes.AXES)):
    raise ValueError(f"mesh must be a ('data', 'model') jax Mesh (sharding.make_mesh), got {mesh!r:.80}")
  if mesh is not None and any(t != jax.sharding.AxisType.Auto for t in mesh.axis_types):
    raise ValueError(f"mesh axes must be Auto, got axis_types={mesh.axis_types} (jax.make_mesh makes Explicit "
                     "axes unless told otherwise: use sharding.make_mesh, or axis_types=(AxisType.Auto,) * 2)")
  st = settings
  cfg = numerics_config(model.config, st)
  data = 1 if mesh is None else meshes.axis_sizes(mesh)[0]
  if cfg.invariant and data > 1:     # each data shard computes its rows at the fixed shapes
    cfg = dataclasses.replace(cfg, fixed=dataclasses.replace(cfg.fixed, data_shards=data))
  draft = st.draft
  if draft is not None:
    draft.check_compatible(model)
    fp = draft.spec.footprint(cfg, 0, cfg.max_position_embeddings)
    if fp.ring is not None and fp.ring_slots > cfg.max_position_embeddings + 1:
      raise ValueError(f"{draft!r}: its cache of {fp.ring_slots} slots is larger than the model's context of "
                       f"{cfg.max_position_embeddings} tokens (a window that long keeps every position, and "
                       "costs its whole size at every step)")
    if st.tree == "auto":
      draft.spec.check_tree("auto")              # (before the cost model picks a tree it cannot propose)
  if isinstance(st.tree, Tree) and st.tree.max_width > cfg.vocab_size:
    raise ValueError(f"the tree of {st.tree.num_nodes} nodes has a node of {st.tree.max_width} children, more "
                     f"than the vocabulary's {cfg.vocab_size} tokens")
  check_attention_impl(st.attention_impl)
  if st.logprobs and st.top_logprobs > cfg.vocab_size:
    raise ValueError(f"top_logprobs={st.top_logprobs} exceeds the model's vocabulary of {cfg.vocab_size} tokens")
  options = {} if draft is None else draft.xla_options()
  own = st.xla_options or {}
  prefill = compiling.engine_options(backend.merged_options(options, numerics_options(cfg, prefill=True), own))
  options = compiling.engine_options(backend.merged_options(options, numerics_options(cfg), own))
  base = DecodePlan(settings=st, cfg=cfg, mesh=one_device_mesh() if mesh is None else mesh, draft=draft,
                    eos=eos_ids(cfg, st.eos_token_id), options=tuple(sorted(options.items())),
                    prefill_options=tuple(sorted(prefill.items())), batch=int(batch),
                    contexts=(int(shortest), int(longest) + st.max_new_tokens), fixed_batch=fixed_batch,
                    device_memory=device_memory)
  if draft is None:
    return base
  tree = st.speculation
  if st.schedule is not None:
    variants, th = schedule.forced(st.schedule)
    if variants[0].num_nodes == 1 and not draft.spec.commits_plain_rounds:
      raise ValueError(f"{base.draft_name} cannot keep its ring through plain rounds: schedule gamma 0 "
                       f"is not available with it")
    return _adaptive(base, variants, th, {"speculate": True, "schedule": "forced"})
  if not isinstance(tree, str):
    draft.spec.check_tree(tree)
    check_fixed_depth(cfg, tree)
    return dataclasses.replace(base, tree=tree)
  return _auto(base, want_tree=tree == "auto")


def check_fixed_depth(cfg: ModelConfig, tree) -> None:
  """Fixed-shape attention reads a round's tokens from a canonical tail of (tail_blocks - 1) x key_block
  slots: a deeper tree or chain cannot be verified bitwise, so it is refused before anything compiles."""
  if cfg.invariant and tree.max_depth > (lookback := cfg.fixed.max_depth):
    raise ValueError(f"a speculation of depth {tree.max_depth} exceeds fixed-shape numerics' tail of {lookback} "
                     f"slots (FixedShapes.tail_blocks={cfg.fixed.tail_blocks}, key_block={cfg.fixed.key_block}); "
                     f"use a shallower tree / gamma, or numerics='fast'")


def _adaptive(base: DecodePlan, variants: tuple[Tree, ...], th, report: dict, **changes) -> DecodePlan:
  for t in variants:
    if t.num_nodes > 1:
      base.spec.check_tree(t)
    check_fixed_depth(base.cfg, t)
  at, var = th
  return dataclasses.replace(base, tree=schedule.widest(variants), variants=variants,
                             thresholds=(tuple(int(x) for x in at), tuple(int(x) for x in var)), report=report,
                             **changes)


def _pricing(p: DecodePlan, want_tree: bool):
  """(priced(context, allow, alpha) -> autotune.choose's answer (cached), whether plain rounds are allowed)."""
  st = p.settings
  plain = st.auto_fallback and p.spec.commits_plain_rounds

  @functools.lru_cache(maxsize=None)
  def priced(context, allow, alpha=None):
    return autotune.choose(p.cfg, p.spec, p.device_rows, context, want_tree=want_tree, hardware=st.hardware,
                           alpha=alpha, acceptance_vector=st.acceptance, allow_autoregressive=allow,
                           max_gamma=max(schedule.AUTO_GAMMAS),
                           new_tokens=st.max_new_tokens if p.fixed_batch else None)
  return priced, plain


def _variants(p: DecodePlan, want_tree: bool, priced, plain: bool) -> tuple[tuple[Tree, ...], int]:
  lo, hi = p.contexts
  tree = priced((lo + hi) // 2, False)[0] if want_tree else None
  variants = schedule.variants_for(schedule.AUTO_GAMMAS, plain, tree)
  longest = hi - p.max_new_tokens
  whole_cache = cache_slots(p.prompt_bucket(longest), p.max_new_tokens, schedule.widest(variants).num_nodes)
  return variants, whole_cache


def _thresholds(p, priced, plain, variants, whole_cache, want_tree, alpha=None, top=None):
  live = attention_reads_live_range(p.impl)
  lo, hi = p.contexts
  return schedule.from_cost_model(lambda c: priced(c if live else whole_cache, plain, alpha), variants, lo,
                                  hi if top is None else top,
                                  max_points=32 if want_tree else schedule.GRID_POINTS)


def _auto(base: DecodePlan, want_tree: bool) -> DecodePlan:
  st, (lo, hi) = base.settings, base.contexts
  if profiles.is_profile_path(st.hardware):
    elsewhere = profiles.measured_elsewhere(profiles.load_profile(str(st.hardware))[1], base.mesh.devices.flat[0])
    if elsewhere:
      warnings.warn(f"hardware profile {st.hardware}: {elsewhere}; {'tree' if want_tree else 'gamma'}='auto' "
                    "prices this run with another device's step times", stacklevel=2)
  priced, plain = _pricing(base, want_tree)
  variants, whole_cache = _variants(base, want_tree, priced, plain)
  th, points = _thresholds(base, priced, plain, variants, whole_cache, want_tree)
  used = sorted({pt["variant"] for pt in points})
  live = attention_reads_live_range(base.impl)
  report = {"speculate": used != [0] or not plain, "hardware": priced(hi, plain)[1].get("hardware"),
            "settings": ", ".join(schedule.names([variants[v] for v in used])), "contexts": f"{lo}..{hi}",
            "priced_at": "live range" if live else f"whole cache ({whole_cache})",
            "speedup": max(pt["speedup"] for pt in points), "schedule_points": points}
  if plain and used == [0]:     # predicted to lose everywhere: plain decoding (same distribution, no draft)
    return dataclasses.replace(base, draft=None, report=report)
  learn = st.learn_acceptance and not want_tree
  return _adaptive(base, variants, th, report, learn=learn,
                   prior_alpha=autotune.chain_alpha(st.hardware, st.acceptance) if learn else None)


def replan(p: DecodePlan, alpha: float, context: int) -> tuple[DecodePlan, list[int]]:
  """A learning chain plan re-priced with the acceptance `alpha` the call has had, at the batch's current
  `context`: (the new plan, whose thresholds cover every context of the call from here on (refilled rows
  bring the mean back down); the band: the variants the cost model cannot separate at this context where
  the choice is one setting per call (whole-cache pricing), else empty)."""
  if not p.learn:
    raise ValueError("replan re-prices a learning chain plan (gamma='auto' with learn_acceptance; plan.learn), "
                     f"got one with learn=False ({p.draft_name or 'plain decoding'})")
  alpha = round(alpha, 3)
  priced, plain = _pricing(p, want_tree=False)
  _, whole_cache = _variants(p, False, priced, plain)
  th, _ = _thresholds(p, priced, plain, p.variants, whole_cache, False, alpha, max(p.contexts[1], context + 1))
  new = dataclasses.replace(p, thresholds=(tuple(int(x) for x in th[0]), tuple(int(x) for x in th[1])))
  if attention_reads_live_range(p.impl):
    return new, []
  depth = [t.max_depth for t in p.variants]
  band = autotune.chain_band(p.cfg, p.spec, p.device_rows, whole_cache, hardware=p.settings.hardware, alpha=alpha,
                             max_gamma=max(schedule.AUTO_GAMMAS), allow_autoregressive=plain,
                             new_tokens=p.max_new_tokens if p.fixed_batch else None)
  return new, [depth.index(g) for g in band]
