"""A constraint compiled to a finite automaton over tokens, stored as small integer arrays.

outlines-core's `Index` gives, for every state of the regex's byte automaton, the tokens allowed there and
the state each leads to. Here that becomes arrays a compiled loop can index: tokens that behave alike in
every state share a class (the columns of the state x token transition table are grouped into equivalence
classes), so the transition table is [S, C] with C in the hundreds instead of [S, V]. States that cannot
reach an accepting state are pruned (a row can never be walked into a state with nothing allowed), the start
state is 0, and EOS is a self-loop exactly on accepting states.

`compile_constraint` is cached per (constraint, vocabulary) in this process.
"""
from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np
from outlines_core import Index

from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.index import token_index
from magicdec_jax.constraints.spec import Constraint
from magicdec_jax.constraints.vocabulary import TokenVocabulary


@dataclasses.dataclass(frozen=True, eq=False)
class TokenAutomaton:
  """A constraint's automaton. From state s, token t is allowed iff next_state[s, token_class[t]] >= 0, and
  leads there. EOS ids are allowed exactly where accepting (a self-loop). forced[s]: the one allowed token
  where exactly one is and s is not accepting (the loop may take it without drafting), else -1. done[s]:
  accepting with nothing but EOS allowed. The start state is 0. key: (kind, spec, vocabulary fingerprint)."""
  key: tuple
  token_class: np.ndarray    # [V] int32
  next_state: np.ndarray     # [S, C] int32, -1: not allowed
  accepting: np.ndarray      # [S] bool
  forced: np.ndarray         # [S] int32
  done: np.ndarray           # [S] bool
  class_size: np.ndarray     # [C] int32: tokens per class

  start = 0

  def __post_init__(self):
    for a in (self.token_class, self.next_state, self.accepting, self.forced, self.done, self.class_size):
      a.setflags(write=False)             # shared through the compile cache

  @property
  def num_states(self) -> int:
    return self.next_state.shape[0]

  @property
  def num_classes(self) -> int:
    return self.next_state.shape[1]

  @property
  def vocab_size(self) -> int:
    return self.token_class.shape[0]

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in (self.token_class, self.next_state, self.accepting, self.forced, self.done,
                                  self.class_size))


def _edges(index: Index, v: int):
  """The token index with states renumbered 0..S-1: (start: the state after the prefix, src [E], token
  [E], dst [E] (real tokens only), accepting [S] bool: the sentinel ends the text there, successors: per
  state the set of next states)."""
  transitions = index.get_transitions()
  finals = index.get_final_states()
  ids = sorted(set(transitions) | set(finals) | {index.get_initial_state()})
  lut = np.full(max(ids) + 1, -1, np.int64)
  lut[ids] = np.arange(len(ids))
  number = {s: i for i, s in enumerate(ids)}
  src, tok, dst = [], [], []
  successors: list[set[int]] = [set() for _ in ids]
  accepting = np.zeros(len(ids), bool)
  for s, moves in transitions.items():
    n = len(moves)
    tok.append(np.fromiter(moves.keys(), np.int64, n))
    dst.append(lut[np.fromiter(moves.values(), np.int64, n)])
    src.append(np.full(n, number[s], np.int64))
    nexts = set(moves.values())
    virtual = [moves[t] for t in (v, v + 1, v + 2) if t in moves]
    if virtual:
      accepting[number[s]] = moves.get(v) in finals     # else the sentinel continues (inside a string)
      values = list(moves.values())
      nexts -= {d for d in virtual if values.count(d) == virtual.count(d)}   # reached by no real token
    successors[number[s]] = {number[d] for d in nexts}
  src, tok, dst = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (src, tok, dst))
  keep = tok < v
  start = number[transitions[index.get_initial_state()][v + 2]]
  return start, src[keep], tok[keep], dst[keep], accepting, successors


def _live(start: int, successors: list[set[int]], accepting: np.ndarray) -> np.ndarray:
  """The states reachable from start from which an accepting state is reachable, in BFS order from start."""
  back: list[list[int]] = [[] for _ in successors]
  for a, nexts in enumerate(successors):
    for b in nexts:
      back[b].append(a)
  alive = set(np.flatnonzero(accepting).tolist())
  todo = list(alive)
  while todo:
    for a in back[todo.pop()]:
      if a not in alive:
        alive.add(a)
        todo.append(a)
  if start not in alive:
    return np.zeros(0, np.int64)
  order, seen = [start], {start}
  for s in order:
    for b in sorted(successors[s]):
      if b in alive and b not in seen:
        seen.add(b)
        order.append(b)
  return np.asarray(order, np.int64)


