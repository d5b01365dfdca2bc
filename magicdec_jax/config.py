"""Model configuration: one frozen dataclass describing a decoder of any supported family.

Frozen and hashable so it can be a static argument of `jax.jit`. The families (LLaMA, Mistral, Qwen2/2.5,
Qwen3, Gemma 2, Gemma 3) are not separate models but features of this one config that the one `forward`
reads: biases, q/k norms, Gemma's norms and GeGLU, soft-capping, and per-layer sliding windows and RoPE.
`families.py` builds it from an HF `config.json` or GGUF metadata (and refuses what it cannot honour).
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers

import jax.numpy as jnp

from magicdec_jax.backend import FixedShapes, fixed_shapes

ACTIVATIONS = ("silu", "gelu_tanh")
ROPE_KINDS = ("llama3", "linear")  # RopeScaling.kind (layers/rope.py)
NUMERICS = ("fast", "invariant")   # ModelConfig.numerics (layers/invariant.py)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling: 'llama3' (smooth wavelength blend) or 'linear' (positions / factor)."""
  kind: str = "llama3"
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.kind not in ROPE_KINDS:
      raise ValueError(f"RopeScaling.kind must be one of {ROPE_KINDS}, got {self.kind!r}")
    fields = ("factor",) + (("low_freq_factor", "high_freq_factor") if self.kind == "llama3" else ())
    for name in fields:
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"RopeScaling.{name} must be a finite number > 0, got {v!r}")
    if self.kind == "llama3":
      if self.high_freq_factor <= self.low_freq_factor:       # (the blend divides by their difference)
        raise ValueError(f"RopeScaling.high_freq_factor={self.high_freq_factor} must exceed "
                         f"low_freq_factor={self.low_freq_factor}")
      n = self.original_max_position_embeddings
      if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"RopeScaling.original_max_position_embeddings must be an integer >= 1, got {n!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder. Names follow HF where one exists; the defaults of the family features are LLaMA's."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  dtype: str = "float32"  # params and caches: "float32" or "bfloat16"
  numerics: str = "fast"  # "invariant": the target computed at fixed shapes (layers/invariant.py); set by the engine
  fixed: FixedShapes | None = None  # those shapes (invariant only; None: the backend's, backend.fixed_shapes)
  # ---- family features (docs/families.md) ----
  qkv_bias: bool = False                # biases on the q, k, v projections (Qwen2; attention_bias)
  o_bias: bool = False                  # a bias on the o projection (attention_bias of LLaMA, Qwen3, Gemma)
  qk_norm: bool = False                 # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
  norm_plus_one: bool = False           # RMSNorm scales by (1 + w), in float32 (Gemma)
  post_norms: bool = False              # a norm after attention and after the MLP too (Gemma 2 / 3)
  activation: str = "silu"              # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
  embed_scale: bool = False             # embeddings x sqrt(hidden_size), rounded to the activation dtype (Gemma)
  query_pre_attn_scalar: float | None = None  # logits x this ** -0.5 (Gemma); None: head_dim ** -0.5
  attn_softcap: float | None = None     # attention logits -> cap * tanh(logits / cap) (Gemma 2)
  final_softcap: float | None = None    # the same on the final logits (Gemma 2)
  layer_windows: tuple[int, ...] = ()   # per layer: its sliding window (0: global); (): all global
  local_rope_theta: float | None = None           # RoPE base of the windowed layers (Gemma 3); None: rope_theta
  local_rope_scaling: RopeScaling | None = None   # their scaling when local_rope_theta is set

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position_embeddings"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"ModelConfig.{name} must be an integer >= 1, got {v!r}")
    for name in ("rope_theta", "local_rope_theta", "rms_norm_eps"):
      v, positive = getattr(self, name), name != "rms_norm_eps"
      if v is None and name == "local_rope_theta":
        continue
      if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0 or \
          positive and v == 0:
        raise ValueError(f"ModelConfig.{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.numerics not in NUMERICS:
      raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
    if self.numerics == "invariant" and self.fixed is None:
      object.__setattr__(self, "fixed", fixed_shapes())
    elif self.numerics != "invariant":
      object.__setattr__(self, "fixed", None)
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
    if self.layer_windows and len(self.layer_windows) != self.num_layers:
      raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")
    if any(int(w) < 0 for w in self.layer_windows):
      raise ValueError(f"layer_windows must be >= 0 (0: a global layer), got {self.layer_windows}")
    for name in ("query_pre_attn_scalar", "attn_softcap", "final_softcap"):
      if getattr(self, name) is not None and not getattr(self, name) > 0:
        raise ValueError(f"ModelConfig.{name} must be > 0 or None, got {getattr(self, name)}")

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def group_size(self) -> int:
    return self.num_heads // self.num_kv_heads

  @property
  def attn_scale(self) -> float:
    """What q.k is multiplied by before the softmax."""
    return float((self.head_dim if self.query_pre_attn_scalar is None else self.query_pre_attn_scalar) ** -0.5)

  @property
  def invariant(self) -> bool:
    """Whether this model computes with fixed-shape numerics (bitwise the same logits for a row and
    position whatever is computed with it)."""
    return self.numerics == "invariant"

  def layer_window(self, layer: int) -> int | None:
    """Layer `layer`'s sliding window w (a query at p sees keys at positions in (p - w, p]); None: global."""
    w = self.layer_windows[layer] if self.layer_windows else 0
    return int(w) or None

  def layer_kind(self, layer: int) -> int:
    """The first layer that computes as layer `layer` does (the same window, so the same RoPE): layers of
    one kind share one trace (model.forward)."""
    w = self.layer_window(layer)
    return next(i for i in range(layer + 1) if self.layer_window(i) == w)

  def layer_rope(self, layer: int) -> tuple[float, RopeScaling | None]:
    """(RoPE base, scaling) of layer `layer`: the local ones on a windowed layer when the config has them."""
    if self.local_rope_theta is not None and self.layer_window(layer) is not None:
      return self.local_rope_theta, self.local_rope_scaling
    return self.rope_theta, self.rope_scaling

  def replace(self, **kw) -> "ModelConfig":
    """dataclasses.replace; a smaller num_layers keeps the first layers' windows (a truncated draft)."""
    n = kw.get("num_layers")
    if n is not None and "layer_windows" not in kw and self.layer_windows and n <= len(self.layer_windows):
      kw["layer_windows"] = self.layer_windows[:n]
    return dataclasses.replace(self, **kw)

  def to_json(self) -> str:
    d = dataclasses.asdict(self)
    return json.dumps(d, indent=1)

  @classmethod
  def from_json(cls, text: str) -> "ModelConfig":
    d = json.loads(text)
    for key in ("rope_scaling", "local_rope_scaling"):
      if d.get(key):
        d[key] = RopeScaling(**d[key])
    for key in ("eos_token_ids", "layer_windows"):
      d[key] = tuple(d.get(key) or ())
    if isinstance(d.get("fixed"), dict):                   # (JSON's lists back to the tuples it was saved from)
      tuples = lambda x: tuple(map(tuples, x)) if isinstance(x, list) else x
      d["fixed"] = FixedShapes(**{k: tuples(v) for k, v in d["fixed"].items()})
    return cls(**d)


# ---- every weight declared once ------------------------------------------------------------------------
# A weight's shape is a tuple of logical axes; an axis names a size of the config (AXIS_SIZES) and is what
# the partition rules split (sharding/rules.py: heads, kv_heads, mlp, vocab, table). `contracted` is how
# many leading axes its matmul contracts (-1: the last), what a quantized copy stores it by
# (layers/quant.py); None: not a matrix. `under`: the key the weight sits under in the params tree ("attn",
# "mlp"; "top": the tree's root; None: anywhere), so a feature head's own "embed" is not the model's.
# The Flax modules (model.py) create the same names; expected_shapes and checkpoints check them against this.

AXIS_SIZES = {
    "embed": lambda c: c.hidden_size,                  # the residual stream
    "table": lambda c: c.hidden_size,                  # the embedding table's / LM head's hidden axis
    "heads": lambda c: c.num_heads,
    "kv_heads": lambda c: c.num_kv_heads,
    "head_dim": lambda c: c.head_dim,
    "q_flat": lambda c: c.num_heads * c.head_dim,      # q's bias, as HF lays it out
    "kv_flat": lambda c: c.num_kv_heads * c.head_dim,  # k / v's biases
    "mlp": lambda c: c.intermediate_size,
    "vocab": lambda c: c.vocab_size,
}


@dataclasses.dataclass(frozen=True)
class Weight:
  """One parameter: its logical axes, the leading axes its matmul contracts (None: not a matrix) and the
  params-tree key it sits under."""
  axes: tuple[str, ...]
  contracted: int | None = None
  under: str | None = None

  def shape(self, cfg: ModelConfig) -> tuple[int, ...]:
    return tuple(AXIS_SIZES[a](cfg) for a in self.axes)


NORM = Weight(("embed",))   # an RMSNorm's "scale" over the residual stream
WEIGHTS = {
    "embed": Weight(("vocab", "table"), contracted=-1, under="top"),     # tied: also the LM head
    "lm_head": Weight(("table", "vocab"), contracted=1, under="top"),
    "q": Weight(("embed", "heads", "head_dim"), contracted=1, under="attn"),
    "k": Weight(("embed", "kv_heads", "head_dim"), contracted=1, under="attn"),
    "v": Weight(("embed", "kv_heads", "head_dim"), contracted=1, under="attn"),
    "o": Weight(("heads", "head_dim", "embed"), contracted=2, under="attn"),
    "q_bias": Weight(("q_flat",), under="attn"),
    "k_bias": Weight(("kv_flat",), under="attn"),
    "v_bias": Weight(("kv_flat",), under="attn"),
    "o_bias": Weight(("embed",), under="attn"),
    "q_norm": Weight(("head_dim",), under="attn"),       # its "scale"
    "k_norm": Weight(("head_dim",), under="attn"),
    "gate": Weight(("embed", "mlp"), contracted=1, under="mlp"),
    "up": Weight(("embed", "mlp"), contracted=1, under="mlp"),
    "down": Weight(("mlp", "embed"), contracted=1, under="mlp"),
    "attn_norm": NORM, "mlp_norm": NORM, "post_attn_norm": NORM, "post_mlp_norm": NORM, "final_norm": NORM,
}


def weight_at(keys) -> Weight | None:
  """The declaration of the params-tree leaf at `keys` (its path's keys, e.g. ["layers", "0", "attn", "q"];
  a norm's "scale" by its module's name), or None for a leaf not declared here."""
  keys = [str(k) for k in keys]
  for i in range(len(keys) - 1, -1, -1):
    w = WEIGHTS.get(keys[i])
    if w is None:
      continue
    if i != len(keys) - 1 and keys[i + 1:] != ["scale"]:
      return None
    if w.under == "top" and i != 0 or w.under not in (None, "top") and w.under not in keys[:i]:
      return None
    return w
  return None


def expected_shapes(cfg: ModelConfig) -> dict:
  """The param pytree's leaf shapes (tuples of ints) for `cfg`: `layers` is a tuple of per-layer trees;
  which leaves exist follows the config's features, their shapes WEIGHTS."""
  shape = lambda name: WEIGHTS[name].shape(cfg)
  norm = lambda name: {"scale": shape(name)}
  attn = {n: shape(n) for n in ("q", "k", "v", "o")}
  if cfg.qkv_bias:
    attn.update({n: shape(n) for n in ("q_bias", "k_bias", "v_bias")})
  if cfg.o_bias:
    attn["o_bias"] = shape("o_bias")
  if cfg.qk_norm:
    attn.update(q_norm=norm("q_norm"), k_norm=norm("k_norm"))
  layer = {"attn_norm": norm("attn_norm"), "attn": attn, "mlp_norm": norm("mlp_norm"),
           "mlp": {n: shape(n) for n in ("gate", "up", "down")}}
  if cfg.post_norms:
    layer.update(post_attn_norm=norm("post_attn_norm"), post_mlp_norm=norm("post_mlp_norm"))
  shapes = {"embed": shape("embed"), "layers": tuple(layer for _ in range(cfg.num_layers)),
            "final_norm": norm("final_norm")}
  if not cfg.tie_embeddings:
    shapes["lm_head"] = shape("lm_head")
  return shapes


def is_shape(x) -> bool:
  """A leaf of `expected_shapes`: a tuple of ints (not the tuple of layers)."""
  return isinstance(x, tuple) and all(isinstance(i, int) for i in x)
