"""Text in as transformers reads it: a chat prompt rendered and tokenized as `apply_chat_template` does (no
second BOS where the template writes one, the tokenizer's own bos / eos texts, also after an orbax round trip),
templates rendered in transformers' environment (its `tojson`, `tools` / `documents` None, the
`{% generation %}` tag), GGUF pre-tokenizers against transformers' GGUF loader, and refusals by name."""
import json
import warnings

import pytest

from magicdec_jax.checkpoints import load_model, save_orbax
from magicdec_jax.prompts import prompt_ids
from magicdec_jax.tokenizer import chat_prompt, render_chat

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
from family_models import hf_model  # noqa: E402
from gguf_writer import write_gguf  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "ab"}]


def bos_adding_dir(path):
  """An HF dir as Llama 3 / Mistral / Gemma ship them: the tokenizer's post-processor adds BOS, the template
  writes `bos_token` too, and tokenizer_config.json's eos_token (<|im_end|>) is not the config's EOS (</s>)."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, processors
  specials = ["<s>", "</s>", "<|im_end|>"]
  vocab = {s: i for i, s in enumerate(specials + list("abcdefghijklmnopqrstuvwxyzĠ[]/"))}
  tok = tokenizers.Tokenizer(models.BPE(vocab, [], fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(specials)
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
  tok.save(str(path / "tokenizer.json"))
  hf_model("mistral", seed=3, vocab_size=len(vocab), bos_token_id=0, eos_token_id=1).save_pretrained(path)
  template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
              "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
  (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>",
                                                          "eos_token": {"__type": "AddedToken", "content": "<|im_end|>",
                                                                        "special": True}}))
  return transformers.AutoTokenizer.from_pretrained(str(path))


def test_a_chat_prompt_is_apply_chat_templates_text_and_ids(tmp_path):
  """One BOS (the template's), the tokenizer's eos text; a plain string still gets the tokenizer's BOS;
  the same after save_orbax / load_model."""
  ref = bos_adding_dir(tmp_path)
  want_text = ref.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
  want = ref.apply_chat_template(MSGS, tokenize=True, add_generation_prompt=True)
  want = list(want["input_ids"] if hasattr(want, "keys") else want)
  assert want[:2] != [0, 0] and "<|im_end|>" in want_text
  save_orbax(load_model(str(tmp_path)), str(tmp_path / "orbax"))
  for model in (load_model(str(tmp_path)), load_model(str(tmp_path / "orbax"))):
    text = chat_prompt(model, MSGS)
    assert text == want_text
    assert prompt_ids(model, [text, "ab"]) == [want, ref("ab")["input_ids"]]


@pytest.mark.parametrize("name,template,messages", [
    ("tojson keeps key order and does not escape HTML",
     "{% for c in messages[0].tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}",
     [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
         "name": "f", "arguments": {"z": "<b>&é", "a": 1}}}]}]),
    ("tools is none", "{% if tools is not none %}[TOOLS]{% endif %}{{ messages[0].content }}", MSGS[:1]),
    ("tools|tojson unguarded", "{{ tools|tojson }}{{ documents|tojson }}[INST]{{ messages[0].content }}", MSGS[:1]),
    ("generation tag", "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
     MSGS),
])
def test_templates_render_as_transformers(name, template, messages):
  import tokenizers
  ref = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(tokenizers.models.BPE({"a": 0}, [])))
  assert render_chat(template, messages) == ref.apply_chat_template(messages, chat_template=template, tokenize=False)


def test_bad_messages_and_failing_templates_are_value_errors_naming_them():
  for messages, words in (([{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                           "message 0: 'content' is a list of content parts"),
                          ([{"role": "user", "content": None}], "message 0: 'content' must be a string, got NoneType"),
                          ("hi", "'messages' must be a non-empty list"), ([], "'messages' must be a non-empty list")):
    with pytest.raises(ValueError, match=words):
      render_chat("{{ messages }}", messages)
  with pytest.raises(ValueError, match="chat template .while rendering.: TypeError"):
    render_chat("{{ messages[0].content + 1 }}", MSGS)


@pytest.mark.parametrize("pre", ["llama-bpe", "tekken"])
def test_gguf_pre_tokenizers_match_transformers_gguf_loader(tmp_path, pre):
  """Merges across GPT-2's splits but not the named one's ("(h", "123", "'M"; tekken: a case change splits
  a word, digits stay single) show the split is the file's; a control token stays whole."""
  from tokenizers import pre_tokenizers
  vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  merges = [("(", "h"), ("1", "2"), ("12", "3"), ("123", "4"), ("Ġ", "t"), ("'", "M"), ("a", "B"), ("aB", "c")]
  for a, b in merges:
    vocab[a + b] = len(vocab)
  special = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
  tokens = list(vocab) + special
  write_gguf(tmp_path / "t.gguf", hf_model("mistral", seed=15, vocab_size=len(tokens)), "llama",
             tokenizer=(pre, tokens, merges, [1] * len(vocab) + [3] * len(special)))
  ours = load_model(str(tmp_path / "t.gguf")).tokenizer
  ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
  for text in ["(hello 12345 (h I'M the aBc x<|eot_id|>", "  tabs\tand\n\nnew 1234567 lines"]:
    assert ours.encode(text, add_special_tokens=False).ids == ref(text, add_special_tokens=False)["input_ids"]
  assert ours.encode("123").ids != ours.encode("1 2 3").ids


def test_a_gguf_pre_tokenizer_not_rebuilt_loads_without_a_tokenizer(tmp_path):
  """Splitting text with another vocabulary's rule would silently change every prompt's tokens."""
  tokens = [chr(c) for c in range(33, 127)]
  write_gguf(tmp_path / "t.gguf", hf_model("mistral", seed=15, vocab_size=len(tokens)), "llama",
             tokenizer=("jais", tokens, [], [1] * len(tokens)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = load_model(str(tmp_path / "t.gguf"))
  assert model.tokenizer is None
  assert any("pre-tokenizer 'jais' is not rebuilt" in str(w.message) for w in caught)
