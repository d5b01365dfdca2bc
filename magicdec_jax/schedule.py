"""Adaptive speculation: each round of the compiled loop picks its setting from the batch's context.

MagicDec's gain depends on the context: below a crossover plain decoding is faster, above it speculation
wins, and the best chain grows with the context. `gamma="auto"` (or `tree="auto"`) decodes with a fixed
set of settings ("variants": plain decoding, chains of gamma 1..3, or plain and one Sequoia tree), one
state sized for the widest. Which variant a round runs is DATA: context thresholds the host computes from
the cost model (hardware profile + acceptance vector, tuning/autotune.choose at every context of a grid)
and writes into `LoopState.sched`, so changing them never recompiles. The context of a round is the mean
committed length L of the batch's active rows.

Each variant has its own executable of the loop (loop.decode(variant=i)), which returns before the first
round the schedule gives another variant; `run` re-enters the next one's with the same (donated) state,
so a switch costs one host round trip and no round is wasted. (A `lax.switch` between whole rounds inside
one while_loop was built first: XLA's copy insertion then copied the target cache and the draft ring in
every round, an extra pass over the whole KV per round; see tests/test_hlo_no_copies.py.)

`DecodeSettings.schedule` forces thresholds instead: [(from_context, gamma), ...] with gamma 0 for plain
decoding (tests force switches at chosen contexts this way; the output is the same distribution, and
greedy / invariant sampling give plain decoding's tokens, under any schedule).
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.trees import AR_TREE, Tree

AUTO_GAMMAS = (1, 2, 3)     # the chains "auto" switches between (with plain decoding)
MAX_THRESHOLDS = 16         # thresholds a schedule holds (fixed: one executable for any schedule)
LOG_SIZE = 32               # switches recorded per call (round, context, variant)
GRID_POINTS = 256           # contexts the cost model is asked about per call
NO_LIMIT = np.iinfo(np.int32).max


@flax.struct.dataclass
class Sched:
  """The loop's schedule (data) and what it did. Variant of a round at context c: variant[#(at <= c)]."""
  at: jax.Array        # [K] context thresholds, ascending (NO_LIMIT padded)
  variant: jax.Array   # [K + 1] variant index below at[0], from at[0], ...
  rounds: jax.Array    # [V] batch rounds run under each variant
  first: jax.Array     # [V] context of each variant's first round (-1: never used)
  log: jax.Array       # [LOG_SIZE, 3] (round, context, variant) of every switch, first LOG_SIZE
  n_log: jax.Array     # [] switches logged
  current: jax.Array   # [] variant of the last round (-1: none yet)
  limit: jax.Array     # [] the loop returns once `step` reaches it (segments of a long call)


def empty(num_variants: int) -> Sched:
  """Variant 0 at every context, nothing run yet, no segment limit."""
  return Sched(at=jnp.full((MAX_THRESHOLDS,), NO_LIMIT, jnp.int32),
               variant=jnp.zeros((MAX_THRESHOLDS + 1,), jnp.int32),
               rounds=jnp.zeros((num_variants,), jnp.int32), first=jnp.full((num_variants,), -1, jnp.int32),
               log=jnp.full((LOG_SIZE, 3), -1, jnp.int32), n_log=jnp.zeros((), jnp.int32),
               current=jnp.full((), -1, jnp.int32), limit=jnp.full((), NO_LIMIT, jnp.int32))


def with_thresholds(s: Sched, at: np.ndarray, variant: np.ndarray) -> Sched:
  """The schedule's data replaced (host arrays from `thresholds`), its record kept."""
  return s.replace(at=jnp.asarray(at, jnp.int32), variant=jnp.asarray(variant, jnp.int32))


