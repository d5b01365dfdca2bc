"""`run.py --mode=generate`: decode --prompt (repeatable) or --prompts_file with the draft the flags describe
(with --json_schema, every output valid JSON under that schema); the texts go to stdout, the timing line to
the log."""
from __future__ import annotations

import json

from absl import app

from magicdec_jax import generation
from magicdec_jax.cli import build as cli_build, flags as cli_flags
from magicdec_jax.constraints import Constraint

OWN_FLAGS = ("prompt", "prompts_file", "json_schema", "chat", "mesh", "device_memory_gb")
SETTINGS_FLAGS = cli_flags.DECODE_FLAGS      # (decode_settings)


def json_schema(fv) -> dict | None:
  """--json_schema as a schema (its JSON text, or @PATH), checked (UsageError naming the flag); None unset."""
  text = fv.json_schema
  if text is None:
    return None
  where = "--json_schema"
  if text.startswith("@"):
    cli_flags.readable_file("json_schema", text[1:])
    where = f"--json_schema={text}"
    with open(text[1:], encoding="utf-8") as f:
      text = f.read()
  try:
    schema = json.loads(text)
  except ValueError as e:
    raise app.UsageError(f"{where}: not JSON ({e})") from None
  if not isinstance(schema, dict):
    raise app.UsageError(f"{where}: a JSON schema is a JSON object, got {type(schema).__name__} {text.strip()[:40]}")
  try:
    Constraint.json_schema(schema)
  except ValueError as e:     # a ConstraintError names the keyword
    raise app.UsageError(f"{where}: {e}") from None
  return schema


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.validate_acceptance_file(fv)
  if bool(fv.prompt) == bool(fv.prompts_file):
    raise app.UsageError("--mode=generate needs exactly one of --prompt (repeatable) or --prompts_file")
  if fv.prompts_file:
    cli_flags.readable_file("prompts_file", fv.prompts_file)
  if any(not p.strip() for p in fv.prompt):
    raise app.UsageError("--prompt: empty prompt")
  json_schema(fv)


def run(fv, log) -> None:
  prompts = fv.prompt or cli_build.read_prompts_file(fv.prompts_file)
  model = cli_build.load_target(fv, log)
  texts = [cli_build.prompt_text(fv, model, p) for p in prompts]
  kw = cli_build.gen_kwargs(fv, model)
  log(f"generating {len(texts)} prompt(s) ...")
  res = generation.generate(model, texts, shrink_batch=fv.shrink_batch, json_schema=json_schema(fv), **kw)
  for i, (t, reason) in enumerate(zip(res.texts or res.tokens, res.finish_reasons)):
    if len(texts) > 1:
      print(f"=== [{i}] ({reason}) ===")
    print(t)
  s = res.stats
  ends = f", finish reason {res.finish_reasons[0]}" if len(texts) == 1 else ""   # (stdout: the text alone)
  log(f"{s['new_tokens']} tokens, prefill {s['prefill_s']:.2f}s, decode {s['decode_s']:.2f}s, "
      f"{s['tokens_per_s']:.1f} tokens/s{ends}, acceptance {s['acceptance_rate']}")
  if (auto := s.get("auto_plan")) is not None:
    picked = auto["settings"] if auto["speculate"] else "plain decoding"
    log(f"{'tree' if fv.tree == 'auto' else 'gamma'}=auto chose {picked} over contexts {auto['contexts']} "
        f"(predicted up to {auto['speedup']:.2f}x on {auto['hardware']})")
