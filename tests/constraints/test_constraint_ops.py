"""The jnp side of constraints against outlines-core's own Index walked in plain Python
(`get_allowed_tokens` / `get_next_state` / `is_final_state`), a batch table's buckets, and its shapes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from outlines_core import Index, Vocabulary

from magicdec_jax.constraints import (FREE, Constraint, batch_table, compile_constraint, ops, table_shape,
                                      token_vocabulary)
from magicdec_jax.testing import byte_tokenizer

EOS, V = 256, 264
FOUR_FIELDS = {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                              "tags": {"type": "array", "items": {"type": "string"}},
                              "color": {"enum": ["red", "green", "blue"]}},
               "required": ["name", "age", "tags", "color"]}
FOUR_OTHER = {"type": "object",       # another schema of FOUR_FIELDS' bucket
              "properties": {"title": {"type": "string", "maxLength": 24}, "year": {"type": "integer"},
                             "keys": {"type": "array", "items": {"type": "string"}},
                             "mood": {"enum": ["calm", "wild"]}},
              "required": ["title", "year", "keys", "mood"]}
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"},
                                          "label": {"enum": ["a", "b"]}}, "required": ["x", "y"]}


@pytest.fixture(scope="module")
def vocab():
  return token_vocabulary(byte_tokenizer(), [EOS], V)


class OutlinesWalk:
  """One row walked over outlines-core's Index of the same regex and tokens (EOS: its eos id)."""

  def __init__(self, constraint: Constraint, vocab):
    table = {}
    for i, b in enumerate(vocab.token_bytes):
      if b is not None:
        table.setdefault(b, []).append(i)
    self.index = Index(constraint.to_regex(), Vocabulary(EOS, table))
    self.state = self.index.get_initial_state()

  def allowed(self) -> np.ndarray:
    mask = np.zeros(V, bool)
    if self.state is not None:
      mask[self.index.get_allowed_tokens(self.state)] = True
    return mask

  def step(self, token: int):
    """outlines-core ends the walk at EOS (get_next_state None); the table's contract keeps the state."""
    ok = self.state is not None and token in self.index.get_allowed_tokens(self.state)
    if token != EOS or not ok:
      self.state = self.index.get_next_state(self.state, token) if ok else None


def test_ops_equal_outlines_index_walk(vocab):
  """Rows of three kinds (two schemas, unconstrained) advanced together by the jitted ops along random
  allowed tokens (sometimes a disallowed one: the row is dead from then on) agree at every step with the
  Python walk: allowed set, acceptance, forced token."""
  constraints = [Constraint.json_schema(FOUR_FIELDS), Constraint.json_schema(POINT)]
  automata = [compile_constraint(c, vocab) for c in constraints]
  rows = [automata[0], None, automata[1], automata[0], automata[1]]
  table, auto = batch_table(rows, V)
  assert auto.tolist() == [1, FREE, 2, 1, 2]
  walks = [None if r is None else OutlinesWalk(constraints[automata.index(r)], vocab) for r in rows]
  auto = jnp.asarray(auto)
  state = ops.start_states(auto)
  allowed = jax.jit(ops.allowed)
  advance = jax.jit(ops.advance)
  rng = np.random.default_rng(0)
  for step in range(60):
    mask = np.asarray(allowed(table, auto, state))
    acc = np.asarray(ops.is_accepting(table, auto, state))
    forced = np.asarray(ops.forced(table, auto, state))
    tokens = []
    for b, w in enumerate(walks):
      if w is None:
        assert mask[b].all() and acc[b] and forced[b] == -1
        tokens.append(int(rng.integers(V)))
        continue
      ref = w.allowed()
      assert np.array_equal(mask[b], ref), (step, b)
      final = w.state is not None and w.index.is_final_state(w.state)
      assert acc[b] == final
      only = np.flatnonzero(ref)
      assert forced[b] == (only[0] if len(only) == 1 and not final else -1)
      choices = only[only != EOS] if len(only) > 1 else only
      t = int(rng.choice(choices)) if len(choices) and rng.random() > 0.02 else int(rng.integers(V))
      w.step(t)
      tokens.append(t)
    state = advance(table, auto, state, jnp.asarray(tokens, jnp.int32))
    for b, w in enumerate(walks):
      if w is not None:
        assert (int(state[b]) < 0) == (w.state is None)


