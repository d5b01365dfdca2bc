"""Model configuration: one frozen dataclass, read from HF `config.json` or GGUF metadata.

Frozen and hashable so it can be a static argument of `jax.jit`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
SUPPORTED_MODEL_TYPES = ("llama", "mistral")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling: 'llama3' (smooth wavelength blend) or 'linear' (positions / factor)."""
  kind: str = "llama3"
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A LLaMA-family decoder. Names follow HF where one exists."""
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

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def group_size(self) -> int:
    return self.num_heads // self.num_kv_heads

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def to_json(self) -> str:
    d = dataclasses.asdict(self)
    return json.dumps(d, indent=1)

  @classmethod
  def from_json(cls, text: str) -> "ModelConfig":
    d = json.loads(text)
    if d.get("rope_scaling"):
      d["rope_scaling"] = RopeScaling(**d["rope_scaling"])
    d["eos_token_ids"] = tuple(d.get("eos_token_ids") or ())
    return cls(**d)


def _rope_scaling_from_hf(d: Mapping[str, Any] | None) -> RopeScaling | None:
  if not d:
    return None
  kind = d.get("rope_type", d.get("type", "default"))
  if kind == "default":
    return None
  if kind == "llama3":
    return RopeScaling(
        kind="llama3", factor=float(d["factor"]),
        low_freq_factor=float(d.get("low_freq_factor", 1.0)),
        high_freq_factor=float(d.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)))
  if kind == "linear":
    return RopeScaling(kind="linear", factor=float(d["factor"]))
  raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, llama3, linear)")


def config_from_hf(d: Mapping[str, Any], dtype: str = "float32") -> ModelConfig:
  """Build a ModelConfig from a parsed HF `config.json`."""
  archs = d.get("architectures") or []
  model_type = d.get("model_type")
  if (archs and not any(a in SUPPORTED_ARCHITECTURES for a in archs)) or (
      model_type is not None and model_type not in SUPPORTED_MODEL_TYPES):
    raise ValueError(f"unsupported architecture {archs or model_type!r}; "
                     f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
  n_heads = int(d["num_attention_heads"])
  hidden = int(d["hidden_size"])
  rope_params = d.get("rope_parameters") or {}
  scaling = d.get("rope_scaling") or (rope_params if rope_params.get("rope_type", "default") != "default" else None)
  theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
  eos = d.get("eos_token_id")
  eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
  return ModelConfig(
      vocab_size=int(d["vocab_size"]), hidden_size=hidden,
      intermediate_size=int(d["intermediate_size"]), num_layers=int(d["num_hidden_layers"]),
      num_heads=n_heads, num_kv_heads=int(d.get("num_key_value_heads") or n_heads),
      head_dim=int(d.get("head_dim") or hidden // n_heads), rope_theta=float(theta),
      rope_scaling=_rope_scaling_from_hf(scaling), rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
      tie_embeddings=bool(d.get("tie_word_embeddings", False)),
      max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
      bos_token_id=d.get("bos_token_id"), eos_token_ids=eos, dtype=dtype)


def load_hf_config(path: str, dtype: str = "float32") -> ModelConfig:
  with open(os.path.join(path, "config.json")) as f:
    return config_from_hf(json.load(f), dtype=dtype)


def _llama3_factors(s: RopeScaling, head_dim: int, theta: float):
  """The per-frequency divisors llama.cpp stores in a `rope_freqs` tensor for llama3 scaling."""
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  wavelen = 2 * np.pi / inv
  orig = s.original_max_position_embeddings
  smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
  out = np.where(wavelen < orig / s.high_freq_factor, 1.0, 1.0 / ((1 - smooth) / s.factor + smooth))
  return np.where(wavelen > orig / s.low_freq_factor, s.factor, out)


def config_from_gguf(reader, dtype: str = "float32") -> ModelConfig:
  """Build a ModelConfig from a `gguf.GGUFReader`'s `llama.*` / `tokenizer.ggml.*` metadata."""
  def get(key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()

  arch = get("general.architecture")
  if arch != "llama":
    raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: llama")

  def need(key):
    v = get(key)
    if v is None:
      raise ValueError(f"GGUF file lacks required metadata {key!r}")
    return v

  hidden = int(need("llama.embedding_length"))
  n_heads = int(need("llama.attention.head_count"))
  head_dim = int(get("llama.attention.key_length", hidden // n_heads))
  rot = get("llama.rope.dimension_count")
  if rot is not None and int(rot) != head_dim:
    raise ValueError(f"partial rotary embeddings (rope.dimension_count={rot}, head_dim={head_dim}) are unsupported")
  theta = float(get("llama.rope.freq_base", 10000.0))
  tensors = {t.name: t for t in reader.tensors}
  tokens = get("tokenizer.ggml.tokens")
  vocab = get("llama.vocab_size") or (len(tokens) if tokens else int(tensors["token_embd.weight"].shape[-1]))
  ctx = int(get("llama.context_length", 4096))

  scaling = None
  kind = get("llama.rope.scaling.type", "none")
  if kind == "linear":
    scaling = RopeScaling(kind="linear", factor=float(need("llama.rope.scaling.factor")))
  elif kind not in ("none", None):
    raise ValueError(f"unsupported GGUF rope scaling type {kind!r} (supported: none, linear, llama3 rope_freqs)")
  if "rope_freqs.weight" in tensors:  # llama3 scaling is stored as per-frequency divisors, not metadata
    freqs = np.asarray(tensors["rope_freqs.weight"].data, np.float64).reshape(-1)
    factor = float(freqs.max())
    for orig in (8192, 4096, 2048, 16384, 32768):
      for lo, hi in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0)):
        cand = RopeScaling("llama3", factor, lo, hi, orig)
        if np.allclose(_llama3_factors(cand, head_dim, theta), freqs, rtol=1e-4):
          scaling = cand
          break
      if scaling is not None:
        break
    if scaling is None:
      raise ValueError("GGUF rope_freqs tensor does not match any llama3 scaling parameters")

  eos = [get("tokenizer.ggml.eos_token_id"), get("tokenizer.ggml.eot_token_id")]
  eos_ids = tuple(dict.fromkeys(int(e) for e in eos if e is not None))
  bos = get("tokenizer.ggml.bos_token_id")
  return ModelConfig(
      vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(need("llama.feed_forward_length")),
      num_layers=int(need("llama.block_count")), num_heads=n_heads,
      num_kv_heads=int(get("llama.attention.head_count_kv", n_heads)), head_dim=head_dim,
      rope_theta=theta, rope_scaling=scaling,
      rms_norm_eps=float(get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
      tie_embeddings="output.weight" not in tensors, max_position_embeddings=ctx,
      bos_token_id=None if bos is None else int(bos), eos_token_ids=eos_ids, dtype=dtype)


def expected_shapes(cfg: ModelConfig) -> dict:
  """The param pytree's leaf shapes (tuples of ints) for `cfg`: `layers` is a tuple of per-layer trees."""
  dm, h, k, d, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                       cfg.intermediate_size, cfg.vocab_size)
  layer = {
      "attn_norm": {"scale": (dm,)},
      "attn": {"q": (dm, h, d), "k": (dm, k, d), "v": (dm, k, d), "o": (h, d, dm)},
      "mlp_norm": {"scale": (dm,)},
      "mlp": {"gate": (dm, f), "up": (dm, f), "down": (f, dm)},
  }
  shapes = {"embed": (v, dm), "layers": tuple(layer for _ in range(cfg.num_layers)),
            "final_norm": {"scale": (dm,)}}
  if not cfg.tie_embeddings:
    shapes["lm_head"] = (dm, v)
  return shapes


def is_shape(x) -> bool:
  """A leaf of `expected_shapes`: a tuple of ints (not the tuple of layers)."""
  return isinstance(x, tuple) and all(isinstance(i, int) for i in x)
