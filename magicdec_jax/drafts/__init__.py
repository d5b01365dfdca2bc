"""Drafts: what proposes the candidates a round verifies. One interface (base.py), one module per draft.

  StreamingDraft     the target itself over a sink + window cache (MagicDec's self-speculation)
  SnapKVDraft        the target over the prompt positions its last queries attend to most + a window
  ModelDraft         a smaller model of the same vocabulary over its own sink + window cache
  FeatureDraft       an EAGLE-style feature head reading the target's hidden states
  PromptLookupDraft  no model: the continuation of the latest earlier occurrence of the row's last n-gram

A new draft: a module here with a subclass of `base.Draft`, and a line in REGISTRY (the name `--draft`
takes on the command line).
"""
from magicdec_jax.drafts.base import Draft, DraftSpec, Footprint, Prefill, Round
from magicdec_jax.drafts.feature import FeatureDraft, FeatureRing, FeatureSpec
from magicdec_jax.drafts.lookup import PromptLookupDraft
from magicdec_jax.drafts.model import ModelDraft, ModelSpec, truncate_layers
from magicdec_jax.drafts.snapkv import SnapKVDraft
from magicdec_jax.drafts.streaming import DEFAULT_SINK, DEFAULT_WINDOW, StreamingDraft
from magicdec_jax.drafts.weights import DRAFT_WEIGHTS

REGISTRY = {cls.name: cls for cls in (StreamingDraft, SnapKVDraft, ModelDraft, FeatureDraft, PromptLookupDraft)}
