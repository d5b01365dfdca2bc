"""magicdec_jax: lossless speculative decoding (MagicDec) for long-context, large-batch generation in JAX."""
from magicdec_jax.config import ModelConfig, RopeScaling
from magicdec_jax.model import Model, forward, full_forward, init_params
from magicdec_jax.trees import Tree
from magicdec_jax.sampling import Sampling
from magicdec_jax.drafts import ModelDraft, SnapKVDraft, StreamingDraft, truncate_layers
from magicdec_jax.feature_head import FeatureHead, init_head, load_head
from magicdec_jax.feature_draft import FeatureDraft
from magicdec_jax.engine import GenerateResult, generate, logits
from magicdec_jax.checkpoints import load_model
from magicdec_jax.stream import Generator, Request, StreamResult, generate_stream
from magicdec_jax import trees
