"""Loading the families beyond an HF causal-LM dir: GGUF files of each family written here the way
llama.cpp's converter lays them out (qwen2 / qwen3 / gemma2 / gemma3; logits against the HF model they were
written from), Gemma3ForConditionalGeneration's text model, an HF tokenizer.json + chat template (against
transformers' own tokenizer), the partition rules of the new params, and every refusal naming its field."""
import json
import os
import re

import jax
import numpy as np
import pytest

from magicdec_jax import generate, logits
from magicdec_jax.checkpoints import load_model
from magicdec_jax.families import config_from_hf
from magicdec_jax.model import init_params
from magicdec_jax.sharding import rules
from magicdec_jax.tokenizer import render_chat

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
from family_models import BASE, GEMMA3_ROPE, GEMMA3_TYPES, TOL, hf_logits, hf_model, ids, max_diff  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402

GGUF_CASES = {  # name: (family, arch, overrides, write the local RoPE base + pattern)
    "qwen2-untied": ("qwen2", "qwen2", dict(use_sliding_window=False), False),
    "qwen2.5-tied": ("qwen2.5-tied", "qwen2", {}, False),
    "qwen3": ("qwen3", "qwen3", {}, False),
    "gemma2": ("gemma2", "gemma2", dict(query_pre_attn_scalar=16), False),
    "gemma3-recorded-pattern": ("gemma3", "gemma3", dict(query_pre_attn_scalar=16, final_logit_softcapping=None), True),
    "gemma3-llama.cpp-defaults": (   # llama.cpp's fixed Gemma 3 rules: five local layers in six, local base 1e4
        "gemma3", "gemma3", dict(query_pre_attn_scalar=16, final_logit_softcapping=None, num_hidden_layers=7,
                                 layer_types=None, rope_parameters=dict(GEMMA3_ROPE, sliding_attention={
                                     "rope_type": "default", "rope_theta": 10000.0})), False),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_round_trip(case, tmp_path):
  family, arch, over, pattern = GGUF_CASES[case]
  hf = hf_model(family, seed=7, **over)
  write_gguf(tmp_path / "m.gguf", hf, arch, pattern=pattern)
  ours = load_model(str(tmp_path / "m.gguf"))
  assert ours.tokenizer is None and ours.config.eos_token_ids == (5,)
  x = ids(seed=8)
  diff = max_diff(logits(ours, x), hf_logits(hf, x))
  print(f"{case}: max |logit diff| = {diff:.2e}, windows {ours.config.layer_windows}")
  assert diff < TOL
  if arch == "gemma3":
    assert ours.config.layer_windows == tuple(5 * (t == "sliding_attention") for t in hf.config.layer_types)


def test_only_small_gguf_files_stay_loaded(tmp_path, monkeypatch):
  """A GGUF file up to CACHED_GGUF_BYTES is read once per process; a larger one is read at every load, so
  dropping its Model frees its dequantized weights."""
  from magicdec_jax import checkpoints
  write_gguf(tmp_path / "m.gguf", hf_model("qwen2", seed=7), "qwen2")
  path = str(tmp_path / "m.gguf")
  assert load_model(path).params is load_model(path).params
  monkeypatch.setattr(checkpoints, "CACHED_GGUF_BYTES", os.path.getsize(path) - 1)
  a, b = load_model(path), load_model(path)
  assert a.params is not b.params
  jax.tree.map(np.testing.assert_array_equal, a.params, b.params)


def test_gguf_sentencepiece_tokenizer_loads_without_one(tmp_path):
  """A Gemma GGUF's SentencePiece vocab is not rebuilt: the weights load, a warning says so, text is refused."""
  hf = hf_model("gemma2", seed=9, query_pre_attn_scalar=16)
  write_gguf(tmp_path / "g.gguf", hf, "gemma2", metadata={"tokenizer.ggml.model": "llama"})
  with pytest.warns(RuntimeWarning, match="'llama' is not rebuilt"):
    model = load_model(str(tmp_path / "g.gguf"))
  assert model.tokenizer is None
  with pytest.raises(ValueError, match="no tokenizer"):
    generate(model, ["hello"], max_new_tokens=2)


@pytest.mark.parametrize("arch,metadata,field", [
    ("qwen2", {"qwen2.attention.sliding_window": 8}, "qwen2.attention.sliding_window"),
    ("qwen2", {"qwen2.rope.scaling.type": "yarn"}, "qwen2.rope.scaling.type"),
    ("qwen2", {"qwen2.expert_count": 4}, "qwen2.expert_count"),
    ("gemma3", {"gemma3.final_logit_softcapping": 30}, "gemma3.final_logit_softcapping"),
    ("gemma3", {"gemma3.attention.scale": 1}, "gemma3.attention.scale"),
    ("phi3", {}, "unsupported GGUF architecture 'phi3'"),
])
def test_gguf_refusals(arch, metadata, field, tmp_path):
  family = {"qwen2": "qwen2.5-tied", "gemma3": "gemma3", "phi3": "qwen3"}[arch]
  hf = hf_model(family, seed=10, **({"query_pre_attn_scalar": 16} if arch == "gemma3" else {}))
  write_gguf(tmp_path / "x.gguf", hf, arch, metadata=metadata)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    load_model(str(tmp_path / "x.gguf"))


@pytest.mark.parametrize("kw,words", [
    (dict(extra={"blk.0.foo.weight": np.zeros(4, np.float32)}), "1 tensor(s) the model does not use: blk.0.foo"),
    (dict(omit=("context_length",)), "lacks required metadata 'qwen2.context_length'"),
    (dict(omit=("layer_norm_rms_eps",)), "lacks required metadata 'qwen2.attention.layer_norm_rms_epsilon'")])
def test_gguf_tensors_and_metadata_it_does_not_fit(kw, words, tmp_path):
  """A stray tensor is refused by name, and so is missing metadata llama.cpp requires (it was defaulted)."""
  write_gguf(tmp_path / "x.gguf", hf_model("qwen2.5-tied", seed=10), "qwen2", **kw)
  with pytest.raises(ValueError, match=re.escape(words)):
    load_model(str(tmp_path / "x.gguf"))


def test_gemma3_for_conditional_generation_text_model(tmp_path):
  """The published Gemma 3 4B / 12B / 27B checkpoints: text model under language_model.*, beside a vision
  tower; config under text_config. Logits equal HF's on text input."""
  torch.manual_seed(11)
  text = transformers.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 2}, head_dim=16, sliding_window=5,
                                       layer_types=GEMMA3_TYPES[:2], rope_parameters=GEMMA3_ROPE)
  vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14)
  hf = transformers.Gemma3ForConditionalGeneration(
      transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)).eval()
  hf.save_pretrained(tmp_path)
  ours = load_model(str(tmp_path))
  assert ours.config.layer_windows == (5, 0) and ours.config.local_rope_theta == 100.0
  x = ids(seed=12)
  with torch.no_grad():
    want = hf(input_ids=torch.tensor(x)).logits.float().numpy()
  assert max_diff(logits(ours, x), want) < TOL
  # the top level is read too: a quantized checkpoint or another head says so there
  d = json.loads((tmp_path / "config.json").read_text())
  for edit, field in (({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
                      ({"architectures": ["Gemma3ForSequenceClassification"]}, "Gemma3ForSequenceClassification")):
    with pytest.raises(ValueError, match=field):
      config_from_hf(dict(d, **edit))


def test_hf_tokenizer_and_chat_template(tmp_path):
  """tokenizer.json and tokenizer_config.json's chat template, against transformers' tokenizer of the same
  files (ChatML, as Qwen ships it)."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, decoders
  tok = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ĠĊ")},
                                        [], fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
  hf_model("qwen2.5-tied", seed=13).save_pretrained(tmp_path)
  tok.save(str(tmp_path / "tokenizer.json"))
  template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "<|im_end|>"}))
  model = load_model(str(tmp_path))
  ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=template)
  msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
  chat = render_chat(model.chat_template, msgs)
  assert chat == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert model.tokenizer.encode(chat).ids == ref(chat)["input_ids"]


def test_chat_templates_see_bos_eos_and_the_date_as_in_transformers(tmp_path):
  """A template using bos_token / eos_token (Mistral's) and strftime_now renders as transformers'
  apply_chat_template does with the same files; an error in a template is a ValueError naming it."""
  import datetime
  import tokenizers
  from tokenizers import models, pre_tokenizers, decoders
  from magicdec_jax.tokenizer import chat_prompt
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz []/INSTĠ")}}
  tok = tokenizers.Tokenizer(models.BPE(vocab, [], fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<s>", "</s>"])
  hf_model("mistral", seed=13, bos_token_id=1, eos_token_id=2).save_pretrained(tmp_path)
  tok.save(str(tmp_path / "tokenizer.json"))
  template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + "
              "' [/INST]' }}{% else %}{{ m['content'] + eos_token + ' ' }}{% endif %}{% endfor %}"
              "{{ strftime_now('%Y') }}")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>",
                                                              "eos_token": "</s>"}))
  model = load_model(str(tmp_path))
  ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), chat_template=template,
                                             bos_token="<s>", eos_token="</s>")
  msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"}]
  got = chat_prompt(model, msgs)
  assert got == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
  assert got.startswith("<s>[INST] hi [/INST]yo</s> ") and got.endswith(datetime.datetime.now().strftime("%Y"))
  with pytest.raises(ValueError, match="chat template: UndefinedError: 'nope' is undefined"):
    render_chat("{{ nope.x }}", msgs)


def test_partition_rules_of_the_new_params():
  """q/k/v biases split with their heads; o's bias and the q/k norms replicated."""
  cfg = config_from_hf(dict(hf_model("qwen3-window-bias").config.to_dict()))
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  specs = rules.param_specs(params, rules.layout_for(cfg, 2))
  attn = specs["layers"][0]["attn"]
  P = jax.sharding.PartitionSpec
  assert attn["q_bias"] == P("model") and attn["k_bias"] == attn["v_bias"] == P("model")
  assert attn["o_bias"] == P(None) and attn["q_norm"]["scale"] == P(None)


REFUSALS = [  # (family, config.json edits, the field the error names)
    ("qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                   "original_max_position_embeddings": 64}}, "rope_parameters.rope_type='yarn'"),
    ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("qwen2", {"use_sliding_window": False, "layer_types": ["full_attention", "sliding_attention"] * 2},
     r"layer_types\[1\]"),
    ("qwen3", {"layer_types": ["chunked_attention"] * 4}, r"layer_types\[0\]"),
    ("qwen3", {"num_experts": 8}, "num_experts"),
    ("qwen3", {"hidden_act": "gelu"}, "hidden_act"),
    ("mistral", {"layer_types": ["full_attention"] * 4}, "layer_types"),
    ("mistral", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma2", {"is_causal": False}, "is_causal"),
    ("qwen2", {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]}, "unsupported architecture"),
    # legacy rope_scaling beside transformers 5's rope_parameters: transformers applies it, so it is read
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
     "rope_scaling.rope_type='yarn'"),
    ("qwen3", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling=.* differs from rope_parameters"),
    # rope_parameters without its own rope_theta (transformers fills it in from the top level): still read
    ("qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
     "rope_parameters.rope_type='yarn'"),
    ("gemma3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters=.* ambiguous"),
    ("gemma3", {"layer_types": None, "sliding_window_pattern": 2, "_sliding_window_pattern": 3},
     "_sliding_window_pattern=3"),
    ("mistral", {"bos_token_id": [1, 2]}, r"bos_token_id=\[1, 2\]"),
    ("gemma2", {"query_pre_attn_scalar": None}, "query_pre_attn_scalar=None"),
    # one rope set per layer type for a family whose layers all take one: transformers fails on it too
    ("qwen2", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 5.0, "factor": 4.0}}},
     "rope_parameters=.*one set per layer type"),
    ("qwen2", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}},
     "rope_parameters.low_freq_factor=None"),      # (transformers needs both freq factors)
    # malformed values: a ValueError naming the field, never a TypeError / KeyError or a silent truncation
    ("qwen2", {"rms_norm_eps": None}, "rms_norm_eps=None is malformed"),
    ("qwen2", {"rms_norm_eps": "1e-6x"}, "rms_norm_eps='1e-6x' is malformed"),
    ("qwen2", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_parameters.factor=None"),
    ("qwen2", {"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}}, "rope_parameters.rope_theta=-5.0"),
    ("mistral", {"rope_scaling": "linear"}, "rope_scaling='linear' is malformed"),
    ("qwen2", {"tie_word_embeddings": "false"}, "tie_word_embeddings='false' is malformed"),
    ("qwen3", {"attention_bias": "false"}, "attention_bias='false' is malformed"),
    ("mistral", {"hidden_size": 64.5}, "hidden_size=64.5 is malformed"),
    ("mistral", {"max_position_embeddings": 0}, "max_position_embeddings=0 is malformed"),
    ("gemma2", {"final_logit_softcapping": "30"}, "final_logit_softcapping='30' is malformed"),
]


@pytest.mark.parametrize("family,edit,field", REFUSALS)
def test_unimplemented_fields_are_refused(family, edit, field, tmp_path):
  hf_model(family, seed=14).save_pretrained(tmp_path)
  d = dict(json.loads((tmp_path / "config.json").read_text()), **edit)
  with pytest.raises(ValueError, match=field):
    config_from_hf(d)
  (tmp_path / "config.json").write_text(json.dumps(d))
  with pytest.raises(ValueError, match=field):     # before any weight is read
    load_model(str(tmp_path))


@pytest.mark.parametrize("family,edit", [
    ("qwen2", {"rope_theta": 500.0, "rope_parameters": {"rope_type": "linear", "factor": 3.0}}),
    # llama3 without original_max_position_embeddings: transformers fills in max_position_embeddings (1024)
    ("qwen2", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "rope_theta": 500000.0}}),
    ("gemma3", {"rope_theta": 900.0, "rope_local_base_freq": 77.0,
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0},
                                    "sliding_attention": {"rope_type": "default"}}}),
])
def test_rope_parameters_without_their_theta_match_hf(family, edit, tmp_path):
  """A rope_parameters set without rope_theta: transformers takes the theta from the top-level field and
  applies the set's scaling (it was read as no scaling at all); a llama3 set without its original length
  takes the config's (it was read as 8192)."""
  hf_model(family, seed=14).save_pretrained(tmp_path)
  d = dict(json.loads((tmp_path / "config.json").read_text()), **edit)
  (tmp_path / "config.json").write_text(json.dumps(d))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  x = ids()
  ours = load_model(str(tmp_path))
  kind = (edit["rope_parameters"].get("full_attention") or edit["rope_parameters"])["rope_type"]
  assert ours.config.rope_scaling is not None and ours.config.rope_scaling.kind == kind
  assert max_diff(logits(ours, x), hf_logits(hf, x)) < TOL


