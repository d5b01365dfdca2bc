"""Structured output: a constraint (JSON schema, regex, choices, OpenAI response_format) compiled on the
host to a finite automaton over tokens, stacked per batch into one table that the compiled loop indexes.

  spec.py        Constraint: what a request asks for, checked, in canonical form
  schema.py      JSON Schema -> regex, every keyword honoured or refused by name
  vocabulary.py  a tokenizer's tokens as the bytes decoding emits
  index.py       outlines-core's Index made exact (a sentinel) and fast (a leading NUL, byte classes)
  automaton.py   TokenAutomaton (token classes, transitions, accepting / forced / done) and its cache
  table.py       AutomatonTable: a batch's automata in one bucketed, padded structure
  ops.py         the jnp side: allowed, advance, chain / tree states, forced, accepting, done
"""
from magicdec_jax.constraints.errors import ConstraintError
from magicdec_jax.constraints.spec import Constraint, make_constraint
from magicdec_jax.constraints.schema import FORMAT_PATTERNS, SUPPORTED, UNSUPPORTED, normalize_schema
from magicdec_jax.constraints.vocabulary import TokenVocabulary, build_vocabulary, token_vocabulary
from magicdec_jax.constraints.automaton import TokenAutomaton, compile_constraint, compile_regex
from magicdec_jax.constraints.table import AutomatonTable, FREE, batch_table, build_table, table_shape
from magicdec_jax.constraints import ops