def _classes(src, tok, dst, rep: np.ndarray, num_states: int, seed: int) -> np.ndarray:
  """token -> class id: tokens whose (state -> next state) columns are equal share one. A random linear
  hash of each representative's column groups them (a token has its representative's); `_table` then
  checks the grouping exactly. Classes are numbered by their smallest token."""
  r = np.random.default_rng(seed).integers(0, 2**63, size=num_states, dtype=np.uint64) | np.uint64(1)
  h = np.zeros(len(rep), np.uint64)
  np.add.at(h, tok, r[src] * (dst.astype(np.uint64) + np.uint64(1)))
  member = rep >= 0
  h[member] = h[rep[member]]
  _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
  rank = np.empty(len(first), np.int64)
  rank[np.argsort(first, kind="stable")] = np.arange(len(first))
  return rank[inverse.reshape(-1)].astype(np.int32)


def _table(src, tok, dst, weight, cls: np.ndarray, num_states: int) -> np.ndarray | None:
  """next_state [S, C] from the edges and the classes; None when two tokens of one class differ somewhere
  (a hash collision). weight [E]: the tokens each edge's token stands for."""
  num_classes = int(cls.max()) + 1
  table = np.full((num_states, num_classes), -1, np.int32)
  table[src, cls[tok]] = dst
  if not np.array_equal(table[src, cls[tok]], dst):
    return None
  size = np.bincount(cls, minlength=num_classes)
  allowed = (table >= 0).astype(np.int64) @ size
  if not np.array_equal(allowed, np.bincount(src, weights=weight, minlength=num_states).astype(np.int64)):
    return None
  return table


def compile_regex(regex: str, vocabulary: TokenVocabulary, key: tuple = ()) -> TokenAutomaton:
  """The automaton of `regex` (Rust syntax, full match) over `vocabulary`. Raises ConstraintError when
  outlines-core refuses it or when no token sequence matches it."""
  index, rep, group = token_index(regex, vocabulary)
  eos, v = vocabulary.eos_ids, vocabulary.vocab_size
  start, src, tok, dst, accepting, successors = _edges(index, v)
  order = _live(start, successors, accepting)
  if not len(order):
    raise ConstraintError(f"no token sequence of this vocabulary satisfies the constraint (regex {regex!r:.80})")
  renum = np.full(len(accepting), -1, np.int64)
  renum[order] = np.arange(len(order))
  keep = (renum[src] >= 0) & (renum[dst] >= 0)
  src, tok, dst = renum[src[keep]], tok[keep], renum[dst[keep]]
  if not len(src):
    raise ConstraintError(f"the constraint admits only the empty output (regex {regex!r:.80})")
  accepting = accepting[order]
  acc = np.flatnonzero(accepting)                    # EOS: a self-loop on every accepting state
  src = np.concatenate([src, np.repeat(acc, len(eos))])
  tok = np.concatenate([tok, np.tile(np.asarray(eos, np.int64), len(acc))])
  dst = np.concatenate([dst, np.repeat(acc, len(eos))])
  group = group.copy()
  group[list(eos)] = 1
  weight = group[tok]
  num_states = len(order)
  for seed in range(4):
    cls = _classes(src, tok, dst, rep, num_states, seed)
    table = _table(src, tok, dst, weight, cls, num_states)
    if table is not None:
      break
  else:  # pragma: no cover - four independent 64-bit hash collisions
    raise RuntimeError("token classes: hash collisions on four seeds")
  count = np.bincount(src, weights=weight, minlength=num_states).astype(np.int64)
  forced = np.full(num_states, -1, np.int32)
  one = count[src] == 1
  forced[src[one]] = tok[one]
  forced[accepting] = -1
  done = accepting & (count == len(eos))
  return TokenAutomaton(key=key, token_class=cls, next_state=table, accepting=accepting, forced=forced,
                        done=done, class_size=np.bincount(cls).astype(np.int32))


_CACHE: "collections.OrderedDict[tuple, TokenAutomaton]" = collections.OrderedDict()
_LOCK = threading.Lock()
CACHE_SIZE = 256


def compile_constraint(constraint: Constraint, vocabulary: TokenVocabulary) -> TokenAutomaton:
  """`constraint`'s automaton over `vocabulary`, compiled once per (kind, spec, vocabulary) in this process
  (the most recent CACHE_SIZE kept)."""
  key = (constraint.kind, constraint.spec, vocabulary.fingerprint)
  with _LOCK:
    if key in _CACHE:
      _CACHE.move_to_end(key)
      return _CACHE[key]
  automaton = compile_regex(constraint.to_regex(), vocabulary, key)
  with _LOCK:
    _CACHE[key] = automaton
    while len(_CACHE) > CACHE_SIZE:
      _CACHE.popitem(last=False)
  return automaton


def clear_cache() -> None:
  """Forget every compiled automaton (tests, memory)."""
  with _LOCK:
    _CACHE.clear()
