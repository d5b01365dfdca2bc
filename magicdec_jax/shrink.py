"""A fixed batch that shrinks as its rows finish (`generate(..., shrink_batch=True)`).

In one compiled loop every row runs until the slowest is done: a finished row is frozen but still costs
its share of every round. Speculative rows finish at different rounds (each accepts at its own rate), so
at 8 x 8000 on a 2-core CPU the batch ran 30 rounds where the mean row needed 24.6, and on a CPU, where
the verify pass is compute-bound, those idle rows are real time.

`decode` runs the loop in stages. A stage of B rows returns once half of them are done
(`LoopState.refill_at`); the per-row results (`LoopState.rows`) are copied to the host, the rows still
running are gathered into a batch of the next power of two that holds them (every leaf but the shared
part's: both caches, the rows with their counters, PRNG keys, buffers and row features' states), and the
next stage goes on from there, down to `min_batch`. A row's computation
does not depend on the other rows — its own K/V, its own PRNG stream fold_in(key, its own round count)
— so the tokens are the fixed batch's. Each smaller batch is another executable of the loop, compiled
once per shape (then kept in the LRU and the persistent cache): a one-off call pays those compiles. The
gather writes the survivors' caches into new buffers: on a 2-core CPU VM, where first writes to fresh pages
are slow, that copy (up to 2.0 s for 4 rows of SmolLM2's 8 x 8000 cache) and the new buffers' first rounds
cost more than the idle rows they saved (docs/shrink-batch.md: 0.97-0.99x of the fixed batch). Hence
opt-in. Not under a mesh (its batch must stay a multiple of the data shards).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import compile as compiling
from magicdec_jax.loop_state import LoopState, Rows, host_rows


@dataclasses.dataclass
class Finished:
  """The per-row results `Engine.result` reads, for every row of the original batch."""
  rows: Rows               # on the host (numpy): each row's state as its last stage left it ([B, ...])
  step: int                # rounds run, summed over the stages
  stages: list             # [(batch, rounds run at that batch, seconds without compilation), ...]
  gather_s: list = dataclasses.field(default_factory=list)   # seconds of each shrinking copy
  sched: Any = None        # the final LoopState.sched (rounds per setting, switches)


def take_rows(state: LoopState, rows: jax.Array) -> LoopState:
  """The state of rows `rows` [b'] (in that order): every per-row leaf gathered, the shared part kept."""
  taken = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state.per_row())
  return taken.replace(shared=state.shared)


def _next_batch(active: int, min_batch: int) -> int:
  """The smallest power of two >= active, at least min_batch."""
  return max(1 << max(active - 1, 0).bit_length(), min_batch)


def _with_refill(state: LoopState, refill_at: int) -> LoopState:
  return state.replace(refill_at=jnp.asarray(refill_at, jnp.int32))


def decode(decode_fn, target_params, draft_params, state: LoopState, *, min_batch: int = 1,
           options=None, **static) -> Finished:
  """Run `decode_fn` (Engine.decode_fn's signature) in shrinking stages until every row is done; options:
  the XLA options of the row gathers between stages."""
  if not isinstance(min_batch, int) or min_batch < 1:
    raise ValueError(f"min_batch must be an integer >= 1, got {min_batch!r}")
  b = int(state.lengths.shape[0])
  fin = Finished(rows=None, step=0, stages=[])
  rows = np.arange(b)            # original row of each slot of the current batch
  while True:
    cur = rows.size
    can_shrink = cur > min_batch
    step0, t0, c0 = int(state.step), time.perf_counter(), compiling.compile_seconds()
    state = decode_fn(target_params, draft_params, _with_refill(state, cur - cur // 2 if can_shrink else cur),
                      **static)
    rounds = int(state.step) - step0
    fin.stages.append((cur, rounds, time.perf_counter() - t0 - (compiling.compile_seconds() - c0)))
    now = host_rows(state.rows)
    if fin.rows is None:
      fin.rows = jax.tree.map(lambda x: np.zeros((b,) + x.shape[1:], x.dtype), now)
    jax.tree.map(lambda dst, x: dst.__setitem__(rows, x), fin.rows, now)
    done = np.asarray(state.done)
    if done.all() or not can_shrink:
      fin.step, fin.sched = int(state.step), jax.device_get(state.sched)
      return fin
    active = np.flatnonzero(~done)
    nb = _next_batch(active.size, min_batch)
    if nb >= cur:               # (min_batch) nothing to gain: run the rest at this size
      min_batch = cur
      continue
    keep = np.concatenate([active, np.flatnonzero(done)[:nb - active.size]])   # pad with finished rows
    keep_j = jnp.asarray(keep, jnp.int32)
    t0, c0 = time.perf_counter(), compiling.compile_seconds()
    state = compiling.jit_executable("take_rows", take_rows, (state, keep_j), {}, options=options)(state, keep_j)
    jax.block_until_ready(state.done)
    fin.gather_s.append(time.perf_counter() - t0 - (compiling.compile_seconds() - c0))
    rows = rows[keep]


def finished(state: LoopState) -> Finished:
  """The per-row results of a state every row of which ran in one stage (no shrinking)."""
  b = int(state.lengths.shape[0])
  return Finished(rows=host_rows(state.rows), step=int(state.step), stages=[(b, int(state.step), None)],
                  sched=jax.device_get(state.sched))
