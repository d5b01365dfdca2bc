"""The engine: executes a decode plan (plan.py) as prefill / insert / decode steps on its mesh.

Every driver goes through it: `generation.generate` (one fixed batch), `stream.generate_stream` and datagen
(continuous batching: prefill, insert into free slots, decode until rows finish), `prefilled` (prefill
once, decode several ways: the demo, the context sweep, `--mode=bench`). The decisions (draft, chain or
tree or adaptive schedule, bucketed shapes, XLA options, attention, mesh) are the plan's, made once
before anything compiles; the engine only places the params and compiles each step with the shardings
the partition rules give (sharding/rules.py) — one execution path, a 1 x 1 mesh on one device.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from magicdec_jax import compile as compiling
from magicdec_jax import loop, row_features, schedule, shrink, slots
from magicdec_jax.cache import ring_margin
from magicdec_jax.loop_state import Rows
from magicdec_jax.model import Model
from magicdec_jax.plan import DecodePlan
from magicdec_jax.plan import replan as plan_replan
from magicdec_jax.options import RequestOptions
from magicdec_jax.row_features import Run
from magicdec_jax.sharding import rules

SEGMENT_ROUNDS = 128      # with a progress bar, the loop returns to the host every this many rounds
PAD_STREAM = 2**31 - 1    # padding row i of a batch draws from stream PAD_STREAM - i (never a request's)


@dataclasses.dataclass
class GenerateResult:
  tokens: list[list[int]]            # new token ids per prompt
  texts: list[str] | None            # decoded new text per prompt (when the model has a tokenizer)
  finish_reasons: list[str]          # "eos", "length" or "stop" (a constraint complete)
  stats: dict[str, Any]              # whole-call figures (times, tokens/s, acceptance)
  row_stats: list[dict[str, Any]]    # per-prompt figures
  logprobs: list[list[float]] | None = None     # per prompt, per new token: its log-probability (logprobs=True)
  top_logprobs: list[list[list[tuple[int, float]]]] | None = None   # per token: (id, log-prob), most likely first


def eos_array(eos: tuple[int, ...]) -> np.ndarray:
  """Stop ids as the loop's [E] int32 array (-1 padded, at least one entry)."""
  out = np.full((max(len(eos), 1),), -1, np.int32)
  out[:len(eos)] = eos
  return out


def stream_keys(seed: int, stream_ids: Sequence[int], rows: int | None = None) -> jax.Array:
  """Per-row PRNG keys: row i's stream is fold_in(key(seed), stream_ids[i]), whatever its slot; `rows`:
  padded with streams no request uses."""
  ids = list(stream_ids) + [PAD_STREAM - i for i in range((rows or len(stream_ids)) - len(stream_ids))]
  base_key = jax.random.key(seed)
  return jax.vmap(lambda s: jax.random.fold_in(base_key, s))(jnp.asarray(ids, jnp.uint32))


def acceptance(accepted, drafted, rounds) -> tuple[float | None, float | None]:
  """(acceptance rate over the draft tokens proposed, mean tokens per verify step) from the counts."""
  accepted, drafted, rounds = float(accepted), float(drafted), float(rounds)
  return (accepted / drafted if drafted else None), ((accepted + rounds) / rounds if rounds else None)


def row_stat(new_tokens: int, rounds: int, accepted: int, drafted: int) -> dict[str, Any]:
  """One row's figures: verify steps, accepted draft tokens, acceptance rate (over the draft tokens
  proposed on its rounds' paths: plain rounds of a schedule propose none), mean accepted length."""
  rate, mean = acceptance(accepted, drafted, rounds)
  return {"new_tokens": new_tokens, "verify_steps": rounds, "accepted_tokens": accepted, "drafted_tokens": drafted,
          "acceptance_rate": rate, "mean_accepted_length": mean}


def row_text(tokenizer, toks: list[int], reason: str) -> str:
  """A finished row's text: its tokens decoded (special tokens kept) but for the stop id that ended it
  (reason "eos"), whose text is not output, as a stop id of a request's is not."""
  return tokenizer.decode(toks[:-1] if reason == "eos" else toks, skip_special_tokens=False)


def logprob_arrays(x: Rows) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None:
  """The log-probability buffers of a LoopState's rows or shrink.Finished's on the host: (logprob [B, M],
  top ids [B, M, K], top log-probs [B, M, K]), the top ones None without alternatives; None: logprobs off."""
  if x.out_logprob.shape[1] == 0:
    return None
  top = x.out_top_ids.shape[-1] > 0
  return (np.asarray(x.out_logprob), np.asarray(x.out_top_ids) if top else None,
          np.asarray(x.out_top_logprob) if top else None)


