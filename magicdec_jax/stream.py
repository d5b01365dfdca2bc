"""`generate_stream`: continuous batching around the compiled speculative loop; results as rows finish.

Why: a static batch keeps every finished row idle until its longest row ends (with sampling and natural
EOS, often most of the batch's row-steps). Here the decode `while_loop` returns once `refill_at` rows have
finished (a traced threshold in the state: one executable for any value; refill_at = batch reproduces
static batching), the host copies the finished rows out, prefills the next prompts as a small fixed-shape
batch (`prefill_batch` rows, prompt length bucketed) and writes them into the free slots with one donated
`slots.insert`, then re-enters the loop. Speculation and the ragged per-row accept run unchanged inside.

A row's random stream depends only on (seed, stream id) and its own round count (loop.decode_round), so a
sample's tokens are the same whatever slot, batch size, refill threshold or neighbours it gets, and the
same as `generate(..., stream_ids=[id])`. n samples of one prompt are one prefill inserted into n slots.

Requests as users write them: a `Request` (request.py) carries its own options (options.py: declared and validated
there, the same fields a datagen record or an OpenAI body converts into): max_new_tokens (a row budget:
data in the loop), seed (the seed of the insert call that places it: data too; one insert call per
distinct seed of a refill), number of samples, stop token ids and stop strings, and the fields the row
features serve (row_features/: per-row sampling), whose states the insert writes with the row. Stops are
found on the host, not in the compiled loop: while any active row has stops the loop runs in segments of
`stop_check_rounds` rounds (the segment limit is data, `schedule.with_limit`), the host decodes each such
row's new tokens, and a row whose
text now holds a stop string (a string split across tokens included) or whose tokens hold a stop id is
marked done by `finish_rows` (one small donated executable) and its slot refilled as after EOS.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Any, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import compile as compiling
from magicdec_jax import engine, row_features, schedule
from magicdec_jax.cache import aligned_slots
from magicdec_jax.loop_state import host_rows
from magicdec_jax.model import Model
from magicdec_jax.options import RequestOptions, check_count, check_stream_ids
from magicdec_jax.plan import DecodePlan, bucket, make_plan
from magicdec_jax.prompts import pad_prompts, tokenize_prompts
from magicdec_jax.request import Request, StreamResult, overflow_stream, request_options, with_features
from magicdec_jax.settings import DecodeSettings, decode_settings
from magicdec_jax.stops import cut_result, find_stop


@dataclasses.dataclass
class _Job:
  index: int
  ids: list[int]
  stream_ids: list[int]
  tag: Any
  options: RequestOptions    # its own, checked against the run
  taken: int = 0             # samples already placed in a slot
  max_new: int = 0           # token budget
  seed: int = 0

  @property
  def stop(self) -> tuple[str, ...]:
    return self.options.stop or ()

  @property
  def stop_ids(self) -> frozenset:
    return frozenset(self.options.stop_token_ids or ())

  @property
  def keep_stop(self) -> bool:
    return bool(self.options.keep_stop)


@dataclasses.dataclass
class _Board:
  """The host's view of the decode slots between loop calls (Generator._run's steps share it)."""
  batch: dataclasses.InitVar[int]
  occupant: list = None          # [B] (job, sample index) or None: a free slot
  seen_rounds: np.ndarray = None  # [B] int64: each row's rounds at the last decode call
  checked: np.ndarray = None     # [B] int64: tokens of a row already searched for stop strings
  queue: collections.deque = dataclasses.field(default_factory=collections.deque)   # jobs to prefill
  exhausted: bool = False        # the requests iterator is used up (or a bad request ended it)
  error: Exception | None = None  # that bad request's error, raised once the rows before it finish
  state: Any = None              # loop.LoopState, or None before the first prefill (and when rebuilt)
  p_cap: int = 0                 # the state's prompt bucket
  pre: Any = None                # the last prefill's (target, ring, tokens, lengths)
  pre_jobs: list = dataclasses.field(default_factory=list)   # the jobs of that prefill

  def __post_init__(self, batch: int):
    self.occupant = [None] * batch
    self.seen_rounds = np.zeros((batch,), np.int64)
    self.checked = np.zeros((batch,), np.int64)

  def idle(self) -> bool:
    """No slot holds a request (all done and nothing left to insert)."""
    return all(o is None for o in self.occupant)


class Generator:
  """An iterator of StreamResult over `requests`, in completion order; `.stats` holds running figures
  (records, new tokens, rounds, slot utilization = active row-rounds / all row-rounds, prefill / insert /
  decode / compile seconds). See `generate_stream` for the arguments."""

  def __init__(self, model: Model, requests: Iterable, *, settings: DecodeSettings | None = None,
               decode_plan: DecodePlan | None = None, batch_size: int = 8, refill_at: int = 1,
               prefill_batch: int | None = None, num_samples: int = 1, max_prompt_tokens: int | None = None,
               mesh=None, device_memory: int | None = None, stop_check_rounds: int = 1, **kwargs):
    if isinstance(requests, (str, bytes, Request)) or not isinstance(requests, Iterable):
      raise ValueError(f"requests must be an iterable of prompts or Requests, got {requests!r:.80} "
                       "(one prompt: [prompt])")
    for name, v in (("batch_size", batch_size), ("refill_at", refill_at), ("num_samples", num_samples),
                    ("stop_check_rounds", stop_check_rounds)):
      check_count(name, v, 1)
    for name, v in (("prefill_batch", prefill_batch), ("max_prompt_tokens", max_prompt_tokens)):
      if v is not None:                     # (None: the default)
        check_count(name, v, 1)
    if decode_plan is not None and not isinstance(decode_plan, DecodePlan):
      raise ValueError(f"decode_plan must be a plan.DecodePlan (plan.make_plan), got {decode_plan!r:.80}")
    if refill_at > batch_size:
      raise ValueError(f"refill_at={refill_at} is larger than batch_size={batch_size}")
    listed = isinstance(requests, Sequence)
    ids = [self._ids(model, r, i) for i, r in enumerate(requests)] if listed else None
    own = request_options(requests) if listed else None          # each Request's options, checked
    if listed and max_prompt_tokens is None:
      max_prompt_tokens = max(map(len, ids), default=1)
    if decode_plan is None:
      st = decode_settings(settings, **kwargs)
      if listed:
        st = with_features(st, own, model)
      longest = max_prompt_tokens or model.config.max_position_embeddings - st.max_new_tokens
      decode_plan = make_plan(model, st, batch=batch_size, shortest=1, longest=max(longest, 1), mesh=mesh,
                         device_memory=device_memory)
    elif settings is not None or kwargs or mesh is not None or device_memory is not None:
      raise ValueError("give either decode_plan or settings / their keywords / mesh / device_memory, not both")
    st = decode_plan.settings
    self.plan, self.settings = decode_plan, st
    self.engine = engine.Engine(model, decode_plan)
    if listed:
      self.engine.fit([o for o in own if self._servable(o)])
    self.model, self.seed = model, int(st.seed)
    self.batch = self.plan.whole_rows(batch_size)     # whole rows on every data shard
    self.refill_at, self.num_samples = int(refill_at), int(num_samples)
    self.stop_check_rounds = int(stop_check_rounds)
    self.prefill_batch = int(prefill_batch or min(self.batch, bucket(-(-refill_at // num_samples), 1)))
    self.max_prompt_tokens = max_prompt_tokens
    if listed:          # every request checked now, before anything compiles
      self._jobs = iter([self._make_job(i, r, p) for i, (r, p) in enumerate(zip(requests, ids))])
    else:               # each as it is read
      self._jobs = (self._make_job(i, r, self._ids(model, r, i)) for i, r in enumerate(requests))
    self.stats = dict(records=0, new_tokens=0, rounds=0, row_rounds=0, active_row_rounds=0, slot_utilization=None,
                      prefills=0, prefill_s=0.0, insert_s=0.0, decode_s=0.0, compile_s=0.0, decode_calls=0,
                      wall_s=0.0, tokens_per_s=None)
    self._it = self._run()

  def __iter__(self) -> Iterator[StreamResult]:
    return self

  def __next__(self) -> StreamResult:
    return next(self._it)

  def close(self) -> None:
    """Stop the stream, as a generator's close() does: the rows in flight are dropped and the batch's state
    (its KV caches) freed now, not when the Generator is; iterating on ends at once."""
    self._it.close()

  def __enter__(self) -> "Generator":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---------------------------------------------------------------------------------------------- requests

  @staticmethod
  def _ids(model: Model, r, i: int) -> list[int]:
    prompt = r.prompt if isinstance(r, Request) else r
    return tokenize_prompts(model, [prompt], first=i, label="request")[0]

  def _servable(self, o: RequestOptions) -> bool:
    """Whether the row features compiled in serve these options (a bad one is refused when it is read)."""
    try:
      row_features.check_served(o, self.engine.run_info)
      return True
    except ValueError:
      return False

  def _make_job(self, i: int, r, ids: list[int]) -> _Job:
    """Request i (its prompt's ids read already) as a job, checked: ValueError naming the request."""
    r = r if isinstance(r, Request) else Request(r)
    try:
      job = self._job(i, ids, r)
    except ValueError as e:
      raise ValueError(f"request {i}: {e}") from None
    self.plan.check_prompts([ids], job.max_new, first=i, label="request")
    return job

  def _job(self, i: int, ids: list[int], r: Request) -> _Job:
    """The request's own options, checked (alone, then against the run), with the run's as defaults."""
    o = RequestOptions.of(r)
    run_max = self.settings.max_new_tokens
    o.check_budget(run_max)
    row_features.check_served(o, self.engine.run_info)
    max_new = run_max if o.max_new_tokens is None else o.max_new_tokens
    n = self.num_samples if o.num_samples is None else o.num_samples
    sids = r.stream_ids
    if sids is None and o.seed is not None:
      sids = range(n)
    elif sids is None:
      sids = [i * self.num_samples + s if s < self.num_samples else overflow_stream(i, s) for s in range(n)]
    sids = check_stream_ids(sids)
    if o.num_samples is not None and len(sids) != n:
      raise ValueError(f"num_samples={n} but {len(sids)} stream_ids")
    if o.stop and self.model.tokenizer is None:
      raise ValueError(f"stop strings need a tokenizer; model {self.model.name!r} has none")
    vocab = self.model.config.vocab_size
    if any(t >= vocab for t in o.stop_token_ids or ()):
      raise ValueError(f"stop_token_ids must be token ids in [0, {vocab}), got {r.stop_token_ids!r}")
    st = self.settings
    for name, v, run in (("logprobs", o.logprobs, st.logprobs), ("top_logprobs", o.top_logprobs, st.top_logprobs)):
      if v is not None and v != run:
        raise ValueError(f"{name}={v!r} but the stream runs {name}={run!r} (compiled into the loop: plan the "
                         f"stream with the request's)")
    for name, feature in row_features.REGISTRY.items():
      if name not in self.engine.features and feature.wanted(o, self.engine.run_info):
        own = ", ".join(f for f in feature.fields if getattr(o, f) is not None)
        raise ValueError(f"sets its own {own} but the stream was planned without the {name!r} row feature: "
                         f"{feature.switch}")
    seed = self.seed if o.seed is None else o.seed
    return _Job(i, ids, sids, r.tag, o, max_new=int(max_new), seed=int(seed))

  # ---------------------------------------------------------------------------------------------- device

  def _timed(self, key: str, fn, *args, **kw):
    out, seconds, compiled = compiling.timed(fn, *args, **kw)
    self.stats[key] += seconds
    self.stats["compile_s"] += compiled
    return out

  def _new_state(self, p_cap: int):
    num_slots = self.plan.num_slots(p_cap)
    self.plan.check_memory(self.batch, num_slots, p_cap)
    return self.engine.empty_state(self.batch, num_slots)

  def _prefill(self, jobs: list[_Job]):
    """One fixed-shape prefill of up to prefill_batch prompts -> (target, ring, tokens, lengths)."""
    p_bucket = self.plan.prompt_bucket(max(len(j.ids) for j in jobs))
    tokens_j, lengths_j = (jnp.asarray(x) for x in pad_prompts([j.ids for j in jobs], self.prefill_batch, p_bucket))
    target, ring = self._timed("prefill_s", self.engine.prefill, tokens_j, lengths_j, aligned_slots(p_bucket))
    self.stats["prefills"] += 1
    return target, ring, tokens_j, lengths_j

  def _insert(self, state, pre, entries):
    """entries: (slot, prefilled row, stream id, token budget, seed, its RequestOptions); one insert call
    per distinct seed (the seed is data: one executable), each padded to the batch size (padding rows: the
    run's own settings)."""
    b = self.batch
    for seed in sorted({e[4] for e in entries}):
      group = [e for e in entries if e[4] == seed]
      pad = [(b, 0, 0, 0, seed, RequestOptions())] * (b - len(group))
      cols = list(zip(*(group + pad)))
      slot_a, row_a, sid_a, max_a = (np.asarray(c) for c in cols[:4])
      features = self.engine.feature_rows(cols[5])
      state = self._timed("insert_s", self.engine.insert, state, pre, jnp.asarray(slot_a, jnp.int32),
                          jnp.asarray(row_a, jnp.int32), jnp.asarray(sid_a, jnp.uint32),
                          jnp.asarray(max_a, jnp.int32), jnp.asarray(seed, jnp.uint32), features)
    return state

  def _decode(self, state, step: int, stopping: bool):
    """Rounds until refill_at rows are done; while a row has stops, at most stop_check_rounds of them."""
    limit = step + self.stop_check_rounds if stopping else schedule.NO_LIMIT
    return self._timed("decode_s", self.engine.decode, schedule.with_limit(state, limit))

  def _stops(self, state, occupant, done, n_out, checked):
    """Search the new tokens of each row with stops -> (state, done, {slot: (tokens kept, text)}); rows
    that stopped but are not done yet are marked done on the device (finish_rows)."""
    rows = [s for s, o in enumerate(occupant) if o is not None and (o[0].stop or o[0].stop_ids)
            and n_out[s] > checked[s]]
    if not rows:
      return state, done, {}
    out = np.asarray(state.out)
    tok = self.model.tokenizer              # (None: stop ids only; stop strings were refused without one)
    decode = None if tok is None else lambda t: tok.decode(t, skip_special_tokens=False)    # noqa: E731
    cuts = {}
    for s in rows:
      job = occupant[s][0]
      cut = find_stop(decode, out[s, :n_out[s]].tolist(), job.stop, job.stop_ids, job.keep_stop, int(checked[s]),
                      self.engine.plan.eos)
      checked[s] = n_out[s]
      if cut is not None:
        cuts[s] = cut
    mask = np.zeros(done.shape, bool)
    mask[[s for s in cuts if not done[s]]] = True
    if mask.any():
      state = self._timed("decode_s", self.engine.finish_rows, state, mask)
    return state, done | mask, cuts

  # ---------------------------------------------------------------------------------------------- host loop

  def _run(self) -> Iterator[StreamResult]:
    """The host loop: refill free slots, decode until rows finish, harvest them; until nothing is left."""
    t_start = time.perf_counter()
    board = _Board(self.batch)
    while True:
      self._refill(board)
      if board.idle():
        break
      finished, cuts = self._decode_until_rows_finish(board)
      if finished:
        for result in self._harvest(board, finished, cuts):
          self._update_stats([result], t_start)    # (counted as yielded: a caller may break out of the loop)
          yield result
    self._update_stats([], t_start)
    if board.error is not None:
      raise board.error

  def _top_up(self, board: "_Board") -> None:
    """Pull requests into the queue until it holds a prefill's worth (or the requests run out)."""
    while not board.exhausted and len(board.queue) < self.prefill_batch:
      try:
        job = next(self._jobs, None)
      except Exception as e:              # a bad request or the iterable's own error (an OSError reading a
        # file): the requests read before it finish and are yielded, then it raises (an interrupt: at once)
        board.error, job = e, None
      if job is None:
        board.exhausted = True
      else:
        board.queue.append(job)

  def _refill(self, board: "_Board") -> None:
    """Fill free slots: further samples of the prompts last prefilled first, then new prefills from the
    queue, inserted into the state. A larger prompt bucket or row-feature table than the state's drains
    the slots first and then rebuilds the state."""
    self._top_up(board)
    occupant = board.occupant
    free = [s for s in range(self.batch) if occupant[s] is None]
    entries = []
    while free:
      left = [(r, j) for r, j in enumerate(board.pre_jobs) if j.taken < len(j.stream_ids)]
      if left:                                   # more samples of an already prefilled prompt
        r, j = left[0]
        s = free.pop(0)
        entries.append((s, r, j.stream_ids[j.taken], j.max_new, j.seed, j.options))
        occupant[s] = (j, j.taken)
        board.seen_rounds[s] = board.checked[s] = 0
        j.taken += 1
        continue
      self._top_up(board)
      if not board.queue:
        break
      jobs = list(itertools.islice(board.queue, self.prefill_batch))
      need = self.plan.prompt_bucket(max(max(len(j.ids) for j in jobs), self.max_prompt_tokens or 0))
      grow = not self.engine.fits([j.options for j in jobs])      # a row feature's bucket (a larger schema)
      if board.state is not None and (need > board.p_cap or grow):
        if any(o is not None for o in occupant) or entries:
          break                                  # drain, then rebuild the state for longer prompts
        board.state = None
      if entries:
        board.state = self._insert(board.state, board.pre, entries)
        entries = []
      if board.state is None:
        board.p_cap = need
        self.engine.fit([j.options for j in jobs])
        board.state = self._new_state(need)
        board.seen_rounds[:] = 0
      for _ in jobs:
        board.queue.popleft()
      board.pre, board.pre_jobs = self._prefill(jobs), jobs
    if entries:
      board.state = self._insert(board.state, board.pre, entries)

  def _decode_until_rows_finish(self, board: "_Board") -> tuple[list[int], dict]:
    """One decode call (until refill_at rows are done), its stats and the stop-string search -> (the slots
    whose rows finished, {slot: stop cut})."""
    b, occupant = self.batch, board.occupant
    n_free = sum(o is None for o in occupant)
    state = board.state.replace(refill_at=jnp.asarray(n_free + min(self.refill_at, b - n_free), jnp.int32))
    step0 = int(state.step)
    stopping = any(o is not None and (o[0].stop or o[0].stop_ids) for o in occupant)
    state = self._decode(state, step0, stopping)
    if self.plan.variants is not None:
      self.stats["schedule"] = schedule.report(self.plan.variants, jax.device_get(state.sched))
      if self.engine.learning is not None:
        self.stats["schedule"]["learning"] = self.engine.learning.report(self.plan.variants)
    done, n_out, rounds = np.asarray(state.done), np.asarray(state.n_out), np.asarray(state.rounds)
    self.stats["decode_calls"] += 1
    self.stats["rounds"] += int(state.step) - step0
    self.stats["row_rounds"] += b * (int(state.step) - step0)
    busy = np.asarray([o is not None for o in occupant])
    self.stats["active_row_rounds"] += int((rounds - board.seen_rounds)[busy].sum())
    board.seen_rounds = rounds.astype(np.int64)
    board.state, done, cuts = self._stops(state, occupant, done, n_out, board.checked)
    return [s for s in range(b) if occupant[s] is not None and done[s]], cuts

  def _harvest(self, board: "_Board", finished: list[int], cuts: dict) -> list[StreamResult]:
    """The finished slots' results (every per-row array read in one tree map), their slots freed."""
    rs = host_rows(board.state.rows)
    lp = engine.logprob_arrays(rs)
    n_out = rs.n_out
    results = [self._result(board.occupant[s], rs.out[s, :n_out[s]].tolist(), int(rs.rounds[s]),
                            int(rs.accepted[s]), int(rs.drafted[s]), engine.row_logprobs(lp, s, int(n_out[s])),
                            self.engine.finish_reason(rs, s))
               for s in finished]
    for s in finished:
      board.occupant[s] = None
    return [cut_result(res, cuts.get(s)) for res, s in zip(results, finished)]

  def _result(self, occ, toks: list[int], rounds: int, accepted: int, drafted: int,
              logprobs: tuple = (None, None), reason: str = "length") -> StreamResult:
    """The finished row's record; logprobs: its (logprobs, top_logprobs) (engine.row_logprobs); reason:
    its finish reason (Engine.finish_reason)."""
    job, sample = occ
    text = None
    if self.model.tokenizer is not None:
      text = engine.row_text(self.model.tokenizer, toks, reason)
    return StreamResult(job.index, sample, job.stream_ids[sample], job.tag, toks, text, reason,
                        engine.row_stat(len(toks), rounds, accepted, drafted), *logprobs)

  def _update_stats(self, results, t_start):
    s = self.stats
    s["records"] += len(results)
    s["new_tokens"] += sum(len(r.tokens) for r in results)
    s["wall_s"] = time.perf_counter() - t_start
    s["slot_utilization"] = s["active_row_rounds"] / s["row_rounds"] if s["row_rounds"] else None
    busy = s["prefill_s"] + s["insert_s"] + s["decode_s"]
    s["tokens_per_s"] = s["new_tokens"] / busy if busy > 0 else None


def generate_stream(model: Model, requests: Iterable, *, batch_size: int = 8, refill_at: int = 1,
                    num_samples: int = 1, prefill_batch: int | None = None, max_prompt_tokens: int | None = None,
                    settings: DecodeSettings | None = None, decode_plan: DecodePlan | None = None, mesh=None,
                    device_memory: int | None = None, stop_check_rounds: int = 1, **kwargs) -> Generator:
  """Continuous-batching generation: yields a StreamResult per (request, sample) as soon as it finishes.

  requests: any iterable (consumed lazily) of prompts (text or token-id lists) or `Request`s. A list is
  checked whole before anything compiles (ValueError naming the request); a bad request of any other
  iterable, or an error the iterable raises itself, ends the stream when it is read: the requests read
  before it finish and are yielded, then that error is raised, and nothing after it is read.
  batch_size: decode slots. refill_at: the loop returns to the host to refill once this many rows have
  finished (batch_size: static batching). prefill_batch: rows per prefill call (default: enough for
  refill_at finished rows). num_samples: samples per request (one prefill, n slots, n streams).
  max_prompt_tokens: size the cache for prompts this long (default: the longest prompt when `requests`
  is a list; otherwise the cache grows to each new prompt-length bucket, draining the slots first).
  Decoding settings as `generate`'s: settings= (a DecodeSettings) and/or its fields as keywords
  (max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, draft, gamma, tree, attention_impl,
  hardware, acceptance, auto_fallback, xla_options); mesh and device_memory as `generate`'s; or
  decode_plan: a plan.DecodePlan made already (datagen plans over its whole input once). Sample s of
  request i is the sample `generate(..., stream_ids=[id])` gives for its stream id (with the request's
  seed and max_new_tokens where it has its own; `Request`). stop_check_rounds: while a row has stop
  strings or stop ids, the loop returns to the host every this many rounds to search them (a row runs
  at most this many rounds past its stop; each return costs a host round trip).
  """
  return Generator(model, requests, batch_size=batch_size, refill_at=refill_at, num_samples=num_samples,
                   prefill_batch=prefill_batch, max_prompt_tokens=max_prompt_tokens, settings=settings,
                   decode_plan=decode_plan, mesh=mesh, device_memory=device_memory,
                   stop_check_rounds=stop_check_rounds, **kwargs)