def test_llama_mlp_bias_refused():
  cfg = hf_model("qwen3").config.to_dict()
  with pytest.raises(ValueError, match="mlp_bias"):
    config_from_hf(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"], mlp_bias=True))


def test_harmless_fields_change_nothing(tmp_path):
  """Dropout, initializer range and cache hints leave the config alone (as they leave HF's computation)."""
  d = hf_model("gemma2").config.to_dict()
  plain = config_from_hf(d)
  assert config_from_hf(dict(d, attention_dropout=0.3, initializer_range=0.5, cache_implementation="hybrid",
                             use_cache=False)) == plain
  assert plain.layer_window(1) is None and plain.layer_window(0) == 5
  q = hf_model("qwen2").config.to_dict()                 # a null partial_rotary_factor: transformers' default, 1
  assert config_from_hf(dict(q, rope_parameters=dict(q["rope_parameters"], partial_rotary_factor=None))) == \
      config_from_hf(q)


def test_gguf_qwen2_tokenizer_matches_hf(tmp_path):
  """A qwen2 GGUF's byte-level BPE ("pre": qwen2) against transformers' Qwen2Tokenizer of the same vocab and
  merges: merges that cross GPT-2's splits but not Qwen's ("(h", "'M", letters after punctuation) show the
  split is Qwen's, digits stay single, control tokens stay whole."""
  from tokenizers import pre_tokenizers
  vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  merges = [("(", "h"), ("(h", "e"), ("'", "M"), ("h", "e"), ("1", "2"), ("Ċ", "Ċ"), ("Ġ", "t"), (",", "w")]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]          # Qwen2Tokenizer adds <|endoftext|> first
  tokens = list(vocab) + special
  hf = hf_model("qwen2.5-tied", seed=15, vocab_size=len(tokens))
  write_gguf(tmp_path / "t.gguf", hf, "qwen2",
             tokenizer=("qwen2", tokens, merges, [1] * len(vocab) + [3] * len(special)))
  ours = load_model(str(tmp_path / "t.gguf")).tokenizer
  ref = transformers.Qwen2Tokenizer(vocab=vocab, merges=merges)
  ref.add_special_tokens({"additional_special_tokens": special[1:]})
  for text in ["Hello (hello) I'M 12345 the\n\n  x", "(hel,world<|im_end|>\n", "café  é\u0301 ok"]:
    assert ours.encode(text).ids == ref(text)["input_ids"], text
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("name,billions", [("qwen25_7b", 7.6156), ("qwen25_32b", 32.764), ("qwen25_72b", 72.706),
                                           ("qwen3_8b", 8.1907), ("qwen3_32b", 32.762), ("mistral_7b", 7.2417)])
