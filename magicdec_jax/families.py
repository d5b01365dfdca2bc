"""The supported families, read from an HF `config.json` or GGUF metadata into one `ModelConfig`.

Each family is a set of config features (config.py) that the one `forward` reads; nothing here computes.
A field that would change the computation and is not implemented is refused with a ValueError naming it,
before any weight is read; fields that change nothing at inference (dropout, initializer range, cache
hints) are left alone, as transformers leaves fields its model class does not read. docs/families.md has
the table. HF class defaults are spelled out per family: a `config.json` may omit a field and then means
the class default (Mistral's `sliding_window` defaults to 4096, Gemma 3's local RoPE base to 10000, ...).
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Mapping

import numpy as np

from magicdec_jax.config import ModelConfig, RopeScaling

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Family:
  """One HF `model_type`: the architectures it loads and the HF config class defaults it relies on."""
  name: str
  archs: tuple[str, ...]
  defaults: Mapping[str, Any]


_COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
_GEMMA = dict(_COMMON, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", head_dim=256,
              query_pre_attn_scalar=256, sliding_window=4096, attention_bias=False)
FAMILIES = {  # model_type -> Family; defaults from transformers 5.x's config classes
    "llama": Family("LLaMA", ("LlamaForCausalLM",),
                    dict(_COMMON, attention_bias=False, mlp_bias=False, max_position_embeddings=2048)),
    "mistral": Family("Mistral", ("MistralForCausalLM",),
                      dict(_COMMON, sliding_window=4096, max_position_embeddings=131072)),
    "qwen2": Family("Qwen2 / Qwen2.5", ("Qwen2ForCausalLM",),
                    dict(_COMMON, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                         max_position_embeddings=32768)),
    "qwen3": Family("Qwen3", ("Qwen3ForCausalLM",),
                    dict(_COMMON, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                         head_dim=128, attention_bias=False, max_position_embeddings=32768)),
    "gemma2": Family("Gemma 2", ("Gemma2ForCausalLM",),
                     dict(_GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                          max_position_embeddings=8192)),
    # Gemma 3's published 4B / 12B / 27B configs omit most text fields: these defaults are part of them
    "gemma3_text": Family("Gemma 3 (text)", ("Gemma3ForCausalLM",),
                          dict(_GEMMA, rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                               sliding_window_pattern=6, attn_logit_softcapping=None,
                               final_logit_softcapping=None, vocab_size=262_208, hidden_size=2304,
                               intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                               num_key_value_heads=4, max_position_embeddings=131_072)),
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def _refuse(field: str, value, why: str):
  raise ValueError(f"unsupported config field {field}={value!r}: {why}")


def _malformed(field: str, value, what: str):
  raise ValueError(f"config field {field}={value!r} is malformed: it must be {what}")


def _int(field: str, v, low: int = 1) -> int:
  """A JSON integer >= low (not a bool, not a float: 64.5 is not truncated to 64)."""
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
    _malformed(field, v, f"an integer >= {low}")
  return int(v)


def _positive(field: str, v, zero: bool = False) -> float:
  """A finite number > 0 (>= 0 with `zero`), not a bool or a string."""
  if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v) or \
      v < 0 or v == 0 and not zero:
    _malformed(field, v, f"a finite number {'>= 0' if zero else '> 0'}")
  return float(v)


def _optional_positive(field: str, v) -> float | None:
  return None if v is None else _positive(field, v)


def _check_full_rotary(field: str, v) -> None:
  """A partial_rotary_factor (top level or in a RoPE set) other than 1 (or null: transformers' default)."""
  if v not in (None, 1, 1.0):
    _refuse(field, v, "partial rotary embeddings")


def _flag(field: str, v) -> bool:
  """A JSON boolean (null: false); the string "false" is not true."""
  if v is not None and not isinstance(v, (bool, np.bool_)):
    _malformed(field, v, "true or false")
  return bool(v)


# --------------------------------------------------------------------------------------------- RoPE

def rope_scaling_from_hf(d: Mapping[str, Any] | None, field: str = "rope_scaling",
                         original_max_positions: int | None = None) -> RopeScaling | None:
  """An HF rope_scaling / rope_parameters dict -> RopeScaling (None: default); other types are refused.
  `original_max_positions`: what transformers fills a llama3 set's missing original_max_position_embeddings
  with (the config's own original_max_position_embeddings, else its max_position_embeddings)."""
  if not d:
    return None
  if not isinstance(d, Mapping):
    _malformed(field, d, "a mapping (rope_type / factor / ...)")
  _check_full_rotary(f"{field}.partial_rotary_factor", d.get("partial_rotary_factor"))
  if d.get("mrope_section"):
    _refuse(f"{field}.mrope_section", d["mrope_section"], "multimodal RoPE")
  kind = d.get("rope_type", d.get("type", "default"))
  if kind == "default":
    return None
  factor = _positive(f"{field}.factor", d.get("factor"))
  if kind == "llama3":                 # (transformers needs both freq factors: no defaults for them)
    low, high = (_positive(f"{field}.{k}", d.get(k)) for k in ("low_freq_factor", "high_freq_factor"))
    if high <= low:
      _malformed(f"{field}.high_freq_factor", high, f"greater than low_freq_factor={low}")
    original = d.get("original_max_position_embeddings", original_max_positions)
    return RopeScaling(kind="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                       original_max_position_embeddings=_int(f"{field}.original_max_position_embeddings", original))
  if kind == "linear":
    return RopeScaling(kind="linear", factor=factor)
  _refuse(f"{field}.rope_type", kind, "only default, linear and llama3 RoPE scaling are implemented")


def _rope(d: Mapping[str, Any], get, layer_type: str | None = None,
          legacy_theta: str = "rope_theta") -> tuple[float, RopeScaling | None]:
  """(base, scaling) from `rope_parameters` (transformers 5: flat, or per layer type) or the legacy
  `rope_theta` / `rope_scaling` fields."""
  params = d.get("rope_parameters")
  if params is not None and not isinstance(params, Mapping):
    _malformed("rope_parameters", params, "a mapping")
  nested = isinstance(params, Mapping) and bool({FULL, SLIDING} & params.keys())
  if nested and layer_type is None:
    _refuse("rope_parameters", dict(params), "one set per layer type, where this family's layers all take "
            "one (transformers fails on it too)")
  if isinstance(params, Mapping) and layer_type is not None:
    if params and not nested:
      _refuse("rope_parameters", dict(params), "one set for every layer where the family has one per layer "
              "type (full_attention / sliding_attention); which the local layers take is ambiguous")
    params = params.get(layer_type)
  original = get("original_max_position_embeddings") or get("max_position_embeddings")
  scaling = d.get("rope_scaling") if layer_type in (None, FULL) else None
  if isinstance(params, Mapping):     # (its rope_theta, as transformers fills it in: else the legacy field)
    given = rope_scaling_from_hf(params, "rope_parameters", original)
    if scaling and rope_scaling_from_hf(scaling, original_max_positions=original) != given:
      _refuse("rope_scaling", dict(scaling), "differs from rope_parameters beside it; give one")
    field = "rope_parameters.rope_theta" if "rope_theta" in params else legacy_theta
    return _positive(field, params["rope_theta"] if "rope_theta" in params else get(legacy_theta)), given
  return _positive(legacy_theta, get(legacy_theta)), rope_scaling_from_hf(scaling, original_max_positions=original)


# ----------------------------------------------------------------------------------------------- HF

def _layer_types(d, get, family: str, n: int) -> list[str]:
  """Every layer's type (full / sliding) as HF's config class derives it when `layer_types` is absent."""
  if d.get("layer_types") is not None:
    types = list(d["layer_types"])
    if len(types) != n:
      _refuse("layer_types", types, f"{len(types)} entries for num_hidden_layers={n}")
    return types
  if family in ("qwen2", "qwen3"):
    on = _flag("use_sliding_window", get("use_sliding_window")) and get("sliding_window") is not None
    return [SLIDING if on and i >= _int("max_window_layers", get("max_window_layers"), 0) else FULL
            for i in range(n)]
  if family == "gemma2":
    return [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
  if family == "gemma3_text":
    pattern = _int("sliding_window_pattern", get("sliding_window_pattern"))   # (transformers' own reading)
    if d.get("_sliding_window_pattern", pattern) != pattern:
      _refuse("_sliding_window_pattern", d["_sliding_window_pattern"], f"transformers reads the layers' pattern "
              f"from sliding_window_pattern ({pattern}) or layer_types, not this private field; give layer_types")
    return [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
  return [FULL] * n


def _windows(d, get, family: str, n: int) -> tuple[int, ...]:
  """Per-layer sliding windows (0: global) as HF's attention layers apply them."""
  if family == "llama":
    return ()
  if family == "mistral":
    if d.get("layer_types") is not None:
      _refuse("layer_types", d["layer_types"], "MistralForCausalLM ignores layer_types (an alternating-"
              "attention model is a Ministral one); refusing rather than guessing which was meant")
    w = get("sliding_window")
    return (_int("sliding_window", w),) * n if w else ()
  window = get("sliding_window")
  if family in ("qwen2", "qwen3") and not _flag("use_sliding_window", get("use_sliding_window")):
    window = None                     # what HF's config does: use_sliding_window=false drops the window
  window = None if window is None else _int("sliding_window", window)
  out = []
  for i, t in enumerate(_layer_types(d, get, family, n)):
    if t not in (SLIDING, FULL):
      _refuse(f"layer_types[{i}]", t, "only full_attention and sliding_attention layers are implemented")
    if t == SLIDING and not window:
      _refuse(f"layer_types[{i}]", t, "a sliding layer but no sliding_window (use_sliding_window=false or "
              "sliding_window=null); transformers fails on it too")
    out.append(int(window) if t == SLIDING else 0)
  return tuple(out) if any(out) else ()


def _check_common(d: Mapping[str, Any]) -> None:
  """Fields of any family that would change the computation and are not implemented."""
  if d.get("quantization_config"):
    _refuse("quantization_config", d["quantization_config"].get("quant_method", "?"),
            "quantized checkpoints are not loaded (dequantize them, or use a GGUF file)")
  if d.get("use_bidirectional_attention"):
    _refuse("use_bidirectional_attention", d["use_bidirectional_attention"], "only causal decoders")
  if d.get("is_causal") is False:
    _refuse("is_causal", False, "only causal decoders")
  if d.get("pruned_heads"):
    _refuse("pruned_heads", d["pruned_heads"], "pruned attention heads")
  _check_full_rotary("partial_rotary_factor", d.get("partial_rotary_factor"))
  if d.get("mlp_bias"):
    _refuse("mlp_bias", True, "MLP biases are not implemented")
  for f in MOE_FIELDS:
    if d.get(f):
      _refuse(f, d[f], "mixture-of-experts models are not implemented")


def config_from_hf(d: Mapping[str, Any], dtype: str = "float32") -> ModelConfig:
  """A ModelConfig from a parsed HF `config.json` (Gemma3ForConditionalGeneration: its text model)."""
  archs = d.get("architectures") or []
  if d.get("model_type") == "gemma3" and isinstance(d.get("text_config"), Mapping):
    if archs and set(archs) - {"Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"}:
      raise ValueError(f"unsupported architecture {archs!r} (model_type 'gemma3'): only "
                       "Gemma3ForConditionalGeneration's text model is loaded")
    _check_common(d)                   # (a quantized multimodal checkpoint says so at the top)
    eos = d.get("eos_token_id", d["text_config"].get("eos_token_id"))
    d = dict(d["text_config"], model_type="gemma3_text", eos_token_id=eos, architectures=["Gemma3ForCausalLM"])
    archs = d["architectures"]
  family = d.get("model_type")
  known = [a for f in FAMILIES.values() for a in f.archs]
  if family not in FAMILIES or (archs and not any(a in FAMILIES[family].archs for a in archs)):
    raise ValueError(f"unsupported architecture {archs or family!r} (model_type {family!r}); supported: "
                     f"{', '.join(known)} and Gemma3ForConditionalGeneration's text model")
  defaults = FAMILIES[family].defaults

  def get(key):
    return d[key] if key in d else defaults.get(key)

  def need(key):
    if get(key) is None:
      raise ValueError(f"config.json lacks required field {key!r}")
    return get(key)

  _check_common(d)
  n_heads, hidden, n = (_int(k, need(k)) for k in ("num_attention_heads", "hidden_size", "num_hidden_layers"))
  act_field = "hidden_activation" if family.startswith("gemma") else "hidden_act"
  act = get(act_field)
  if act not in ACTIVATIONS:
    _refuse(act_field, act, f"implemented: {', '.join(ACTIVATIONS)}")
  gemma = family.startswith("gemma")
  if family == "gemma3_text" and get("attn_logit_softcapping") is not None:
    _refuse("attn_logit_softcapping", d["attn_logit_softcapping"], "Gemma 3 has none and transformers' "
            "Gemma3Attention does not apply it; refusing rather than guessing")
  bias = _flag("attention_bias", get("attention_bias")) if family in ("llama", "qwen3") or gemma else False
  bos = d.get("bos_token_id")
  if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int)):
    _refuse("bos_token_id", bos, "one token id (an integer) or null")
  scalar = _positive("query_pre_attn_scalar", get("query_pre_attn_scalar")) if gemma else None  # (its queries' scale)
  windows = _windows(d, get, family, n)
  theta, scaling = _rope(d, get, FULL if family == "gemma3_text" else None)
  local_theta, local_scaling = (_rope(d, get, SLIDING, legacy_theta="rope_local_base_freq")
                                if family == "gemma3_text" else (None, None))
  kv, head_dim = get("num_key_value_heads"), d.get("head_dim") or defaults.get("head_dim")
  return ModelConfig(
      vocab_size=_int("vocab_size", need("vocab_size")), hidden_size=hidden,
      intermediate_size=_int("intermediate_size", need("intermediate_size")), num_layers=n, num_heads=n_heads,
      num_kv_heads=n_heads if kv is None else _int("num_key_value_heads", kv),
      head_dim=hidden // n_heads if head_dim is None else _int("head_dim", head_dim), rope_theta=theta,
      rope_scaling=scaling, rms_norm_eps=_positive("rms_norm_eps", get("rms_norm_eps"), zero=True),
      tie_embeddings=_flag("tie_word_embeddings", get("tie_word_embeddings")),
      max_position_embeddings=_int("max_position_embeddings", need("max_position_embeddings")), bos_token_id=bos,
      eos_token_ids=eos_ids(d.get("eos_token_id")), dtype=dtype,
      qkv_bias=bias or family == "qwen2", o_bias=bias, qk_norm=family in ("qwen3", "gemma3_text"),
      norm_plus_one=gemma, post_norms=gemma, activation=ACTIVATIONS[act], embed_scale=gemma,
      query_pre_attn_scalar=scalar,
      attn_softcap=_optional_positive("attn_logit_softcapping", get("attn_logit_softcapping")) if family == "gemma2"
      else None,
      final_softcap=_optional_positive("final_logit_softcapping", get("final_logit_softcapping")) if gemma else None,
      layer_windows=windows,
      local_rope_theta=local_theta, local_rope_scaling=local_scaling)


def eos_ids(*values) -> tuple[int, ...]:
  """Distinct EOS ids from any number of `eos_token_id` values (an id, a list of ids, or None), in order."""
  out = []
  for v in values:
    out += [] if v is None else list(v) if isinstance(v, (list, tuple)) else [v]
  return tuple(dict.fromkeys(int(e) for e in out))


# generation_config.json fields with which transformers' generate() would decode otherwise than asked: a
# model's recommended sampling. Settings here are the caller's own, so a warning names them at load.
GENERATION_DEFAULTS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
                       "no_repeat_ngram_size", "num_beams", "max_new_tokens", "max_length")


def load_hf_config(path: str, dtype: str = "float32") -> ModelConfig:
  """config.json of an HF dir, with generation_config.json's EOS ids added (Qwen's <|im_end|> and
  <|endoftext|>, Gemma's <eos> and <end_of_turn>: every one stops a row); its decoding defaults (sampling,
  penalties, lengths) are not applied, and a warning names them."""
  cfg_path = os.path.join(path, "config.json")
  try:
    with open(cfg_path) as f:
      cfg = config_from_hf(json.load(f), dtype=dtype)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"cannot read {cfg_path!r}: {e}") from e
  gen = os.path.join(path, "generation_config.json")
  if os.path.isfile(gen):
    try:
      with open(gen) as f:
        g = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f"cannot read {gen!r}: {e}") from e
    if steer := {k: g[k] for k in GENERATION_DEFAULTS if g.get(k) is not None}:
      warnings.warn(f"{gen}: its decoding defaults are not applied ({', '.join(f'{k}={v!r}' for k, v in steer.items())}"
                    "): pass the settings you want (repetition penalties and beams are not implemented)",
                    UserWarning, stacklevel=3)
    cfg = cfg.replace(eos_token_ids=eos_ids(cfg.eos_token_ids, g.get("eos_token_id")))
  return cfg


