"""Tokenizers and chat templates for loaded models.

A model carries a `tokenizers.Tokenizer` (fast, no transformers needed at run time): read from an HF
`tokenizer.json`, or rebuilt from the vocab and merges a GGUF file embeds (byte-level BPE, the `gpt2`
tokenizer model). Chat templates are rendered with jinja2 the way transformers renders them.
"""
from __future__ import annotations

import datetime
import os
import warnings
from typing import Any, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

# llama.cpp pre-tokenizer names whose regex splits every digit on its own before the byte-level split.
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r")
# llama.cpp's "qwen2" pre-tokenizer (Qwen2, Qwen2.5, Qwen3): the split Qwen's own tokenizer.json makes, after NFC
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTROL, _USER_DEFINED = 3, 4


def load_tokenizer(path: str) -> tokenizers.Tokenizer:
  """A `tokenizer.json` file, or a directory holding one."""
  if os.path.isdir(path):
    path = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(path):
    raise ValueError(f"no tokenizer file at {path!r}")
  try:
    return tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # the Rust side raises a bare Exception on malformed JSON
    raise ValueError(f"cannot read tokenizer {path!r}: {e}") from e


def _field(reader, key: str, default: Any = None) -> Any:
  f = reader.fields.get(key)
  return default if f is None else f.contents()


def tokenizer_from_gguf(reader) -> tokenizers.Tokenizer | None:
  """Byte-level BPE from a `gguf.GGUFReader`'s embedded vocab; None when the file has no tokenizer, or one
  of another kind (SentencePiece 'llama', Gemma's: a warning says so; the model then takes token ids, or the
  HF dir's tokenizer.json).

  Control tokens (token_type 3, e.g. `<|im_start|>`) become special added tokens so they encode as one id
  and `decode(..., skip_special_tokens=True)` drops them; user-defined ones (type 4) become plain added tokens.
  """
  kind = _field(reader, "tokenizer.ggml.model")
  if kind is None:
    return None
  if kind != "gpt2":
    warnings.warn(f"GGUF tokenizer model {kind!r} is not rebuilt (only byte-level BPE 'gpt2' is): the model "
                  "loads without a tokenizer and takes token ids (or load the HF dir, whose tokenizer.json "
                  "is read)", RuntimeWarning, stacklevel=2)
    return None
  tokens = _field(reader, "tokenizer.ggml.tokens")
  merges = _field(reader, "tokenizer.ggml.merges") or []
  types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
  vocab = {t: i for i, t in enumerate(tokens)}
  pairs = [tuple(m.split(" ", 1)) for m in merges]
  tok = tokenizers.Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  pre = _field(reader, "tokenizer.ggml.pre")
  if pre == "qwen2":
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  elif pre in _DIGIT_SPLIT_PRE:
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  else:
    tok.pre_tokenizer = byte_level
  tok.decoder = decoders.ByteLevel()
  special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
  user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
  if special:
    tok.add_special_tokens(special)
  if user:
    tok.add_tokens(user)
  bos = _field(reader, "tokenizer.ggml.bos_token_id")
  if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
    b = tokens[int(bos)]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{b} $A", pair=f"{b} $A {b} $B", special_tokens=[(b, int(bos))])
  return tok


def gguf_chat_template(reader) -> str | None:
  return _field(reader, "tokenizer.chat_template")


def _raise(message: str):
  raise ValueError(f"chat template error: {message}")


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")   # OpenAI's chat roles


def render_chat(chat_template: str, messages: Sequence[Mapping[str, Any]],
                add_generation_prompt: bool = True, **extra: Any) -> str:
  """Render `messages` ([{'role': ..., 'content': ...}]) with a HF-style jinja2 chat template."""
  if not chat_template:
    raise ValueError("this model has no chat template; pass raw text or token ids instead")
  try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:  # pragma: no cover - jinja2 is a declared dependency
    raise ValueError("render_chat needs jinja2: run `pip install jinja2`") from e
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"message {i} must be a mapping with 'role' and 'content', got {m!r:.80}")
    if m["role"] not in CHAT_ROLES:
      raise ValueError(f"message {i}: role {m['role']!r} is not one of {', '.join(CHAT_ROLES)} (a template "
                       "would render an unknown role as it is, e.g. a misspelt 'system' as a user turn)")
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=["jinja2.ext.loopcontrols"])
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)   # (as transformers: today)
  try:
    template = env.from_string(chat_template)
    return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **extra)
  except jinja2.TemplateError as e:
    raise ValueError(f"chat template: {type(e).__name__}: {e}") from e


def chat_prompt(model, messages: Sequence[Mapping[str, Any]]) -> str:
  """`messages` -> prompt text with `model`'s chat template and the generation prompt appended; the template
  sees `bos_token` and `eos_token` (the text of the config's BOS id and first EOS id), as transformers'
  apply_chat_template passes its tokenizer's."""
  if not model.chat_template:
    raise ValueError(f"model {model.name!r} has no chat template")
  return render_chat(model.chat_template, messages, add_generation_prompt=True, **special_tokens(model))


def special_tokens(model) -> dict[str, str]:
  """{'bos_token', 'eos_token'}: the text of the model's BOS id and first EOS id, where it has them."""
  cfg, tok, out = model.config, model.tokenizer, {}
  if tok is None:
    return out
  for name, tid in (("bos_token", cfg.bos_token_id), ("eos_token", (cfg.eos_token_ids or (None,))[0])):
    text = None if tid is None else tok.id_to_token(int(tid))
    if text is not None:
      out[name] = text
  return out