def test_published_shapes(name, billions):
  """The new --model_shape entries count the published parameters (HF's safetensors totals; biases and
  q/k norms are not in the cost model's count: < 2e-5 of them)."""
  from magicdec_jax.tuning import costmodel, shapes
  assert costmodel.num_params(shapes.model_shape(name)) / 1e9 == pytest.approx(billions, rel=2e-4)


def test_gemma3_shapes():
  from magicdec_jax.tuning import shapes
  g27 = shapes.model_shape("gemma3_27b")
  assert (g27.num_layers, g27.head_dim, g27.query_pre_attn_scalar, g27.num_kv_heads) == (62, 128, 168.0, 16)
  assert g27.layer_windows == tuple(0 if (i + 1) % 6 == 0 else 1024 for i in range(62))
  assert g27.eos_token_ids == (1, 106) and g27.local_rope_theta == 10000.0 and g27.rope_scaling.factor == 8.0
  assert shapes.model_shape("mistral_7b").layer_windows == (4096,) * 32


def test_generation_config_decoding_defaults_are_named_not_applied(tmp_path):
  """transformers' generate() would sample with a generation_config.json's temperature / top_p and apply its
  repetition penalty; here settings are the caller's, so loading names what is not applied (and only that:
  the file transformers writes itself, ids only, loads quietly)."""
  import warnings
  hf_model("qwen2", seed=14).save_pretrained(tmp_path)
  with warnings.catch_warnings():
    warnings.simplefilter("error", UserWarning)
    load_model(str(tmp_path))
  (tmp_path / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [1, 2], "do_sample": True, "temperature": 0.7, "top_p": 0.8, "repetition_penalty": 1.05}))
  with pytest.warns(UserWarning, match="do_sample=True, temperature=0.7, top_p=0.8, repetition_penalty=1.05"):
    assert load_model(str(tmp_path)).config.eos_token_ids[-2:] == (1, 2)