def test_tree_and_chain_states_follow_each_path(vocab):
  """tree_states equals advancing along each node's root path; chain_states the chain's; [B, N, V] masks
  equal per-node masks."""
  a = compile_constraint(Constraint.json_schema(POINT), vocab)
  table, auto = batch_table([a, a, None], V)
  auto = jnp.asarray(auto)
  parents = (-1, 0, 0, 1, 1, 2, 3)
  tok = byte_tokenizer()
  rng = np.random.default_rng(1)
  prefix = [tok.encode('{"x'), tok.encode('{"x":1,'), tok.encode("")]
  state = jnp.asarray([int(ops.chain_states(table, auto[:1], jnp.zeros(1, jnp.int32),
                                            jnp.asarray([p.ids], jnp.int32))[0, -1]) if p.ids else 0
                       for p in prefix], jnp.int32)
  tokens = jnp.asarray(rng.choice(np.asarray(tok.encode('":, 0123y}-"').ids), size=(3, len(parents))), jnp.int32)
  states = jax.jit(ops.tree_states, static_argnums=4)(table, auto, state, tokens, parents)
  for i in range(len(parents)):
    path, node = [], i
    while node > 0:
      path.append(node)
      node = parents[node]
    s = state
    for node in reversed(path):
      s = ops.advance(table, auto, s, tokens[:, node])
    assert np.array_equal(np.asarray(states[:, i]), np.asarray(s)), i
  masks = ops.allowed(table, auto, states)
  assert masks.shape == (3, len(parents), V)
  for i in range(len(parents)):
    assert np.array_equal(np.asarray(masks[:, i]), np.asarray(ops.allowed(table, auto, states[:, i])))
  chain = ops.chain_states(table, auto, state, tokens[:, :4])
  s = state
  for k in range(4):
    s = ops.advance(table, auto, s, tokens[:, k])
    assert np.array_equal(np.asarray(chain[:, k + 1]), np.asarray(s))
  with pytest.raises(ValueError, match="parents"):
    ops.tree_states(table, auto, state, tokens, (0, 0, 1, 2, 3, 4, 5))


def test_eos_keeps_an_accepting_state_and_done(vocab):
  a = compile_constraint(Constraint.choices(["yes", "no"]), vocab)
  table, auto = batch_table([a], V)
  auto = jnp.asarray(auto)
  s = ops.chain_states(table, auto, ops.start_states(auto), jnp.asarray([byte_tokenizer().encode("no").ids]))
  end = s[:, -1]
  assert bool(ops.is_accepting(table, auto, end)[0]) and bool(ops.is_done(table, auto, end)[0])
  assert int(ops.advance(table, auto, end, jnp.asarray([EOS]))[0]) == int(end[0])
  assert np.flatnonzero(np.asarray(ops.allowed(table, auto, end)[0])).tolist() == [EOS]
  assert not bool(ops.is_accepting(table, auto, jnp.asarray([-1]))[0])
  assert not np.asarray(ops.allowed(table, auto, jnp.asarray([-1]))).any()


def test_buckets_give_identical_shapes_and_one_compile(vocab):
  """Two different sets of schemas in one bucket: the same array shapes, so the jitted op compiles once;
  min_shape pins a larger bucket."""
  four, other, point = (compile_constraint(Constraint.json_schema(s), vocab)
                        for s in (FOUR_FIELDS, FOUR_OTHER, POINT))
  assert four.num_states != other.num_states or four.num_classes != other.num_classes
  tables = [batch_table(rows, V) for rows in ([four, None, None], [other, other, None], [None, four, point])]
  shapes = [t.shape for t, _ in tables]
  assert shapes[0] == shapes[1], shapes
  assert table_shape([four, point]) == shapes[2]
  for dims in shapes:
    assert all(d & (d - 1) == 0 for d in dims)
  f = jax.jit(lambda t, a, s: ops.allowed(t, a, s))       # a fresh function: its own compile cache
  for t, auto in tables[:2]:
    f(t, jnp.asarray(auto), jnp.zeros(3, jnp.int32)).block_until_ready()
  assert f._cache_size() == 1
  big, _ = batch_table([four], V, min_shape=(8, 4096, 64))
  assert big.shape == (8, 4096, 64)
  with pytest.raises(ValueError, match="vocab_size 300"):
    batch_table([four], 300)
