"""Where `--draft=<name>` meets a draft: how each draft's flags build it, price it and are checked.

drafts/ knows nothing of flags; this registry, keyed by the drafts' own names (`drafts.REGISTRY`, the one
list of `--draft` choices), holds per draft: a builder from the flags, a cost descriptor from the flags
and the target's shape alone (`--mode=plan` loads no weights), its words in a plan header, and the
cross-flag checks only it needs. `cli/flags.py` and the mode modules ask `entry(fv)` and the helpers
below; none of them compares --draft with a draft's name. A new draft: one `DraftFlags` line here (and any
flag of its own in cli/flags.py).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from absl import app

from magicdec_jax import drafts, feature_head
from magicdec_jax.config import ModelConfig
from magicdec_jax.tuning.draft_cost import DraftCost


def _refuse_draft_model(fv, head: bool) -> None:
  if fv.draft_model or fv.draft_layers:
    raise app.UsageError(f"--draft_model/--draft_layers only apply to --draft=model (got --draft={fv.draft})")


def _no_checks(fv) -> None:
  pass


@dataclasses.dataclass(frozen=True)
class DraftFlags:
  """One --draft name's command line.

  build(fv, target, load_model) -> the Draft (load_model: a --model / --draft_model value -> Model);
  cost(fv, cfg) -> its DraftCost from the target's config alone (None: build(fv, None, ...).spec.cost());
  describe(fv, cost) -> the plan header's words (None: the cost's label, sink and window);
  check(fv): the cross-flag checks every mode runs; check_draft(fv, head): those of a mode that uses the
  draft (head=False: a feature head's directory is not needed yet); profiles_acceptance: a network over a
  sink + window cache, which --mode=profile_acceptance replays; trains_head: --mode=distill trains a
  feature head for it (else a model draft)."""
  build: Callable[[Any, Any, Callable[[str], Any]], drafts.Draft]
  cost: Callable[[Any, ModelConfig], DraftCost] | None = None
  describe: Callable[[Any, DraftCost], str] | None = None
  check: Callable[[Any], None] = _no_checks
  check_draft: Callable[[Any, bool], None] = _refuse_draft_model
  profiles_acceptance: bool = False
  trains_head: bool = False
  reads: tuple[str, ...] = ("sink", "window")      # the SHAPE_FLAGS it is built from (the others are refused)


# flags that shape a draft: each --draft reads some (DraftFlags.reads); one given to a draft that does not
# read it would be ignored, so it is refused
SHAPE_FLAGS = ("sink", "window", "budget", "lookup_ngram")


def _snapkv_window(fv) -> int:
  """--window for --draft=snapkv: SnapKVDraft's own default where not given (--window's 256 is the streaming
  drafts')."""
  return fv.window if fv["window"].present else drafts.SnapKVDraft.window


def _weights(fv) -> str | None:
  """--draft_weights as a draft's `weights` argument ("none" -> None)."""
  return None if fv.draft_weights == "none" else fv.draft_weights


# ---- model: a smaller model of the target's vocabulary ----------------------------------------------------

def _build_model(fv, target, load_model) -> drafts.ModelDraft:
  """--draft_model (default: the target itself), cut to its first --draft_layers layers if given."""
  dm = load_model(fv.draft_model) if fv.draft_model else target
  if fv.draft_layers:
    if fv.draft_layers > dm.config.num_layers:
      raise ValueError(f"--draft_layers={fv.draft_layers}: the draft model has only "
                       f"{dm.config.num_layers} layers (allowed: 1..{dm.config.num_layers})")
    dm = drafts.truncate_layers(dm, fv.draft_layers)
  return drafts.ModelDraft(dm, sink=fv.sink, window=fv.window, weights=_weights(fv))


def _model_cost(fv, cfg: ModelConfig) -> DraftCost:
  """The target's shape cut to --draft_layers layers."""
  if not fv.draft_layers:
    raise app.UsageError(f"--mode={fv.mode} with --draft={fv.draft} needs --draft_layers (the draft's depth)")
  return drafts.ModelSpec(cfg.replace(num_layers=fv.draft_layers), fv.sink, fv.window).cost()


def _check_model(fv) -> None:
  if not (fv.draft_model or fv.draft_layers):
    raise app.UsageError(f"--draft={fv.draft} needs --draft_model and/or --draft_layers")


# ---- feature: a trained feature head --------------------------------------------------------------------------

def _feature_cost(fv, cfg: ModelConfig) -> DraftCost:
  """A head of the default shape on the target's layers (its whole vocabulary, or --draft_vocab), reading
  the --draft_weights copy."""
  head = feature_head.head_config(cfg)
  head = head.replace(vocab_size=fv.draft_vocab) if fv.draft_vocab else head
  return drafts.FeatureSpec(head, feature_head.default_layers(cfg.num_layers), fv.sink, fv.window,
                            weights=_weights(fv)).cost()


def _check_feature(fv, head: bool) -> None:
  if fv.draft_layers or (head and not fv.draft_model):
    raise app.UsageError(f"--draft={fv.draft} needs --draft_model=DIR (a trained head) and no --draft_layers")
  if fv.draft_model and not os.path.isfile(os.path.join(fv.draft_model, feature_head.HEAD_FILE)):
    raise app.UsageError(f"--draft_model={fv.draft_model}: no {feature_head.HEAD_FILE} there (not a "
                         "finished feature head)")


# ---- lookup: prompt lookup, no network ------------------------------------------------------------------------

def _check_lookup(fv) -> None:
  if fv.tree:
    raise app.UsageError(f"--draft={fv.draft} proposes a chain (--gamma), not --tree={fv.tree}")


REGISTRY: dict[str, DraftFlags] = {
    drafts.StreamingDraft.name: DraftFlags(
        build=lambda fv, target, load: drafts.StreamingDraft(fv.sink, fv.window, weights=_weights(fv)),
        profiles_acceptance=True),
    drafts.SnapKVDraft.name: DraftFlags(
        build=lambda fv, target, load: drafts.SnapKVDraft(budget=fv.budget, window=_snapkv_window(fv),
                                                          weights=_weights(fv)),
        describe=lambda fv, c: f"{c.label} (window {_snapkv_window(fv)}, budget {fv.budget})",
        reads=("budget", "window")),
    drafts.ModelDraft.name: DraftFlags(
        build=_build_model, cost=_model_cost, check=_check_model, check_draft=lambda fv, head: None,
        profiles_acceptance=True),
    drafts.FeatureDraft.name: DraftFlags(
        build=lambda fv, target, load: drafts.FeatureDraft(feature_head.load_head(fv.draft_model), sink=fv.sink,
                                                           window=fv.window, weights=_weights(fv)),
        cost=_feature_cost, check_draft=_check_feature, trains_head=True),
    drafts.PromptLookupDraft.name: DraftFlags(
        build=lambda fv, target, load: drafts.PromptLookupDraft(max_ngram=fv.lookup_ngram),
        describe=lambda fv, c: f"{c.label} (n-grams up to {fv.lookup_ngram}, no network)", check=_check_lookup,
        reads=("lookup_ngram",)),
}


# ---- what cli/ asks -----------------------------------------------------------------------------------------

def entry(fv) -> DraftFlags | None:
  """The registry's entry for --draft (None for --draft=none)."""
  return REGISTRY.get(fv.draft)


def names(pick: Callable[[DraftFlags], bool]) -> list[str]:
  """The --draft names whose entry `pick` accepts, in registry order (for messages)."""
  return [n for n, e in REGISTRY.items() if pick(e)]


def check(fv) -> None:
  """The draft's cross-flag checks every mode runs (app.UsageError naming the flag)."""
  e = entry(fv)
  stray = [n for n in SHAPE_FLAGS if fv[n].present and n not in (() if e is None else e.reads)]
  if stray:
    takes = "|".join(n for n, d in REGISTRY.items() if stray[0] in d.reads)
    raise app.UsageError(f"--{stray[0]} is for --draft={takes} (got --draft={fv.draft})")
  if e is not None:
    e.check(fv)


def check_draft(fv, head: bool = True) -> None:
  """The draft flags of a mode that uses the draft they describe: --draft_model / --draft_layers only where
  the draft takes them (--draft=none takes none)."""
  (_refuse_draft_model if entry(fv) is None else entry(fv).check_draft)(fv, head)


def build(fv, target, load_model: Callable[[str], Any]) -> drafts.Draft | None:
  """The draft the flags describe (None for --draft=none); ValueError where a value does not fit `target`."""
  e = entry(fv)
  return None if e is None else e.build(fv, target, load_model)


def cost(fv, cfg: ModelConfig) -> DraftCost:
  """The cost descriptor of the draft the flags describe, from the target's config alone."""
  e = entry(fv)
  if e.cost is not None:
    return e.cost(fv, cfg)
  return e.build(fv, None, lambda name: None).spec.cost()


def describe(fv, c: DraftCost) -> str:
  """The plan header's words for the draft the flags describe, priced as `c`."""
  e = entry(fv)
  return e.describe(fv, c) if e.describe is not None else f"{c.label} (sink {fv.sink}, window {fv.window})"


def trains_head(fv) -> bool:
  """Whether --mode=distill trains a feature head for --draft (else a model draft)."""
  e = entry(fv)
  return e is not None and e.trains_head
