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
every round, an extra pass over the whole KV per round; see tests/model/test_hlo_no_copies.py.)

While a call runs the host learns what the cost model guessed (`Learning`): the acceptance of chain rounds,
counted from the loop's own counters between executable calls, and each setting's measured tokens/s. At
rounds 32, 64, 128, ... of the call (each re-plan on twice the evidence of the last) it re-prices the
thresholds with the learned acceptance; where the model cannot separate settings (predicted within its
tie of each other: whole-cache pricing, where one setting serves the whole call), it runs each for one
interval and keeps the one measured fastest. A profile measured on held-out text (teacher-forced)
underestimates the acceptance of the model's own sampled continuation: SmolLM2 with its bf16 self-draft at
T 0.8 / top-p 0.95 accepted 0.92 per position in the loop against 0.85 profiled, and the profile's pricing
kept gamma 2 where gamma 3 ran 5% faster (benchmarks/decode/long_output.py).

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

from magicdec_jax.options import is_int
from magicdec_jax.trees import AR_TREE, Tree

AUTO_GAMMAS = (1, 2, 3)     # the chains "auto" switches between (with plain decoding)
PRIOR_TRIALS = 64           # the prior acceptance (profile or default) counts as this many draft positions
FIRST_CHECK = 32            # rounds before the first re-plan with learned acceptance; the interval then doubles
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


def variant_at(at, variant, ctx):
  """The variant thresholds (at, variant) give context ctx (jax or numpy arrays alike)."""
  return variant[(at <= ctx).sum()]


def pick(s: Sched, ctx: jax.Array) -> jax.Array:
  return variant_at(s.at, s.variant, ctx)


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


class ChainEvidence:
  """Draft positions tried and accepted in chain rounds. Position d of a chain round is tried iff positions
  < d were accepted, so with positions accepted independently at rate alpha, accepted / tried is alpha's
  maximum-likelihood estimate; the prior (the profile's or the default alpha) counts as `prior_trials`."""

  def __init__(self, prior_alpha: float, prior_trials: float = PRIOR_TRIALS):
    self.prior_alpha, self.prior_trials = float(prior_alpha), float(prior_trials)
    self.tried = self.accepted = 0.0

  @property
  def alpha(self) -> float:
    return (self.prior_alpha * self.prior_trials + self.accepted) / (self.prior_trials + self.tried)

  def observe(self, tree: Tree, before, after) -> None:
    """Count the positions of the chain rounds run between two `counters` readings (other variants:
    nothing; a row whose counters went down was replaced, and is skipped)."""
    if tree.num_nodes == 1 or not tree.is_chain:
      return
    g = tree.max_depth
    (r0, a0), (r1, a1) = before, after
    dr, da = r1 - r0, (a1 - a0)[:, :g]
    ok = (dr >= 0) & (da >= 0).all(1)
    tried = np.concatenate([dr[:, None], da[:, :g - 1]], 1)     # position d tried iff d - 1 accepted
    self.tried += float(tried[ok].sum())
    self.accepted += float(da[ok].sum())


