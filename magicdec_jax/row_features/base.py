"""The interface of a row feature: per-request behaviour compiled into the decode loop, its settings data per row.

In the spirit of vLLM's logits processors, but inside the one compiled `while_loop`: a feature is a static,
hashable object (a jit static argument through the state's structure) and its per-row state is a pytree in
`loop.Rows.features[name]` whose every leaf leads with the batch axis, so inserting a request, shrinking
a batch and harvesting results are tree maps that never name a feature's fields. A feature owns:

  (a) its per-row state: `fill` builds it on the host for n requests from their `options.RequestOptions`
      ([n, ...] arrays; data that is batch-wide in spirit, e.g. a table of automata stacked per batch,
      is kept one entry per slot, so the table of row b is at index b);
  (b) when it is compiled in (`enabled`, from the run's settings; `wanted` says whether a request needs
      it, so a list of requests turns it on by itself) and which option fields it serves (`fields`: a
      field no registered feature serves is refused by name); `check` refuses a request's options that
      need the run to judge (a schema the tokenizer cannot express), before anything compiles; `shape`
      is the bucket its state needs for some requests (kept in `Run.shapes`: a state is built for one);
  (c) what it does to a round's logits (`logits`): the target's verify pass [B, N, V] over the tree's N
      nodes and the draft's logits [B, E, V] of the E nodes a tree level expands, each with `Nodes` (the
      node tokens and which nodes, so a feature can follow its state along each node's path). The target
      and the draft go through the same transform, and acceptance reads the transformed target, so
      verification stays exact for the distribution the features define (a draft that proposes without
      logits, prompt lookup, is not transformed: what the target's transform rules out is rejected);
  (d) how its state moves once the round's emitted tokens are known (`advance`), and whether it ends a
      row there (`end`: e.g. a constraint reaching an accepting state with no continuation), and the
      finish reason a finished row's state gives (`finish_reason`, read on the host).

A feature that is off is absent from the state: the loop compiles as without it. A new feature is one
module here and one line in `row_features.REGISTRY` (its place there is its place in the transform order).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Sequence

import jax

from magicdec_jax.options import RequestOptions
from magicdec_jax.sampling import Sampling, Scores
from magicdec_jax.trees import Tree


@dataclasses.dataclass(frozen=True)
class Nodes:
  """Where logits sit in a round's tree. The root (node 0) is the row's pending token L-1, already in
  the row's state (a feature's state covers every token up to L-1); node u's state is the root's advanced
  by the tokens of the nodes on its path below the root (tree.parents). Logits at node u are those of the
  token after u (its children's)."""
  tree: Tree
  tokens: jax.Array      # [B, N] int32 node tokens (while drafting: set for the levels drawn so far)
  index: jax.Array       # [E] int32 the nodes these logits belong to (the verify pass: 0 .. N-1)


@dataclasses.dataclass(frozen=True)
class Run:
  """What a feature's host side knows of the run when it fills rows."""
  sampling: Sampling      # the run's own sampling (per_row off): a request's defaults
  vocab_size: int
  tokenizer: Any = None
  eos: tuple[int, ...] = ()                  # the run's stop ids
  shapes: Mapping[str, Any] = dataclasses.field(default_factory=dict)   # feature name -> its state's bucket


class RowFeature:
  """A per-request feature of the compiled loop (see the module docstring). Subclasses are frozen,
  hashable dataclasses without fields, or with static settings only: the compiled loop knows a feature by
  its registry name and its state's shapes, so one name is one instance for the life of a process."""

  name: ClassVar[str] = "feature"           # the registry name (and DecodeSettings.row_features entry)
  fields: ClassVar[tuple[str, ...]] = ()    # the RequestOptions fields it serves
  switch: ClassVar[str] = ""                # how a user turns it on (an error message names it)
  masks: ClassVar[bool] = False             # its transform may rule tokens out (-inf)

  # ---- host -------------------------------------------------------------------------------------------
  def enabled(self, settings) -> bool:
    """Whether `settings` (a DecodeSettings) compile it in."""
    return self.name in settings.row_features

  def enable(self, settings):
    """`settings` with this feature compiled in."""
    return settings.replace(row_features=tuple(settings.row_features) + (self.name,))

  def wanted(self, options: RequestOptions, run: Run) -> bool:
    """Whether a request with `options` needs this feature compiled in."""
    return any(getattr(options, f) is not None for f in self.fields)

  def check(self, options: RequestOptions, run: Run) -> None:
    """OptionError naming the field where the run cannot serve these options (only requests for which
    `wanted` holds are checked)."""

  def shape(self, options: Sequence[RequestOptions], run: Run) -> tuple[int, ...] | None:
    """The bucket (a tuple of sizes, compared entry by entry) this feature's state needs to hold rows
    with these options; None: one shape for every request."""
    return None

  def fill(self, options: Sequence[RequestOptions], run: Run) -> Any:
    """The state of len(options) rows ([n, ...] leaves), one per request (RequestOptions(): the run's
    defaults, what a free or padding slot holds)."""
    raise NotImplementedError

  # ---- the compiled round -------------------------------------------------------------------------------
  def logits(self, state: Any, scores: Scores, nodes: Nodes, sampling: Sampling) -> Scores:
    """The scores at `nodes` [B, E, V] transformed (a mask sets -inf; sampling: the static Sampling)."""
    return scores

  def end(self, state: Any, emitted: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """emitted [B, D+1] tokens of the round, the first count [B] of which stand -> (count [B], at most
    the given, ended [B] bool: rows this feature ends after their count-th token; None: never)."""
    return count, None

  def advance(self, state: Any, emitted: jax.Array, count: jax.Array) -> Any:
    """The state after the first count [B] tokens of emitted [B, D+1] (0 for a row that did not run)."""
    return state

  # ---- host, after the loop --------------------------------------------------------------------------------
  def finish_reason(self, state: Any, row: int) -> str | None:
    """The finish reason of finished row `row` whose output did not end in a stop id, from its state on
    the host (numpy leaves); None: the loop's own ("length")."""
    return None
