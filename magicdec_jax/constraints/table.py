"""The automata of one batch stacked into one padded table, sized in buckets so that another set of
constraints of the same bucket gives the same shapes (the compiled loop is reused, not recompiled).

Layout. Automaton 0 is FREE (every token allowed, always accepting): the rows without a constraint. The
others follow in the order given. A row holds (auto: its automaton's index in the table, state: a state of
its own automaton, 0 at the start, -1 dead). Each automaton's states occupy consecutive rows of the global
state arrays from `offset[auto]`; global row 0 is DEAD (nothing allowed), where state -1 reads. Because a
row's state is local to its automaton, a new table (requests come and go) keeps every row's state valid:
only the row's `auto` index is renumbered.

Buckets: the number of automata, the total state rows and the classes per automaton are each rounded up to
a power of two (at least MIN_SHAPE); `min_shape` raises them further (a stream that wants one shape).
"""
from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import numpy as np

from magicdec_jax.constraints.automaton import TokenAutomaton

MIN_SHAPE = (2, 16, 8)          # (automata, state rows, classes): the smallest bucket
DEAD = 0                        # the global state row of state -1
FREE = 0                        # the automaton index of unconstrained rows


@flax.struct.dataclass
class AutomatonTable:
  """Every array is indexed as the ops in `constraints.ops` do; shapes (A, S, C) are bucketed."""
  token_class: jax.Array     # [A, V] int32: each automaton's class of each token
  next_state: jax.Array      # [S, C] int32: local next state of a global state row and a class, -1: not allowed
  offset: jax.Array          # [A] int32: global row of each automaton's local state 0
  accepting: jax.Array       # [S] bool
  forced: jax.Array          # [S] int32: token id, -1 none
  done: jax.Array            # [S] bool

  @property
  def shape(self) -> tuple[int, int, int]:
    """(automata, state rows, classes)."""
    return (self.token_class.shape[0],) + tuple(self.next_state.shape)


def bucket(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= max(n, minimum)."""
  n = max(int(n), int(minimum), 1)
  return 1 << (n - 1).bit_length()


def table_shape(automata: Sequence[TokenAutomaton], min_shape: tuple[int, int, int] = MIN_SHAPE
                ) -> tuple[int, int, int]:
  """(A, S, C) of the table holding FREE and `automata`: the bucket of each."""
  a = 1 + len(automata)
  s = 2 + sum(x.num_states for x in automata)           # DEAD, FREE's one state, the automata's states
  c = max([1] + [x.num_classes for x in automata])
  lo = np.maximum(MIN_SHAPE, min_shape)
  return bucket(a, lo[0]), bucket(s, lo[1]), bucket(c, lo[2])


def build_table(automata: Sequence[TokenAutomaton], vocab_size: int,
                min_shape: tuple[int, int, int] = MIN_SHAPE) -> AutomatonTable:
  """FREE then `automata` (index i + 1), in numpy arrays of the bucketed shape. All automata must be over
  `vocab_size` tokens."""
  bad = [x.vocab_size for x in automata if x.vocab_size != vocab_size]
  if bad:
    raise ValueError(f"automaton over {bad[0]} tokens in a table of vocab_size {vocab_size}")
  a, s, c = table_shape(automata, min_shape)
  token_class = np.zeros((a, vocab_size), np.int32)
  next_state = np.full((s, c), -1, np.int32)
  offset = np.zeros(a, np.int32)
  accepting = np.zeros(s, bool)
  forced = np.full(s, -1, np.int32)
  done = np.zeros(s, bool)
  offset[FREE] = 1                       # FREE: one state, one class holding every token, a self-loop
  next_state[1, 0] = 0
  accepting[1] = True
  row = 2
  for i, x in enumerate(automata, start=1):
    n = x.num_states
    token_class[i] = x.token_class
    next_state[row:row + n, :x.num_classes] = x.next_state
    offset[i] = row
    accepting[row:row + n] = x.accepting
    forced[row:row + n] = x.forced
    done[row:row + n] = x.done
    row += n
  return AutomatonTable(token_class=token_class, next_state=next_state, offset=offset, accepting=accepting,
                        forced=forced, done=done)


def batch_table(rows: Sequence[TokenAutomaton | None], vocab_size: int,
                min_shape: tuple[int, int, int] = MIN_SHAPE) -> tuple[AutomatonTable, np.ndarray]:
  """The table of a batch whose row b has automaton rows[b] (None: unconstrained), and each row's
  automaton index [B] int32 (FREE for None). Equal automata (same key) are stored once."""
  distinct: dict[tuple, int] = {}
  automata: list[TokenAutomaton] = []
  auto = np.zeros(len(rows), np.int32)
  for b, x in enumerate(rows):
    if x is None:
      continue
    k = x.key if x.key else ("object", id(x))
    if k not in distinct:
      distinct[k] = len(automata) + 1
      automata.append(x)
    auto[b] = distinct[k]
  return build_table(automata, vocab_size, min_shape), auto