def counters(state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(rounds [B], accepted_at [B, D], n_out [B]) on the host: what the learning differences."""
  return np.asarray(state.rounds), np.asarray(state.accepted_at), np.asarray(state.n_out)


class Learning:
  """What adaptive speculation learns while a call runs, and the re-plans it makes from it.

  * The acceptance of chain rounds (`ChainEvidence`).
  * Each variant's measured tokens/s: tokens written over the seconds of its executable calls, on a clock
    that leaves compilation out.

  At re-plan rounds (`first_check`, then at doubling intervals) `replan(alpha, context) -> (thresholds,
  band)` re-prices the call with the learned alpha. `band` lists the variants the cost model cannot
  separate at this context (predicted within its tie of the best; empty: trust the thresholds). Where the
  band holds more than one, each member is run for one interval in turn, then the one measured fastest is
  kept until the next re-plan."""

  def __init__(self, prior_alpha: float, replan, clock, prior_trials: float = PRIOR_TRIALS,
               first_check: int = FIRST_CHECK):
    self.evidence = ChainEvidence(prior_alpha, prior_trials)
    self.replan, self.clock = replan, clock
    self.seconds: dict[int, float] = {}
    self.tokens: dict[int, float] = {}
    self.interval, self.next_check, self.last_step = first_check, None, 0
    self.updates: list[dict] = []
    self.thresholds = None          # the latest re-plan's (at, variant): where a later state starts from

  @property
  def alpha(self) -> float:
    return self.evidence.alpha

  def rate(self, v: int) -> float:
    return self.tokens.get(v, 0.0) / self.seconds[v] if self.seconds.get(v) else 0.0

  def limit(self, step: int, outer: int) -> int:
    """Where the next executable call must return: the caller's limit or the next re-plan (counted from
    here on a new state, whose rounds start again)."""
    if self.next_check is None or step < self.last_step:
      self.next_check = step + self.interval
    self.last_step = step
    return min(outer, self.next_check)

  def observe(self, v: int, tree: Tree, before, after, seconds: float) -> None:
    (r0, a0, n0), (r1, a1, n1) = before, after
    self.evidence.observe(tree, (r0, a0), (r1, a1))
    dn = n1 - n0
    if int(r1.max(initial=0)) > int(r0.max(initial=0)) or dn.any():
      self.seconds[v] = self.seconds.get(v, 0.0) + seconds
      self.tokens[v] = self.tokens.get(v, 0.0) + float(dn[dn >= 0].sum())

  def maybe_replan(self, state, variants: Sequence[Tree]):
    """At a re-plan round: the thresholds for the call from here (None otherwise)."""
    step = self.last_step = int(state.step)
    if self.next_check is None or step < self.next_check:
      return None
    self.interval *= 2
    self.next_check = step + self.interval
    ctx = int(context(state.lengths, state.done))
    th, band = self.replan(self.alpha, ctx)
    self.thresholds = th
    rec = {"round": step, "context": ctx, "alpha": round(self.alpha, 4), "tried": int(self.evidence.tried)}
    if len(band) > 1:
      untried = [v for v in band if not self.seconds.get(v)]
      pick = untried[0] if untried else max(band, key=self.rate)
      rec.update(band=names([variants[v] for v in band]), why="explore" if untried else "measured fastest",
                 measured_tokens_per_s={names([variants[v]])[0]: round(self.rate(v), 2) for v in band
                                        if self.seconds.get(v)})
      th = thresholds([(0, pick)])
    if th is not None:
      at, var = th
      rec["setting_from_here"] = names([variants[int(variant_at(np.asarray(at), np.asarray(var), ctx))]])[0]
    self.updates.append(rec)
    return th

  def report(self, variants: Sequence[Tree]) -> dict:
    nm = names(variants)
    ev = self.evidence
    return {"prior_alpha": ev.prior_alpha, "prior_trials": ev.prior_trials, "tried": int(ev.tried),
            "accepted": int(ev.accepted), "alpha": round(ev.alpha, 4),
            "measured_tokens_per_s": {nm[v]: round(self.rate(v), 2) for v in sorted(self.seconds)},
            "replans": self.updates}


def run(decode_fn, target_params, draft_params, state, *, variants: tuple[Tree, ...],
        learning: Learning | None = None, **static):
  """decode_fn (loop.decode's signature) through the variants' executables until it would have returned
  for the caller (rows done for refill_at, the caller's segment limit, the round cap). With `learning`,
  each call is measured and the thresholds re-planned at its re-plan rounds."""
  max_rounds = state.out.shape[1]
  outer = int(state.sched.limit)
  while True:
    v = host_pick(state)
    step0 = int(state.step)
    if learning is not None:
      before = counters(state)
      state = with_limit(state, learning.limit(step0, outer))
      t0 = learning.clock()
    state = decode_fn(target_params, draft_params, state, variants=variants, variant=v, **static)
    if learning is not None:
      after = counters(state)                       # (waits for the call)
      learning.observe(v, variants[v], before, after, learning.clock() - t0)
      new = learning.maybe_replan(state, variants)
      state = with_limit(state, outer)
      if new is not None:
        state = state.replace(sched=with_thresholds(state.sched, *new))
    done, step = np.asarray(state.done), int(state.step)
    if (done.sum() >= int(state.refill_at) or int(np.asarray(state.rounds).max()) >= max_rounds
        or step >= outer):
      return state
    if step == step0 and host_pick(state) == v:
      raise RuntimeError("adaptive decode made no progress (host and device disagree on the variant)")


def with_limit(state, limit: int):
  """The state with its segment limit replaced: the loop returns once `step` reaches it (data)."""
  return state.replace(sched=state.sched.replace(limit=jnp.asarray(limit, jnp.int32)))


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
    pairs = [(c, g) for c, g in schedule]
  except (TypeError, ValueError):
    pairs = None
  if pairs is None or not all(is_int(c) and is_int(g) for c, g in pairs):
    raise ValueError(f"schedule must be a list of (from_context, gamma) integer pairs, got {schedule!r:.80}")
  pairs = [(int(c), int(g)) for c, g in pairs]
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
