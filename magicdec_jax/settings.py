"""Decoding settings, typed and validated once.

`DecodeSettings` is what every way in builds: `generate(model, prompts, max_new_tokens=..., ...)` and
`generate_stream` make one from their keywords, the command line makes one from its flags
(cli/build.decode_settings), and datagen fingerprints the one it runs with (`fingerprint()`), so a
resumed data set is refused if anything that changes the samples differs. Defaults live here and in
drafts/streaming.py (sink, window), nowhere else.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from magicdec_jax import row_features
from magicdec_jax.config import NUMERICS
from magicdec_jax.drafts import Draft, REGISTRY
from magicdec_jax.backend import FixedShapes, default_numerics
from magicdec_jax.options import check_count, check_number, is_int
from magicdec_jax.pallas import IMPLS
from magicdec_jax.sampling import MODES as SAMPLING_MODES, Sampling
from magicdec_jax.schedule import check_forced
from magicdec_jax.trees import Tree

DEFAULT_GAMMA = 3        # chain length when neither gamma nor tree is given
MAX_GAMMA = 64           # the longest chain (a round verifies gamma + 1 tokens in one pass)
OFF_DEFAULTS = ("logprobs", "top_logprobs", "per_row_sampling", "min_p",   # fingerprinted only when set
                "row_features", "fixed_shapes", "simulated_acceptance")     # (older data sets resume unchanged)


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  """How to decode. draft None: plain autoregressive decoding. gamma: chain length, "auto" (the cost
  model's choice for the batch and context) or None (not given: a chain of DEFAULT_GAMMA unless a tree or
  a schedule says what is speculated; a gamma given beside either is refused); tree: a trees.Tree or
  "auto" (a hardware-aware Sequoia tree) instead of a chain. hardware / acceptance / auto_fallback: inputs
  of "auto" (tuning/autotune.py; not of a forced schedule).
  sampling: "rejection" (speculative rejection sampling: the highest acceptance; the samples depend on the
  draft) or "invariant" (drafter-invariant: a token is the argmax of the filtered logits plus noise owned
  by its (seed, stream, position), so the samples are plain decoding's whatever the draft, gamma, tree or
  batch). xla_options: XLA compiler options for this call's executables only. schedule: force adaptive
  speculation's thresholds, [(from_context, gamma), ...] with gamma 0 for plain decoding (schedule.py).
  learn_acceptance: gamma="auto" re-plans a call from the acceptance its chain rounds have had and the
  measured speed of settings the cost model cannot separate (schedule.Learning; not with a forced
  schedule or tree="auto"). numerics: "invariant" (every dot of the target one fixed shape, so a row's
  logits at a position are bitwise the same in a one-token step, a chain's verify pass and a tree's node,
  whatever the batch, slot, refill, draft, gamma or tree: greedy and invariant sampling then give plain
  decoding's tokens exactly, in bfloat16 too) or "fast"
  (the backend's own shapes: equal to rounding; layers/invariant.py); None: the backend's default
  (backend.default_numerics). The value is decided when the settings are made, so `settings.numerics` is
  always one of the two. fixed_shapes: the shapes invariant numerics compute at (None: the backend's,
  backend.fixed_shapes; benchmarks vary them). logprobs: return
  each emitted token's log-probability under the distribution it was drawn from (greedy: the model's
  log_softmax; sampling: the temperature / top-k / top-p filtered distribution), read from the verify pass
  (exact under speculation); top_logprobs: also the k (0..MAX_TOP_LOGPROBS) most likely tokens of that
  distribution per position (needs logprobs). Both are compiled in: off, the loop is today's.
  per_row_sampling: every row samples with its own temperature / top-k / top-p, data in the loop state
  (request.Request's fields; this object's are the defaults), so one executable serves any mix of greedy
  and sampled rows; off, the loop compiles the one setting in. row_features: names of further row
  features to compile in (row_features.REGISTRY; per-row sampling has its own switch, per_row_sampling),
  so a lazy stream can take requests that need them (a list of requests turns them on by itself)."""
  max_new_tokens: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  min_p: float = 0.0                     # drop tokens below min_p x the most likely one's probability (0: off)
  eos_token_id: Any = None               # an id, a list of ids, or None (the model's own)
  draft: Draft | None = None
  gamma: int | str | None = None         # None: DEFAULT_GAMMA for a chain (see `speculation`)
  tree: Tree | str | None = None
  attention_impl: str = "auto"
  hardware: Any = None
  acceptance: Any = None
  auto_fallback: bool = True
  sampling: str = "rejection"
  xla_options: Mapping[str, Any] | None = None
  schedule: Any = None                   # forced adaptive thresholds [(from_context, gamma), ...] (schedule.py)
  learn_acceptance: bool = True          # gamma="auto": re-plan a call from its own acceptance and speed
  numerics: str | None = None            # "invariant" (bitwise plain decoding's logits), "fast"; None: by backend
  fixed_shapes: FixedShapes | None = None  # invariant numerics' shapes; None: the backend's
  logprobs: bool = False                 # return each emitted token's log-probability
  top_logprobs: int = 0                  # and the k most likely alternatives per position (needs logprobs)
  per_row_sampling: bool = False         # each row's temperature / top-k / top-p as data (mixed batches)
  row_features: tuple[str, ...] = ()     # further row features compiled in (row_features.REGISTRY names)
  simulated_acceptance: Any = None       # measurement only: accept rank k with probability v[k] (Sampling)

  def __post_init__(self):
    check_count("max_new_tokens", self.max_new_tokens, 1)
    for name in ("temperature", "top_k", "top_p", "min_p", "seed"):    # types and ranges: options.NUMBER_CHECKS
      check_number(name, getattr(self, name))
    Sampling(float(self.temperature), int(self.top_k), float(self.top_p), min_p=float(self.min_p))   # its checks
    if self.draft is not None and not isinstance(self.draft, Draft):
      raise ValueError(f"draft must be one of {', '.join(c.__name__ for c in REGISTRY.values())} or None, "
                       f"got {self.draft!r:.80}")
    if self.gamma not in (None, "auto") and (not is_int(self.gamma) or not 1 <= self.gamma <= MAX_GAMMA):
      raise ValueError(f"gamma must be an integer in [1, {MAX_GAMMA}] or 'auto', got {self.gamma!r}")
    if self.tree is not None and self.tree != "auto" and not isinstance(self.tree, Tree):
      raise ValueError(f"tree must be a trees.Tree or 'auto', got {self.tree!r}")
    # settings that would have no effect are refused, not ignored
    if self.tree is not None and self.draft is None:
      raise ValueError(f"tree={self.tree!r:.60} needs a draft (plain decoding speculates nothing)")
    if self.gamma is not None and self.draft is None:
      raise ValueError(f"gamma={self.gamma!r} needs a draft (plain decoding speculates nothing)")
    if self.tree is not None and self.gamma not in (None, "auto"):
      raise ValueError(f"gamma={self.gamma} and tree={self.tree!r:.60}: the tree is what is speculated; give one")
    if self.hardware is not None or self.acceptance is not None:
      given = "hardware" if self.hardware is not None else "acceptance"
      if "auto" not in (self.gamma, self.tree):
        raise ValueError(f"{given}= is read by gamma='auto' / tree='auto' only (got gamma={self.gamma!r}, "
                         f"tree={self.tree!r:.40})")
      if self.schedule is not None:
        raise ValueError(f"{given}= prices gamma='auto'; a forced schedule is not priced (give one)")
    if self.attention_impl not in IMPLS:
      raise ValueError(f"attention_impl must be one of {IMPLS}, got {self.attention_impl!r}")
    if self.sampling not in SAMPLING_MODES:
      raise ValueError(f"sampling must be one of {SAMPLING_MODES}, got {self.sampling!r}")
    if not isinstance(self.auto_fallback, bool):
      raise ValueError(f"auto_fallback must be True or False, got {self.auto_fallback!r}")
    if self.numerics is None:
      object.__setattr__(self, "numerics", default_numerics())
    if self.numerics not in NUMERICS:
      raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
    if self.fixed_shapes is not None and (not isinstance(self.fixed_shapes, FixedShapes)
                                          or self.numerics != "invariant"):
      raise ValueError(f"fixed_shapes must be a backend.FixedShapes, with numerics='invariant', got "
                       f"{self.fixed_shapes!r:.80} with numerics={self.numerics!r}")
    if not isinstance(self.learn_acceptance, bool):
      raise ValueError(f"learn_acceptance must be True or False, got {self.learn_acceptance!r}")
    if self.schedule is not None:
      check_forced(self.schedule)
      if self.draft is None or self.tree is not None:
        raise ValueError("schedule needs a draft and a chain (gamma), not a tree")
      if self.gamma not in (None, "auto"):
        raise ValueError(f"gamma={self.gamma} and a schedule: the schedule's pairs say which chains run; give one")
    if not isinstance(self.logprobs, bool):
      raise ValueError(f"logprobs must be True or False, got {self.logprobs!r}")
    check_number("top_logprobs", self.top_logprobs)
    if self.top_logprobs and not self.logprobs:
      raise ValueError(f"top_logprobs={self.top_logprobs} needs logprobs=True")
    if not isinstance(self.per_row_sampling, bool):
      raise ValueError(f"per_row_sampling must be True or False, got {self.per_row_sampling!r}")
    names = self.row_features
    if isinstance(names, str) or not isinstance(names, (list, tuple)) or \
        any(n not in row_features.REGISTRY or n == "sampling" for n in names) or len(set(names)) != len(names):
      raise ValueError(f"row_features must be distinct names of {sorted(set(row_features.REGISTRY) - {'sampling'})} "
                       f"(per-row sampling: per_row_sampling=True), got {names!r}")
    object.__setattr__(self, "row_features", tuple(names))
    if self.simulated_acceptance is not None:
      if isinstance(self.simulated_acceptance, (str, bytes)) or not hasattr(self.simulated_acceptance, "__iter__"):
        raise ValueError(f"simulated_acceptance must be a sequence of probabilities, got "
                         f"{self.simulated_acceptance!r:.80}")
      object.__setattr__(self, "simulated_acceptance", tuple(float(x) for x in self.simulated_acceptance))
      Sampling(simulated_acceptance=self.simulated_acceptance)                 # its checks
      if self.draft is None:
        raise ValueError("simulated_acceptance needs a draft (plain decoding accepts nothing)")
    if self.xla_options is not None and not isinstance(self.xla_options, Mapping):
      raise ValueError(f"xla_options must be a dict of XLA option name -> value, got {self.xla_options!r:.80}")

  @property
  def sampler(self) -> Sampling:
    return Sampling(float(self.temperature), int(self.top_k), float(self.top_p), self.sampling == "invariant",
                    per_row=self.per_row_sampling, min_p=float(self.min_p),
                    simulated_acceptance=self.simulated_acceptance or ())

  @property
  def logprob_width(self) -> int:
    """loop.initial_state's static `logprobs` (the state's log-probability buffers): -1 off, 0 the emitted
    tokens' only, k > 0 also k alternatives per position."""
    return int(self.top_logprobs) if self.logprobs else -1

  @property
  def draft_shapes_samples(self) -> bool:
    """Whether the draft, gamma and tree can change the tokens drawn: under rejection sampling, with fast
    numerics (a verify pass rounds the logits differently from a one-token step, which can flip a
    near-tie), and with a tree (its nodes' slots differ from plain decoding's: layers/invariant.py);
    greedy and invariant sampling of a chain with invariant numerics give plain decoding's tokens exactly."""
    chain = self.tree is None or (isinstance(self.tree, Tree) and self.tree.is_chain)
    greedy = self.temperature == 0 and not self.per_row_sampling
    exact = (greedy or self.sampling == "invariant") and self.numerics == "invariant"
    return not (exact and chain)

  @property
  def speculation(self) -> Tree | str | None:
    """What to speculate: None (no draft), a Tree, "auto" (a tree) or "auto-chain" (a chain of auto gamma)."""
    if self.draft is None:
      return None
    if self.tree is not None:
      return self.tree
    if self.gamma == "auto":
      return "auto-chain"
    return Tree.chain(int(DEFAULT_GAMMA if self.gamma is None else self.gamma))

  def replace(self, **changes) -> "DecodeSettings":
    return dataclasses.replace(self, **changes)

  def fingerprint(self) -> dict[str, Any]:
    """Every setting as JSON-able values: what a resumed data set must match (datagen)."""
    out = {}
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if f.name in OFF_DEFAULTS and v == f.default:
        continue
      if f.name == "gamma" and v is None:      # not given: the chain it stands for (older data sets resume)
        v = DEFAULT_GAMMA
      if isinstance(v, (np.integer, np.floating)):
        v = v.item()
      if isinstance(v, Mapping):
        v = {str(k): v[k] for k in sorted(v)}
      try:
        json.dumps(v)
      except TypeError:
        v = repr(v)
      out[f.name] = v
    return out


def decode_settings(settings: DecodeSettings | None = None, **kwargs) -> DecodeSettings:
  """A DecodeSettings from an existing one and/or keyword arguments (the keywords win)."""
  unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(DecodeSettings)})
  if unknown:
    raise ValueError(f"unknown decoding setting(s) {', '.join(map(repr, unknown))}: not fields of DecodeSettings "
                     "(a request's own stop strings, stop ids and samples are a stream Request's)")
  if settings is None:
    return DecodeSettings(**kwargs)
  if not isinstance(settings, DecodeSettings):
    raise ValueError(f"settings must be a DecodeSettings, got {settings!r:.80}")
  return settings.replace(**kwargs) if kwargs else settings