def row_logprobs(arrays, row: int, n: int) -> tuple[list[float] | None, list[list[tuple[int, float]]] | None]:
  """Row `row`'s first n tokens' (logprobs, top_logprobs) from `logprob_arrays` (None where not asked for).
  Alternatives outside a top-k / top-p cut (probability 0, log -inf) are left out of a position's list."""
  if arrays is None:
    return None, None
  lp, ids, top = arrays
  chosen = lp[row, :n].astype(float).tolist()
  if ids is None:
    return chosen, None
  return chosen, [[(int(t), float(v)) for t, v in zip(ids[row, i], top[row, i]) if np.isfinite(v)]
                  for i in range(n)]


def check_shrink_batch(shrink_batch, p: DecodePlan) -> None:
  """ValueError (before anything compiles) for a shrink_batch that is not a bool, or set on a mesh of
  several devices."""
  if not isinstance(shrink_batch, bool):
    raise ValueError(f"shrink_batch must be True or False, got {shrink_batch!r}")
  if shrink_batch and p.mesh.size > 1:
    raise ValueError("shrink_batch is not supported with a mesh of several devices (the batch must stay a "
                     "multiple of the data shards)")


def mark_done(state, mask):
  """`state` with rows `mask` [B] done (the finish_rows step's body)."""
  return state.replace(done=state.done | mask)


def _initial_state(tokens, lengths, max_new, eos, keys, target, ring, features, **static) -> loop.LoopState:
  """loop.initial_state with the row features' states positional (the engine passes its arrays so)."""
  return loop.initial_state(tokens, lengths, max_new, eos, keys, target, ring, features=features, **static)