def context(lengths: jax.Array, done: jax.Array) -> jax.Array:
  """[] the batch's context: mean committed length of the active rows (0 with none)."""
  active = ~done
  n = active.sum()
  return (jnp.where(active, lengths, 0).sum() // jnp.maximum(n, 1)).astype(jnp.int32)


def pick(s: Sched, ctx: jax.Array) -> jax.Array:
  return s.variant[(s.at <= ctx).sum()]


def record(s: Sched, v: jax.Array, ctx: jax.Array, step: jax.Array) -> Sched:
  """Count a round of variant v at context ctx; log it where it differs from the last round's."""
  switched = v != s.current
  slot = jnp.where(switched & (s.n_log < LOG_SIZE), s.n_log, LOG_SIZE)
  return s.replace(rounds=s.rounds.at[v].add(1),
                   first=s.first.at[v].set(jnp.where(s.first[v] < 0, ctx, s.first[v])),
                   log=s.log.at[slot].set(jnp.stack([step, ctx, v]), mode="drop"),
                   n_log=s.n_log + switched, current=v)


# ------------------------------------------------------------------------------------------------- host

def host_pick(state) -> int:
  """The variant the loop would pick for `state`'s next round (the loop's own `context` and `pick`)."""
  return int(pick(state.sched, context(state.lengths, state.done)))


def run(decode_fn, target_params, draft_params, state, *, variants: tuple[Tree, ...], **static):
  """decode_fn (loop.decode's signature) through the variants' executables until it would have returned
  for the caller (rows done for refill_at, the segment limit, the round cap)."""
  max_rounds = state.out.shape[1]
  while True:
    v = host_pick(state)
    step0 = int(state.step)
    state = decode_fn(target_params, draft_params, state, variants=variants, variant=v, **static)
    done, step = np.asarray(state.done), int(state.step)
    if (done.sum() >= int(state.refill_at) or int(np.asarray(state.rounds).max()) >= max_rounds
        or step >= int(state.sched.limit)):
      return state
    if step == step0 and host_pick(state) == v:
      raise RuntimeError("adaptive decode made no progress (host and device disagree on the variant)")

def variants_for(gammas: Sequence[int], plain: bool, tree: Tree | None = None) -> tuple[Tree, ...]:
  """The static variant set, narrowest first: plain (if allowed), the chains, or plain and a tree."""
  out = [AR_TREE] if plain else []
  if tree is not None:
    return tuple(out + [tree])
  return tuple(out + [Tree.chain(int(g)) for g in sorted(set(gammas))])


def widest(variants: Sequence[Tree]) -> Tree:
  """The variant the state is sized for (cache slots, ring scratch, accepted_at depth, out buffer)."""
  w = max(variants, key=lambda t: (t.num_nodes, t.max_depth))
  if any(t.max_depth > w.max_depth for t in variants):
    raise ValueError("the widest variant must also be the deepest")
  return w


def thresholds(choices: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
  """[(from_context, variant), ...] ascending -> (at [K], variant [K+1]) for `Sched`."""
  at = np.full((MAX_THRESHOLDS,), NO_LIMIT, np.int32)
  var = np.zeros((MAX_THRESHOLDS + 1,), np.int32)
  runs = []
  for c, v in choices:            # merge repeats
    if not runs or runs[-1][1] != v:
      runs.append((int(c), int(v)))
  if len(runs) > MAX_THRESHOLDS + 1:
    raise ValueError(f"a schedule holds at most {MAX_THRESHOLDS} switches, got {len(runs) - 1}")
  var[:] = runs[-1][1]
  var[0] = runs[0][1]
  for i, (c, v) in enumerate(runs[1:]):
    at[i] = c
    var[i + 1] = v
  return at, var


def pairs(variants: Sequence[Tree], at: np.ndarray, variant: np.ndarray) -> list[tuple[int, int]] | None:
  """Thresholds back as a forced schedule [(from_context, gamma), ...] (None where a variant is a tree)."""
  if any(t.num_nodes > 1 and not t.is_chain for t in variants):
    return None
  n = int((np.asarray(at) < NO_LIMIT).sum())
  return [(0 if i == 0 else int(at[i - 1]), variants[int(variant[i])].max_depth) for i in range(n + 1)]


def check_forced(schedule) -> list[tuple[int, int]]:
  """A forced schedule [(from_context, gamma), ...] validated (contexts ascending, gamma >= 0)."""
  try:
    pairs = [(int(c), int(g)) for c, g in schedule]
  except (TypeError, ValueError):
    raise ValueError(f"schedule must be a list of (from_context, gamma) pairs, got {schedule!r:.80}") from None
  if not pairs or any(g < 0 or c < 0 for c, g in pairs) or any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])):
    raise ValueError(f"schedule needs (from_context >= 0, gamma >= 0) pairs with contexts ascending, got {pairs}")
  return pairs


