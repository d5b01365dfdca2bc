"""The objects run.py's flags describe: the model (loaded, in its shards with --mesh), the draft, the
DecodeSettings, generate's keyword arguments and the prompts of a file. Built after `flags.validate` has
checked the flags, from the values it let through; what only building can find wrong (a prompts file's line,
a mesh the devices cannot make) raises `app.UsageError` naming its flag.
"""
from __future__ import annotations

import functools
import json
import os
import time

from absl import app

from magicdec_jax import checkpoints, settings, sharding, testing
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.cli import draft_flags
from magicdec_jax.cli.flags import RANDOM_PREFIX, load_acceptance_vector, parse_gamma, parse_tree
from magicdec_jax.datagen_formats import NATIVE_OPTIONS


def load(name: str, mesh=None):
  """--model / --draft_model value -> Model (random-tiny[:SEED] or checkpoints.load_model); with a mesh
  the params end up in their shards (orbax dirs are restored straight into them)."""
  if mesh is not None:
    if os.path.isfile(os.path.join(name, checkpoints.CONFIG_FILE)):
      return checkpoints.load_orbax_sharded(name, mesh)
    return sharding.shard_model(load(name), mesh)
  if name == RANDOM_PREFIX or name.startswith(RANDOM_PREFIX + ":"):
    seed = name.partition(":")[2] or "0"
    if not seed.isdigit():
      raise app.UsageError(f"--model={name}: expected {RANDOM_PREFIX}:SEED with an integer seed")
    return testing.random_tiny_model(int(seed))
  try:
    return checkpoints.load_model(name)
  except ValueError as e:
    if str(e).startswith("unknown model"):
      raise ValueError(f"{e}, or {RANDOM_PREFIX}[:SEED] (a tiny random model, for tests)") from None
    raise


def load_target(fv, log):
  """--model, loaded (into its shards with --mesh), with a log line before and after."""
  log(f"loading {fv.model} ...")
  t = time.perf_counter()
  model = load(fv.model, setup_mesh(fv))
  log(f"loaded {model.name}: {model.config.num_layers} layers, vocab {model.config.vocab_size} "
      f"({time.perf_counter() - t:.1f}s)")
  return model


def read_prompts_file(path: str, flag: str = "prompts_file") -> list:
  """One prompt per line, or JSONL objects with 'prompt' or 'messages' (and perhaps an 'id', a label read
  nowhere here; a record's own settings are --mode=datagen's, refused by name); a byte-order mark opening
  the file is skipped. UsageError naming --flag."""
  out = []
  with open(path, encoding="utf-8-sig") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      if line.lstrip().startswith("{"):
        try:
          rec = json.loads(line)
        except json.JSONDecodeError as e:
          raise app.UsageError(f"--{flag}={path} line {n}: malformed JSON ({e.msg})") from None
        if not isinstance(rec, dict) or ("prompt" in rec) == ("messages" in rec) or \
            not isinstance(rec.get("prompt", rec.get("messages")), (str, list)):
          raise app.UsageError(f"--{flag}={path} line {n}: needs one 'prompt' (a string) or 'messages' (a list)")
        if other := sorted(set(rec) - {"prompt", "messages", "id"}):
          where = " (a record's own settings: --mode=datagen)" if set(other) <= set(NATIVE_OPTIONS) else ""
          raise app.UsageError(f"--{flag}={path} line {n}: field(s) {', '.join(map(repr, other))} are not read "
                               f"here{where}")
        if "messages" in rec:
          try:
            tok_lib.check_messages(rec["messages"])
          except ValueError as e:
            raise app.UsageError(f"--{flag}={path} line {n}: {e}") from None
        out.append(rec.get("prompt", rec.get("messages")))
      else:
        out.append(line.rstrip("\n"))
  if not out:
    raise app.UsageError(f"--{flag}={path}: no prompts")
  return out


def prompt_text(fv, model, prompt) -> str:
  """A prompt as the model reads it: messages (or, with --chat, a user turn) in its chat template."""
  if isinstance(prompt, list) or fv.chat:
    return render_chat(model, prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}])
  return prompt


def build_draft(fv, target):
  """The draft object the flags describe (None for --draft=none): its builder in cli/draft_flags.py."""
  try:
    return draft_flags.build(fv, target, load)
  except ValueError as e:
    raise app.UsageError(str(e)) from None


def decode_settings(fv, target, priced: bool = True) -> settings.DecodeSettings:
  """The DecodeSettings every generating mode runs with, from the flags (parsed once, here); priced=False:
  without --hardware / --acceptance_file (bench reads --hardware for its predicted crossover only)."""
  try:
    return settings.DecodeSettings(
        max_new_tokens=fv.max_new_tokens, temperature=fv.temperature, top_k=fv.top_k, top_p=fv.top_p, min_p=fv.min_p,
        seed=fv.seed, draft=build_draft(fv, target),
        gamma=parse_gamma(fv.gamma) if fv["gamma"].present else None, sampling=fv.sampling,
        tree=parse_tree(fv.tree) if fv.tree else None, attention_impl=fv.attention_impl,
        hardware=(fv.hardware or None) if priced else None, learn_acceptance=fv.learn_acceptance,
        numerics=fv.numerics,
        acceptance=load_acceptance_vector(fv.acceptance_file) if fv.acceptance_file and priced else None)
  except ValueError as e:
    raise app.UsageError(str(e)) from None


def gen_kwargs(fv, target) -> dict:
  """generate() / generate_stream() / datagen.run() keyword arguments: the settings and the placement."""
  kw = dict(settings=decode_settings(fv, target))
  if fv.mesh:
    kw["mesh"] = setup_mesh(fv)
  if fv.device_memory_gb is not None:
    kw["device_memory"] = int(fv.device_memory_gb * (1 << 30))
  return kw


render_chat = tok_lib.chat_prompt   # messages -> prompt text with the model's chat template


def setup_mesh(fv):
  """--mesh -> magicdec_jax.sharding.make_mesh(spec), built once per spec (it needs the devices, so it
  runs after jax.distributed start-up, not in validate()); None without --mesh."""
  return _mesh(fv.mesh) if fv.mesh else None


@functools.lru_cache(maxsize=None)
def _mesh(spec: str):
  try:
    return sharding.make_mesh(spec)
  except ValueError as e:
    raise app.UsageError(f"--mesh={spec}: {e}") from None
