"""Tokenizers and chat templates for loaded models.

A model carries a `tokenizers.Tokenizer` (fast, no transformers needed at run time): read from an HF
`tokenizer.json`, or rebuilt from the vocab and merges a GGUF file embeds (byte-level BPE, the `gpt2`
tokenizer model). Chat templates are rendered with jinja2 the way transformers renders them.
"""
from __future__ import annotations

import datetime
import functools
import json
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
# llama.cpp's "llama-bpe" (Llama 3.x): the same split with digits in runs of up to three, no normalizer
LLAMA3_SPLIT = QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
# "tekken" (Mistral NeMo, Mistral Small 3): words split at case changes, single digits
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# GGUF pre-tokenizer name -> (split regex, NFC first); the digit-split names and "gpt-2" (or no name: GPT-2's
# byte-level split) are rebuilt too; any other name is not (its split is unknown here)
SPLITS = {"qwen2": (QWEN2_SPLIT, True), "llama-bpe": (LLAMA3_SPLIT, False), "llama3": (LLAMA3_SPLIT, False),
          "llama-v3": (LLAMA3_SPLIT, False), "tekken": (TEKKEN_SPLIT, False)}
GGUF_PRE = ("gpt-2",) + tuple(SPLITS) + _DIGIT_SPLIT_PRE
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
  pre = _field(reader, "tokenizer.ggml.pre")
  if pre is not None and pre not in GGUF_PRE:
    warnings.warn(f"GGUF pre-tokenizer {pre!r} is not rebuilt (only {', '.join(GGUF_PRE)} are): the model loads "
                  "without a tokenizer and takes token ids (or load the HF dir, whose tokenizer.json is read)",
                  RuntimeWarning, stacklevel=2)
    return None
  tok = tokenizers.Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in SPLITS:
    split, nfc = SPLITS[pre]
    if nfc:
      tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
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


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
  """transformers' `tojson` filter (keys in order, no HTML escaping), not jinja2's."""
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=32)
def _template(chat_template: str):
  """The compiled template, in the sandboxed environment transformers renders chat templates in."""
  import jinja2
  import jinja2.ext
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag) renders its body."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)   # (as transformers: today)
  return env.from_string(chat_template)


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")   # OpenAI's chat roles


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
  """Refuse chat messages a template would misread: each a mapping with an OpenAI role and string content."""
  if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence) or not messages:
    raise ValueError(f"'messages' must be a non-empty list of {{'role', 'content'}} mappings, got {messages!r:.80}")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"message {i} must be a mapping with 'role' and 'content', got {m!r:.80}")
    if m["role"] not in CHAT_ROLES:
      raise ValueError(f"message {i}: role {m['role']!r} is not one of {', '.join(CHAT_ROLES)} (a template "
                       "would render an unknown role as it is, e.g. a misspelt 'system' as a user turn)")
    if isinstance(m["content"], (list, tuple)):
      raise ValueError(f"message {i}: 'content' is a list of content parts, which are not supported: give its "
                       "text as a string")
    if not isinstance(m["content"], str):
      raise ValueError(f"message {i}: 'content' must be a string, got {type(m['content']).__name__}")


def render_chat(chat_template: str, messages: Sequence[Mapping[str, Any]],
                add_generation_prompt: bool = True, **extra: Any) -> str:
  """Render `messages` ([{'role': ..., 'content': ...}]) with a HF-style jinja2 chat template, as
  transformers' apply_chat_template renders it without tools or documents."""
  if not chat_template:
    raise ValueError("this model has no chat template; pass raw text or token ids instead")
  check_messages(messages)
  try:
    import jinja2
  except ImportError as e:  # pragma: no cover - jinja2 is a declared dependency
    raise ValueError("render_chat needs jinja2: run `pip install jinja2`") from e
  try:
    return _template(chat_template).render(messages=list(messages), tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, **extra)
  except ValueError:                                         # the template's own raise_exception
    raise
  except Exception as e:  # noqa: BLE001 - a template is untrusted code: any failure is a bad template
    kind = "" if isinstance(e, jinja2.TemplateError) else " (while rendering)"
    raise ValueError(f"chat template{kind}: {type(e).__name__}: {e}") from e


class ChatText(str):
  """Prompt text a chat template rendered. It already holds the special tokens the template writes (a BOS
  among them), so `encode` adds none, as transformers' apply_chat_template(tokenize=True) does not."""


def encode(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
  """Text -> token ids, with the tokenizer's special tokens (its BOS) unless `text` is ChatText."""
  return list(tokenizer.encode(text, add_special_tokens=not isinstance(text, ChatText)).ids)


def chat_prompt(model, messages: Sequence[Mapping[str, Any]]) -> ChatText:
  """`messages` -> prompt text with `model`'s chat template and the generation prompt appended; the template
  sees `bos_token` and `eos_token` as transformers' apply_chat_template passes its tokenizer's
  (`special_tokens`)."""
  if not model.chat_template:
    raise ValueError(f"model {model.name!r} has no chat template")
  return ChatText(render_chat(model.chat_template, messages, add_generation_prompt=True, **special_tokens(model)))


def special_tokens(model) -> dict[str, str]:
  """{'bos_token', 'eos_token'}: the model's `template_tokens` where it has them (an HF tokenizer's own),
  else the text of its BOS id and first EOS id."""
  cfg, tok, out = model.config, model.tokenizer, {}
  if tok is not None:
    for name, tid in (("bos_token", cfg.bos_token_id), ("eos_token", (cfg.eos_token_ids or (None,))[0])):
      text = None if tid is None else tok.id_to_token(int(tid))
      if text is not None:
        out[name] = text
  return {**out, **(model.template_tokens or {})}


def read_template_tokens(path: str) -> dict[str, str] | None:
  """{'bos_token', 'eos_token'} of an HF `tokenizer_config.json` (a string or an added token's
  {'content': ...}); None when the file names neither."""
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      conf = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"cannot read {path!r}: {e}") from e
  out = {}
  for name in ("bos_token", "eos_token"):
    v = conf.get(name) if isinstance(conf, dict) else None
    v = v.get("content") if isinstance(v, dict) else v
    if isinstance(v, str):
      out[name] = v
  return out or None
