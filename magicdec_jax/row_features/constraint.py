"""Structured output as a row feature: a request's JSON schema / regex / choices held as a token automaton
in its row, masking every position the round draws from.

Its state (`ConstraintRows`) is the row's automaton state and the row's own table (`constraints.table`: the
row's automaton beside FREE, so an unconstrained row is automaton 0), one table per slot as
`row_features.base` asks; the table's shape is a bucket (`constraints.table.table_shape`) kept in the run's
`Run.shapes`, so a new schema of the same bucket compiles nothing, and a larger one makes the stream
rebuild its state between decode calls. The automaton is compiled on the host when the request is read
(`check`, through the compile cache: once per distinct constraint in a process), never on the decode path.

In the round, a node's state is the row's state advanced along the tokens on its path
(`constraints.ops.tree_states`; a chain is a tree), and the scores there lose every token the automaton does
not allow (-inf): the target's verify pass and every draft level alike, so acceptance compares the
constrained p with the constrained q and speculation stays lossless for the constrained distribution (a
forced position, one allowed token, is one-hot in both: proposed and accepted with certainty). A draft that
proposes without logits (prompt lookup) may propose a disallowed token: its p is 0, so verification rejects
it and the nodes below it (dead states) are never reached. EOS is allowed exactly in accepting states; a row
whose emitted tokens reach a state where only EOS is allowed ends there (`end`), finish reason "stop".
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import ClassVar, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax.constraints import (AutomatonTable, ConstraintError, TokenAutomaton, batch_table,
                                      compile_constraint, make_constraint, ops, table_shape, token_vocabulary)
from magicdec_jax.constraints.table import MIN_SHAPE
from magicdec_jax.options import CONSTRAINT_FIELDS, OptionError, RequestOptions
from magicdec_jax.row_features.base import Nodes, RowFeature, Run
from magicdec_jax.sampling import Sampling, Scores


@flax.struct.dataclass
class ConstraintRows:
  """Per-row constraint state, every leaf [B, ...]: auto [B] (FREE 0 or the row's automaton, 1), state [B]
  (a local state of it, -1 dead) and table (the row's AutomatonTable: [B, A, V], [B, S, C], ...)."""
  auto: jax.Array
  state: jax.Array
  table: AutomatonTable


def constraint_of(options: RequestOptions):
  """The request's `constraints.Constraint` (None: unconstrained); ConstraintError for a bad one."""
  return make_constraint(**{f: getattr(options, f) for f in CONSTRAINT_FIELDS})


def automaton_of(options: RequestOptions, run: Run) -> TokenAutomaton | None:
  """The request's compiled automaton over the run's vocabulary (cached per constraint and vocabulary)."""
  c = constraint_of(options)
  if c is None:
    return None
  if run.tokenizer is None:
    raise ConstraintError("structured output needs the model's tokenizer (the tokens' text), and it has none")
  return compile_constraint(c, token_vocabulary(run.tokenizer, run.eos, run.vocab_size))


_TABLES: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_LOCK = threading.Lock()
TABLE_CACHE = 64


def row_table(automaton: TokenAutomaton | None, vocab_size: int, shape: tuple[int, int, int]):
  """(the numpy AutomatonTable of one row holding `automaton` at the bucket `shape`, its auto index),
  cached per (automaton, shape)."""
  key = (None if automaton is None else automaton.key, vocab_size, tuple(shape))
  with _LOCK:
    if key in _TABLES:
      _TABLES.move_to_end(key)
      return _TABLES[key]
  table, auto = batch_table([automaton], vocab_size, min_shape=shape)
  if table.shape != tuple(shape):
    raise ValueError(f"a constraint table of shape {table.shape} does not fit the state's {tuple(shape)}")
  with _LOCK:
    _TABLES[key] = (table, int(auto[0]))
    while len(_TABLES) > TABLE_CACHE:
      _TABLES.popitem(last=False)
  return table, int(auto[0])


def _rows(f, *args):
  """f(table, auto [1], state [1, ...]) per row: vmapped over the batch, the row axis kept as ops' B = 1."""
  return jax.vmap(lambda t, a, *rest: f(t, a[None], *(x[None] for x in rest))[0])(*args)


def node_states(rows: ConstraintRows, tokens: jax.Array, parents) -> jax.Array:
  """[B, N] the state at every node of a tree whose node tokens are tokens [B, N] (node 0: the row's)."""
  v = rows.table.token_class.shape[-1]
  tok = jnp.clip(tokens, 0, v - 1)
  return _rows(lambda t, a, s, x: ops.tree_states(t, a, s, x, parents), rows.table, rows.auto, rows.state, tok)


def allowed_at(rows: ConstraintRows, states: jax.Array) -> jax.Array:
  """[B, E, V] bool: the tokens allowed in states [B, E]; a dead state (-1, reached only through a token
  that is not allowed, so never by an accepted path) allows every token, which keeps its scores finite."""
  ok = _rows(ops.allowed, rows.table, rows.auto, states)
  return ok | (states < 0)[..., None]


def path_states(rows: ConstraintRows, emitted: jax.Array) -> jax.Array:
  """[B, K + 1]: the row's state, then the state after each of emitted [B, K] in turn."""
  v = rows.table.token_class.shape[-1]
  tok = jnp.clip(emitted, 0, v - 1)
  return _rows(ops.chain_states, rows.table, rows.auto, rows.state, tok)


@dataclasses.dataclass(frozen=True)
class Constraints(RowFeature):
  """Each row's output matches its request's constraint (JSON schema, regex or choices; see the module)."""

  name: ClassVar[str] = "constraint"
  fields: ClassVar[tuple[str, ...]] = CONSTRAINT_FIELDS
  masks: ClassVar[bool] = True
  switch: ClassVar[str] = ("pass a list of requests (it turns structured output on by itself) or "
                           "DecodeSettings(row_features=('constraint',))")

  # ---- host ---------------------------------------------------------------------------------------------
  def check(self, options: RequestOptions, run: Run) -> None:
    try:
      automaton_of(options, run)
    except ConstraintError as e:
      field = next(f for f in CONSTRAINT_FIELDS if getattr(options, f) is not None)
      raise OptionError(field, getattr(options, field), "", message=str(e)) from None

  def shape(self, options: Sequence[RequestOptions], run: Run) -> tuple[int, int, int]:
    shapes = [table_shape([a]) for a in (automaton_of(o, run) for o in options) if a is not None]
    return tuple(int(x) for x in np.max([MIN_SHAPE] + shapes, axis=0))

  def fill(self, options: Sequence[RequestOptions], run: Run) -> ConstraintRows:
    shape = tuple(run.shapes.get(self.name, MIN_SHAPE))
    tables, autos = zip(*(row_table(automaton_of(o, run), run.vocab_size, shape) for o in options))
    table = jax.tree.map(lambda *x: np.stack(x), *tables)
    auto = np.asarray(autos, np.int32)
    return ConstraintRows(auto=auto, state=np.asarray(ops.start_states(auto)), table=table)

  def finish_reason(self, state: ConstraintRows, row: int) -> str | None:
    t = state.table
    s = int(state.state[row])
    if int(state.auto[row]) == 0 or s < 0:
      return None
    return "stop" if bool(t.done[row][int(t.offset[row][int(state.auto[row])]) + s]) else None

  # ---- the compiled round -------------------------------------------------------------------------------
  def logits(self, state: ConstraintRows, scores: Scores, nodes: Nodes, sampling: Sampling) -> Scores:
    states = node_states(state, nodes.tokens, nodes.tree.parents)[:, nodes.index]      # [B, E]
    ok = allowed_at(state, states)
    return Scores(jnp.where(ok, scores.x, -jnp.inf), scores.argmax)

  def end(self, state: ConstraintRows, emitted: jax.Array, count: jax.Array):
    after = path_states(state, emitted)[:, 1:]                                          # [B, D+1]
    i = jnp.arange(emitted.shape[1])[None, :]
    complete = _rows(ops.is_done, state.table, state.auto, after) & (i < count[:, None]) & (after >= 0)
    ended = complete.any(-1)
    return jnp.where(ended, jnp.argmax(complete, axis=-1) + 1, count).astype(count.dtype), ended

  def advance(self, state: ConstraintRows, emitted: jax.Array, count: jax.Array) -> ConstraintRows:
    states = path_states(state, emitted)
    return state.replace(state=jnp.take_along_axis(states, count[:, None], axis=1)[:, 0])