# --------------------------------------------------------------------------------------------- GGUF

GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


def _llama3_factors(s: RopeScaling, head_dim: int, theta: float):
  """The per-frequency divisors llama.cpp stores in a `rope_freqs` tensor for llama3 scaling."""
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  wavelen = 2 * np.pi / inv
  orig = s.original_max_position_embeddings
  smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
  out = np.where(wavelen < orig / s.high_freq_factor, 1.0, 1.0 / ((1 - smooth) / s.factor + smooth))
  return np.where(wavelen > orig / s.low_freq_factor, s.factor, out)


def _gguf_rope(get, need, arch: str, tensors, head_dim: int, theta: float) -> RopeScaling | None:
  scaling = None
  kind = get(f"{arch}.rope.scaling.type", "none")
  if kind == "linear":
    scaling = RopeScaling(kind="linear", factor=float(need(f"{arch}.rope.scaling.factor")))
  elif kind not in ("none", None):
    _refuse(f"{arch}.rope.scaling.type", kind, "implemented: none, linear, llama3 (rope_freqs)")
  if "rope_freqs.weight" in tensors:  # llama3 scaling is stored as per-frequency divisors, not metadata
    freqs = np.asarray(tensors["rope_freqs.weight"].data, np.float64).reshape(-1)
    for orig in (8192, 4096, 2048, 16384, 32768):
      for lo, hi in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0)):
        cand = RopeScaling("llama3", float(freqs.max()), lo, hi, orig)
        if np.allclose(_llama3_factors(cand, head_dim, theta), freqs, rtol=1e-4):
          return cand
    raise ValueError("GGUF rope_freqs tensor does not match any llama3 scaling parameters")
  return scaling


