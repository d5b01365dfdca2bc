"""The decode loop's state, in a per-row part and a shared part.

`Rows` holds everything a row (a slot) owns that is not a cache: its tokens, budget, PRNG key, counters,
output and log-probability buffers and the row features' states (row_features/). Every leaf leads with
the batch axis, and `fresh_rows` is the one place a row's starting values are written: so `loop.
initial_state` is fresh_rows of the batch, `slots.insert` a tree map putting fresh rows into free slots,
`shrink.take_rows` a tree map gathering rows, and the result harvest (`host_rows`) a tree map copying them
out; none of them lists fields. The caches (`target`, the draft's `ring`) are per-row too (batch-leading
leaves, gathered by shrink), kept apart because a slot takes them by copy from a prefill, not fresh.
`Shared` is batch-wide: stop ids, the round count, the refill threshold, the adaptive schedule.

`LoopState` reads any part's field by its own name (`state.out`, `state.step`) and `replace` routes a
field to its part, so code that only reads or sets a field need not know where it lives.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import schedule as sched_lib
from magicdec_jax.cache import KVCache


@flax.struct.dataclass
class Rows:
  """Per-row state: every leaf [B, ...]."""
  out: jax.Array          # [B, M] int32 generated tokens (M = max new tokens + tree size), -1 unwritten
  n_out: jax.Array        # [B] int32 tokens written to `out`
  lengths: jax.Array      # [B] int32 L: committed tokens (prompt + generated); token L-1 is pending in no cache
  last: jax.Array         # [B] int32 token at position L-1
  prev: jax.Array         # [B] int32 token at position L-2 (model drafts re-encode it)
  done: jax.Array         # [B] bool
  max_new: jax.Array      # [B] int32 the row's token budget
  keys: jax.Array         # [B] PRNG keys; a row's own round r uses fold_in(key, r)
  rounds: jax.Array       # [B] int32 verify steps while active
  accepted: jax.Array     # [B] int32 accepted draft tokens
  drafted: jax.Array      # [B] int32 draft tokens proposed on a path (a round's tree depth; 0 in plain rounds)
  accepted_at: jax.Array  # [B, D] int32 accepted count per tree depth
  out_logprob: jax.Array      # [B, M] float32 log-probability of each `out` token ([B, 0]: logprobs off)
  out_top_ids: jax.Array      # [B, M, K] int32 the K most likely tokens at each position ([B, 0, 0]: K = 0)
  out_top_logprob: jax.Array  # [B, M, K] float32 their log-probabilities
  features: dict          # row feature name -> its state ([B, ...] leaves); only the features compiled in


@flax.struct.dataclass
class Shared:
  """Batch-wide state."""
  eos: jax.Array          # [E] int32 stop token ids (-1 padded)
  step: jax.Array         # [] int32 rounds run
  refill_at: jax.Array    # [] int32 decode returns once this many rows are done (B: when all are)
  sched: sched_lib.Sched  # adaptive speculation: thresholds (data), rounds per variant, switches


PARTS = ("rows", "target", "ring", "shared")
_PART_FIELDS = {"rows": tuple(f.name for f in dataclasses.fields(Rows)),
                "shared": tuple(f.name for f in dataclasses.fields(Shared))}


@dataclasses.dataclass(frozen=True)
class LoopState:
  """The while_loop's carry: per-row `rows`, the target's cache and the draft's ring (per row), `shared`."""
  rows: Rows
  target: KVCache         # the target's cache ([B, ...] leaves)
  ring: Any               # the draft's state (DraftSpec.empty_ring; [B, ...] leaves), None without a draft
  shared: Shared

  def __getattr__(self, name: str):
    """A part's field by its own name (state.out is state.rows.out)."""
    if name.startswith("_") or name in PARTS:
      raise AttributeError(name)
    for part, names in _PART_FIELDS.items():
      if name in names and part in self.__dict__:
        return getattr(self.__dict__[part], name)
    raise AttributeError(f"LoopState has no field {name!r}")

  def replace(self, **changes) -> "LoopState":
    """A copy with fields changed: a part by its name (rows=, target=, ring=, shared=) or a part's field by
    its own (done=, refill_at=, sched=)."""
    top = {k: changes.pop(k) for k in list(changes) if k in PARTS}
    for part, names in _PART_FIELDS.items():
      mine = {k: changes.pop(k) for k in list(changes) if k in names}
      if mine:
        top[part] = top.get(part, getattr(self, part)).replace(**mine)
    if changes:
      raise TypeError(f"LoopState has no field {sorted(changes)[0]!r}")
    return dataclasses.replace(self, **top)

  def per_row(self) -> "LoopState":
    """The state without its shared part (shared None): every leaf leads with the batch axis."""
    return dataclasses.replace(self, shared=None)


jax.tree_util.register_dataclass(LoopState, data_fields=list(PARTS), meta_fields=[])


def fresh_rows(tokens: jax.Array, lengths: jax.Array, max_new: jax.Array, keys: jax.Array, *, out_len: int,
               depth: int, logprobs: int = -1, features: dict | None = None) -> Rows:
  """The rows of n freshly prefilled prompts tokens [n, P] / lengths [n] (a row's pending token is
  tokens[L-1]), with budgets max_new [n], PRNG keys [n] and row feature states `features` ([n, ...]
  each). out_len: the output buffer's length; depth: the deepest tree the rows will verify; logprobs:
  -1 off ([n, 0] placeholders: the loop compiles as without them), 0 the emitted tokens' only, k > 0
  also k alternatives per position."""
  n = tokens.shape[0]
  ar = jnp.arange(n)
  m = out_len if logprobs >= 0 else 0
  k = max(logprobs, 0)
  zeros = lambda: jnp.zeros((n,), jnp.int32)     # one buffer per field: the loop donates each leaf
  return Rows(out=jnp.full((n, out_len), -1, jnp.int32), n_out=zeros(), lengths=lengths,
              last=tokens[ar, lengths - 1], prev=tokens[ar, jnp.maximum(lengths - 2, 0)], done=max_new <= 0,
              max_new=max_new, keys=keys, rounds=zeros(), accepted=zeros(), drafted=zeros(),
              accepted_at=jnp.zeros((n, depth), jnp.int32), out_logprob=jnp.zeros((n, m), jnp.float32),
              out_top_ids=jnp.zeros((n, m if k else 0, k), jnp.int32),
              out_top_logprob=jnp.zeros((n, m if k else 0, k), jnp.float32), features=dict(features or {}))


def logprob_width(rows: Rows) -> int:
  """fresh_rows' `logprobs` of existing rows (their buffers' shapes)."""
  return -1 if rows.out_logprob.shape[1] == 0 else int(rows.out_top_ids.shape[2])


def host_rows(rows: Rows) -> Rows:
  """The rows copied to the host (numpy; PRNG keys as their uint32 key data)."""
  def one(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.asarray(x)
  return jax.tree.map(one, rows)