def forced(schedule) -> tuple[tuple[Tree, ...], tuple[np.ndarray, np.ndarray]]:
  """A user's schedule -> (variants: plain if any gamma is 0, each chain used; thresholds)."""
  pairs = check_forced(schedule)
  gammas = sorted({g for _, g in pairs if g > 0})
  variants = variants_for(gammas, plain=any(g == 0 for _, g in pairs))
  index = {t.max_depth: i for i, t in enumerate(variants)}
  return variants, thresholds([(c, index[g]) for c, g in pairs])


def grid(lo: int, hi: int, max_points: int = GRID_POINTS) -> list[int]:
  """Contexts the cost model is asked about: lo .. hi, at most about max_points, steps of a multiple of 16."""
  step = max(16, -(-(hi - lo) // max_points // 16) * 16)
  return list(range(max(int(lo), 1), int(hi) + step, step))


def from_cost_model(choose, variants: Sequence[Tree], lo: int, hi: int,
                    max_points: int = GRID_POINTS) -> tuple[tuple[np.ndarray, np.ndarray], list]:
  """Thresholds from `choose(context) -> (tree, info)` (autotune.choose bound to the batch, hardware and
  acceptance) over contexts lo .. hi: asked on a grid, each change located exactly by bisection; the choice
  at each context is mapped to its variant (a chain outside the set: the nearest chain)."""
  def variant_at(c):
    tree, info = choose(c)
    if tree.num_nodes == 1 or tree in variants:
      v = 0 if tree.num_nodes == 1 else variants.index(tree)
    else:
      v = min((i for i in range(len(variants)) if variants[i].num_nodes > 1),
              key=lambda i: abs(variants[i].max_depth - tree.max_depth))
    return v, float(info.get("speedup", 1.0))

  choices, points, prev = [], [], None
  for c in grid(lo, hi, max_points):
    v, speedup = variant_at(c)
    if prev is not None and v != prev[1]:      # the first context in (prev, c] with the new choice
      a, b = prev[0], c
      while b - a > 1:
        m = (a + b) // 2
        a, b = (m, b) if variant_at(m)[0] == prev[1] else (a, m)
      choices.append((b, variant_at(b)[0]))
    choices.append((c, v))
    points.append({"context": c, "variant": v, "speedup": speedup})
    prev = (c, v)
  if choices:
    choices[0] = (0, choices[0][1])
  return thresholds(choices), points


def names(variants: Sequence[Tree]) -> list[str]:
  return ["plain" if t.num_nodes == 1 else f"gamma={t.max_depth}" if t.is_chain else f"tree{t.num_nodes}"
          for t in variants]


def report(variants: Sequence[Tree], s: Any) -> dict:
  """Stats of a finished call: rounds per setting, the first context each was used at, the switches."""
  nm = names(variants)
  rounds, first, log = np.asarray(s.rounds), np.asarray(s.first), np.asarray(s.log)
  n = min(int(s.n_log), LOG_SIZE)
  return {"settings": nm, "rounds": {nm[i]: int(rounds[i]) for i in range(len(nm))},
          "first_context": {nm[i]: int(first[i]) for i in range(len(nm)) if first[i] >= 0},
          "switches": [{"round": int(r), "context": int(c), "setting": nm[int(v)]} for r, c, v in log[:n]],
          "switches_logged_of": int(s.n_log)}