def _gguf_windows(get, arch: str, n: int, hidden: int, n_heads: int, head_dim: int):
  """(layer windows, query_pre_attn_scalar) as llama.cpp reads a Gemma file: its sliding window from the
  metadata, the pattern of sliding layers fixed per architecture (Gemma 2: every other layer from the first;
  Gemma 3: five of six) unless the file records one, and the attention scale of the 27B models (62 / 46
  layers) from hidden / heads, else head_dim (llama.cpp's llama-model.cpp; GGUF stores no
  query_pre_attn_scalar)."""
  window = get(f"{arch}.attention.sliding_window")
  if arch not in ("gemma2", "gemma3"):
    if window is not None:
      _refuse(f"{arch}.attention.sliding_window", window, f"llama.cpp's {arch} graph ignores it while HF "
              "would apply it; ambiguous, so refused")
    return (), None
  if get(f"{arch}.attention.scale") is not None:
    _refuse(f"{arch}.attention.scale", get(f"{arch}.attention.scale"), "not part of llama.cpp's Gemma format")
  if window is None:
    raise ValueError(f"GGUF file lacks required metadata '{arch}.attention.sliding_window'")
  pattern = get(f"{arch}.attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
  if isinstance(pattern, (list, tuple)):
    sliding = [bool(p) for p in pattern]
    if len(sliding) != n:
      _refuse(f"{arch}.attention.sliding_window_pattern", pattern, f"{len(sliding)} entries for {n} layers")
  else:
    sliding = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(n)]
  big = n == (62 if arch == "gemma3" else 46)
  return tuple(int(window) if s else 0 for s in sliding), float(hidden // n_heads if big else head_dim)


def config_from_gguf(reader, dtype: str = "float32") -> ModelConfig:
  """A ModelConfig from a `gguf.GGUFReader`'s `<arch>.*` / `tokenizer.ggml.*` metadata (arch: llama,
  qwen2, qwen3, gemma2, gemma3), read the way llama.cpp reads them."""
  def get(key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()

  arch = get("general.architecture")
  if arch not in GGUF_ARCHS:
    raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHS)}")

  def need(key):
    v = get(key)
    if v is None:
      raise ValueError(f"GGUF file lacks required metadata {key!r}")
    return v

  hidden = int(need(f"{arch}.embedding_length"))
  n_heads = int(need(f"{arch}.attention.head_count"))
  head_dim = int(get(f"{arch}.attention.key_length", hidden // n_heads))
  rot = get(f"{arch}.rope.dimension_count")
  if rot is not None and int(rot) != head_dim:
    _refuse(f"{arch}.rope.dimension_count", rot, f"partial rotary embeddings (head_dim={head_dim})")
  if get(f"{arch}.expert_count"):
    _refuse(f"{arch}.expert_count", get(f"{arch}.expert_count"), "mixture-of-experts models are not implemented")
  if arch != "gemma3" and get(f"{arch}.rope.freq_base_swa") is not None:
    _refuse(f"{arch}.rope.freq_base_swa", get(f"{arch}.rope.freq_base_swa"), f"not read by llama.cpp's {arch}")
  if arch == "gemma3":
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
      if get(f"gemma3.{key}") is not None:
        _refuse(f"gemma3.{key}", get(f"gemma3.{key}"), "llama.cpp's Gemma 3 applies no soft-capping")
  n = int(need(f"{arch}.block_count"))
  theta = float(get(f"{arch}.rope.freq_base", 1_000_000.0 if arch == "gemma3" else 10000.0))
  tensors = {t.name: t for t in reader.tensors}
  tokens = get("tokenizer.ggml.tokens")
  vocab = get(f"{arch}.vocab_size") or (len(tokens) if tokens else int(tensors["token_embd.weight"].shape[-1]))
  windows, qpas = _gguf_windows(get, arch, n, hidden, n_heads, head_dim)
  gemma = arch.startswith("gemma")
  softcaps = ((float(need("gemma2.attn_logit_softcapping")), float(need("gemma2.final_logit_softcapping")))
              if arch == "gemma2" else (None, None))
  eos = [get("tokenizer.ggml.eos_token_id"), get("tokenizer.ggml.eot_token_id")]
  bos = get("tokenizer.ggml.bos_token_id")
  return ModelConfig(
      vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(need(f"{arch}.feed_forward_length")),
      num_layers=n, num_heads=n_heads, num_kv_heads=int(get(f"{arch}.attention.head_count_kv", n_heads)),
      head_dim=head_dim, rope_theta=theta, rope_scaling=_gguf_rope(get, need, arch, tensors, head_dim, theta),
      rms_norm_eps=float(need(f"{arch}.attention.layer_norm_rms_epsilon")),     # llama.cpp requires both
      tie_embeddings="output.weight" not in tensors, max_position_embeddings=int(need(f"{arch}.context_length")),
      bos_token_id=None if bos is None else int(bos), eos_token_ids=eos_ids(*eos), dtype=dtype,
      qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors,
      qk_norm="blk.0.attn_q_norm.weight" in tensors, norm_plus_one=gemma, post_norms=gemma,
      activation="gelu_tanh" if gemma else "silu", embed_scale=gemma, query_pre_attn_scalar=qpas,
      attn_softcap=softcaps[0], final_softcap=softcaps[1], layer_windows=windows,
      local_rope_theta=float(get("gemma3.rope.freq_base_swa", 10000.0)) if arch == "gemma3" else None)