class Engine:
  """Executes `plan` for `model`: its params placed on the plan's mesh once, each step compiled once per
  shape (compile.py's LRU) with the partition rules' shardings; a learning plan's re-plans are kept in
  `learning` (schedule.Learning), the plan itself never changes."""

  def __init__(self, model: Model, decode_plan: DecodePlan):
    if not isinstance(decode_plan, DecodePlan):
      raise ValueError(f"an Engine runs a plan.DecodePlan, got {decode_plan!r:.80}")
    p = self.plan = decode_plan
    self.model, self.mesh, self.cfg, self.spec, self.tree = model, p.mesh, p.cfg, p.spec, p.tree
    self.draft_cfg = None if self.spec is None else self.spec.network_config(self.cfg)
    self.target_params = rules.place_params(model.params, self.cfg, self.mesh)
    self.draft_params = None
    if p.draft is not None:
      dcfg = self.draft_cfg if self.draft_cfg is not None else self.cfg
      self.draft_params = rules.place_params(p.draft.params(model), dcfg, self.mesh)
    self.param_sh = self._params_sh()      # the placed params' shardings: fixed, so computed once
    self.features = row_features.enabled(p.settings)      # the row features compiled in
    self.run_info = Run(dataclasses.replace(p.sampling, per_row=False), self.cfg.vocab_size, model.tokenizer,
                        eos=tuple(p.eos))
    self.learning: schedule.Learning | None = None
    if p.learn:
      self.learning = schedule.Learning(p.prior_alpha, self._replan,
                                        clock=lambda: time.perf_counter() - compiling.compile_seconds())

  def _replan(self, alpha: float, context: int):
    """schedule.Learning's re-plan: a new plan priced with the learned alpha; its thresholds and band."""
    new, band = plan_replan(self.plan, alpha, context)
    return new.threshold_arrays(), band

  # ---- shardings ---------------------------------------------------------------------------------------
  def _state_sh(self, tree):
    return rules.state_shardings(tree, self.mesh, self.cfg, self.draft_cfg)

  def _params_sh(self):
    tp = rules.param_shardings(self.target_params, self.cfg, self.mesh)
    dp = None if self.draft_params is None else rules.param_shardings(
        self.draft_params, self.draft_cfg if self.draft_cfg is not None else self.cfg, self.mesh)
    return tp, dp

  def _rows(self, x) -> NamedSharding:
    return rules.row_sharding(x.shape, self.mesh)

  def _replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def _executable(self, name: str, fun, args: tuple, static: dict, in_sh: tuple, out_sh, donate: tuple = (),
                  options=None):
    """(fun's executable for these shapes, compiled once (compile.py) with XLA `options` (None: the
    plan's decode options), and args placed per in_sh); call under `jax.set_mesh(self.mesh)`."""
    args = jax.device_put(args, in_sh)
    options = self.plan.xla_options if options is None else options
    return compiling.jit_executable(name, fun, args, static, options=options,
                                    donate_argnames=donate, in_shardings=in_sh, out_shardings=out_sh), args

  def _run(self, name: str, fun, args: tuple, static: dict, in_sh: tuple, out_sh, donate: tuple = (),
           options=None):
    """fun(*args, **static) on the mesh."""
    with jax.set_mesh(self.mesh):
      exe, args = self._executable(name, fun, args, static, in_sh, out_sh, donate, options)
      return exe(*args)

  def _static(self, **extra) -> dict:
    return dict(cfg=self.cfg, spec=self.spec, tree=self.tree, **extra)

  # ---- device steps ------------------------------------------------------------------------------------
  def prefill(self, tokens: jax.Array, lengths: jax.Array, num_slots: int) -> tuple[Any, Any]:
    """Right-padded prompts [B, P] -> (target cache with num_slots slots, the draft's ring or None)."""
    fun, args, static, in_sh, out_sh, donate, options = self._step_call("prefill", tokens, lengths, num_slots)
    target = self._run("prefill", fun, args, static, in_sh, out_sh, donate, options)
    return target, self.prefill_draft(target, tokens, lengths, static["chunk"])

  def _prefill_call(self, tokens, lengths, num_slots):
    chunk = self.plan.chunk(int(tokens.shape[1]))
    static = dict(cfg=self.cfg, num_slots=num_slots, margin=ring_margin(self.tree.num_nodes, chunk), chunk=chunk,
                  impl=self.plan.impl)
    return (self.target_params, tokens, lengths), static, (self.param_sh[0], self._rows(tokens), self._rows(lengths))

  def _target_sh(self, target):
    return self._state_sh((target,))[0]

  def prefill_draft(self, target, tokens: jax.Array, lengths: jax.Array, chunk: int):
    """The draft's ring for prompts whose target cache is already prefilled (prefilled.py)."""
    if self.spec is None:
      return None
    args = (self.target_params, self.draft_params, target, tokens, lengths)
    in_sh = (*self.param_sh, self._target_sh(target), self._rows(tokens), self._rows(lengths))
    return self._run("prefill_draft", loop.prefill_draft, args, self._static(chunk=chunk), in_sh,
                     lambda ring: self._state_sh((None, ring))[1])

  def fits(self, options: Sequence[RequestOptions]) -> bool:
    """Whether states built now hold rows with these options (the row features' buckets, Run.shapes)."""
    return row_features.shapes(self.features, options, self.run_info) == dict(self.run_info.shapes)

  def fit(self, options: Sequence[RequestOptions]) -> None:
    """Grow the buckets states are built with to hold rows with these options (states built before keep
    theirs: a stream rebuilds its state when a request does not fit, `fits`)."""
    self.run_info = dataclasses.replace(self.run_info,
                                        shapes=row_features.shapes(self.features, options, self.run_info))

  def finish_reason(self, rows, i: int) -> str:
    """The finish reason of finished row i of host `Rows` (loop_state.host_rows): "eos" for a stop id, a
    row feature's (a completed constraint: "stop"), else "length"."""
    last = int(rows.out[i, rows.n_out[i] - 1]) if rows.n_out[i] else -1
    return "eos" if last in self.plan.eos else row_features.finish_reason(rows.features, i) or "length"

  def feature_rows(self, options: Sequence[RequestOptions] | int) -> dict:
    """The states of the row features compiled in for these requests' options (an int n: n rows of the
    run's own settings), [n, ...] each (row_features.fill)."""
    if isinstance(options, int):
      options = [RequestOptions()] * options
    return row_features.fill(self.features, options, self.run_info)

  def initial_state(self, tokens, lengths, max_new, keys, target, ring,
                    features: dict | None = None) -> loop.LoopState:
    """The loop state of a freshly prefilled batch, the caches donated into it (not donated, XLA copies
    the whole target cache: 0.6 s at SmolLM2 8 x 2048 on CPU, ten AR steps). features: the rows' row
    feature states (`feature_rows`; None: the run's own settings on every row)."""
    eos = jnp.asarray(eos_array(self.plan.eos))
    if features is None:
      features = self.feature_rows(int(tokens.shape[0]))
    args = (tokens, lengths, max_new, eos, keys, target, ring, features)
    static = dict(out_len=self.plan.out_len(), tree=self.tree, num_variants=self.plan.num_variants,
                  logprobs=self.plan.settings.logprob_width)
    in_sh = (self._rows(tokens), self._rows(lengths), self._rows(max_new), self._replicated(), self._rows(keys),
             *self._state_sh((target, ring)), jax.tree.map(self._rows, features))
    return self.with_schedule(self._run("initial_state", _initial_state, args, static, in_sh, self._state_sh,
                                        donate=("target", "ring")))

  def empty_state(self, batch: int, num_slots: int) -> loop.LoopState:
    """`batch` free slots for continuous batching (stream.py), built straight into their shards."""
    features = self.feature_rows(batch)
    args = (jnp.asarray(eos_array(self.plan.eos)), features)
    static = self._static(batch=batch, num_slots=num_slots, out_len=self.plan.out_len(),
                          num_variants=self.plan.num_variants, logprobs=self.plan.settings.logprob_width)
    in_sh = (self._replicated(), jax.tree.map(self._rows, features))
    return self.with_schedule(self._run("empty_state", slots.empty_state, args, static, in_sh, self._state_sh))

  def insert(self, state, prefilled, slot_ids, rows, stream_ids, max_new, seed,
             features: dict | None = None) -> loop.LoopState:
    """Prefilled rows (target, ring, tokens, lengths) into free slots of the donated state (slots.insert):
    the caches keep their shardings, the small arrays are replicated. features: each entry's row feature
    states ([n, ...], `feature_rows`; None: the run's own settings)."""
    target, ring, *rest = prefilled
    if features is None:
      features = self.feature_rows(int(slot_ids.shape[0]))
    rest = (*rest, slot_ids, rows, stream_ids, max_new, seed, features)
    st = self._state_sh(state)
    in_sh = (st, *self._state_sh((target, ring)), *(self._replicated() for _ in rest))
    return self._run("insert", slots.insert, (state, target, ring, *rest), {"spec": self.spec}, in_sh, st,
                     donate=("state",))

  def finish_rows(self, state: loop.LoopState, mask) -> loop.LoopState:
    """The state (donated) with rows `mask` [B] bool marked done: a stop string the host found. The loop
    freezes them and counts them toward refill_at, as after EOS."""
    sh = self._state_sh(state)
    return self._run("finish_rows", mark_done, (state, jnp.asarray(mask)), {}, (sh, self._replicated()), sh,
                     donate=("state",))

  def _decode_loop(self, target_params, draft_params, state, **static):
    """loop.decode on the mesh; the LoopState is donated (caches updated in place)."""
    st = self._state_sh(state)
    return self._run("decode", loop.decode, (target_params, draft_params, state), static,
                     (*self.param_sh, st), st, donate=("state",))

  def _step_call(self, kind: str, *args):
    """(fun, args, static, in_sh, out_sh, donate, XLA options) of "prefill" (tokens, lengths, num_slots;
    the plan's prefill options) or "decode" (a LoopState; None: the decode options)."""
    if kind == "prefill":
      call, static, in_sh = self._prefill_call(*args)
      return loop.prefill, call, static, in_sh, self._target_sh, (), self.plan.prefill_xla_options
    if kind == "decode":
      st = self._state_sh(args[0])
      return (loop.decode, (self.target_params, self.draft_params, args[0]), self._decode_static(),
              (*self.param_sh, st), st, ("state",), None)
    raise ValueError(f"kind must be 'prefill' or 'decode', got {kind!r}")

  def compiled_text(self, kind: str, *args) -> str:
    """The optimized HLO of "prefill" (tokens, lengths, num_slots) or "decode" (a LoopState) as this
    engine compiles it (cached: a later call with the same shapes runs this very executable)."""
    fun, call, static, in_sh, out_sh, donate, options = self._step_call(kind, *args)
    with jax.set_mesh(self.mesh):
      return self._executable(kind, fun, call, static, in_sh, out_sh, donate, options)[0].as_text()

  def exported(self, kind: str, *args, platform: str = "cuda") -> jax.export.Exported:
    """`compiled_text`'s step lowered for `platform` through jax.export, without its shardings: a GPU's
    lowering (Pallas Triton kernels included) checked on a machine without one. Triton's own compile to
    GPU code is not part of it."""
    fun, call, static, *_ = self._step_call(kind, *args)
    return compiling.export_for(platform, functools.partial(fun, **static), *call)

  def with_schedule(self, state: loop.LoopState) -> loop.LoopState:
    """The state with the plan's thresholds (the latest re-plan's where the call learns; fixed settings:
    as it is)."""
    th = self.plan.threshold_arrays()
    if self.learning is not None and self.learning.thresholds is not None:
      th = self.learning.thresholds
    return state if th is None else state.replace(sched=schedule.with_thresholds(state.sched, *th))

  def decode_fn(self, progress=None):
    """(target_params, draft_params, state, **static) -> state: the compiled loop (adaptive: each variant's
    executable in turn, schedule.run); progress: a tqdm bar, the loop run in segments of SEGMENT_ROUNDS."""
    fn = self._decode_loop
    if self.plan.variants is not None:
      fn = functools.partial(schedule.run, fn, variants=self.plan.variants, learning=self.learning)
    return fn if progress is None else functools.partial(_segmented, fn, progress)

  def decode(self, state: loop.LoopState, progress=None) -> loop.LoopState:
    """Rounds until `state.refill_at` rows are done (the state is donated)."""
    return self.decode_fn(progress)(self.target_params, self.draft_params, state, **self._decode_static())

  def _decode_static(self) -> dict:
    return self._static(sampling=self.plan.sampling, impl=self.plan.impl)

  def run(self, state: loop.LoopState, shrink_batch: bool = False, progress=None) -> shrink.Finished:
    """The decode loop to the end, in one batch or (shrink_batch) in shrinking stages; per-row results."""
    if shrink_batch:
      return shrink.decode(self.decode_fn(progress), self.target_params, self.draft_params, state,
                           options=self.plan.xla_options, **self._decode_static())
    return shrink.finished(self.decode(state, progress))

  # ---- results ---------------------------------------------------------------------------------------------
  def result(self, fin: shrink.Finished, n: int, prefill_s: float, decode_s: float) -> GenerateResult:
    """The first n rows' tokens, texts, finish reasons and figures."""
    rs, p = fin.rows, self.plan
    out, n_out = rs.out, rs.n_out
    rounds, accepted, acc_at, drafted = rs.rounds[:n], rs.accepted[:n], rs.accepted_at[:n], rs.drafted[:n]
    toks = [out[i, :n_out[i]].tolist() for i in range(n)]
    reasons = [self.finish_reason(rs, i) for i in range(n)]
    row_stats = [row_stat(len(toks[i]), int(rounds[i]), int(accepted[i]), int(drafted[i])) for i in range(n)]
    total_new = sum(len(t) for t in toks)
    total_rounds = int(rounds.sum())
    rate, mean = acceptance(accepted.sum(), drafted.sum(), total_rounds)
    stats = {
        "prefill_s": max(prefill_s, 0.0), "decode_s": max(decode_s, 0.0), "new_tokens": total_new,
        "tokens_per_s": total_new / decode_s if decode_s > 0 else None, "verify_steps": total_rounds,
        "loop_rounds": fin.step,     # rounds the batch ran: its slowest row's (summed over shrinking stages)
        # [batch, rounds, seconds] per stage (shrink_batch; one stage: the decode's seconds)
        "batch_stages": [[b, r, max(decode_s, 0.0) if t is None else t] for b, r, t in fin.stages],
        "shrink_gather_s": list(fin.gather_s),           # seconds of each copy into a smaller batch
        "draft": p.draft_name, "tree_nodes": self.tree.num_nodes,
        "acceptance_rate": rate, "mean_accepted_length": mean,
        "per_position_acceptance": (acc_at.sum(0) / total_rounds).tolist() if total_rounds else [],
    }
    if p.report:
      stats["auto_plan"] = {k: v for k, v in p.report.items() if isinstance(v, (int, float, str))}
      stats["tree_depth"] = self.tree.max_depth
    if p.variants is not None and fin.sched is not None:
      stats["schedule"] = schedule.report(p.variants, fin.sched)
      if self.learning is not None:
        stats["schedule"]["learning"] = self.learning.report(p.variants)
    texts = None
    if self.model.tokenizer is not None:
      texts = [row_text(self.model.tokenizer, t, r) for t, r in zip(toks, reasons)]
    arrays = logprob_arrays(rs)
    lp = [row_logprobs(arrays, i, len(toks[i])) for i in range(n)]
    logprobs = None if not p.settings.logprobs else [c for c, _ in lp]
    top = None if not p.settings.top_logprobs else [t for _, t in lp]
    return GenerateResult(toks, texts, reasons, stats, row_stats, logprobs, top)


def _segmented(decode_fn, bar, target_params, draft_params, state, **static):
  """decode_fn in segments of SEGMENT_ROUNDS rounds (the same executable: the limit is data), the bar
  updated with the tokens written after each; returns when decode_fn would have. The bar counts on from
  where it stands: a shrunk batch's state no longer holds the rows it left behind."""
  before = bar.n - int(np.asarray(state.n_out).sum())
  while True:
    limit = int(state.step) + SEGMENT_ROUNDS
    state = decode_fn(target_params, draft_params, schedule.with_limit(state, limit), **static)
    bar.update(before + int(np.asarray(state.n_out).sum()) - bar.n)
    if int(state.step) < limit:
      return schedule.with_limit(state, schedule.NO_LIMIT)
