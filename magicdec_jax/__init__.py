"""magicdec_jax: lossless speculative decoding (MagicDec) for long-context, large-batch generation in JAX."""
from magicdec_jax.config import ModelConfig, RopeScaling
from magicdec_jax.model import Model, forward, full_forward, init_params
from magicdec_jax.trees import Tree
from magicdec_jax.sampling import Sampling
from magicdec_jax.drafts import (FeatureDraft, ModelDraft, PromptLookupDraft, SnapKVDraft, StreamingDraft,
                                 truncate_layers)
from magicdec_jax.feature_head import FeatureHead, init_head, load_head
from magicdec_jax.settings import DEFAULT_GAMMA, DecodeSettings
from magicdec_jax.plan import DecodePlan, make_plan
from magicdec_jax.engine import Engine, GenerateResult
from magicdec_jax.generation import generate, logits, prompt_logprobs
from magicdec_jax.checkpoints import load_model
from magicdec_jax.request import Request, StreamResult
from magicdec_jax.stream import Generator, generate_stream
from magicdec_jax import trees
