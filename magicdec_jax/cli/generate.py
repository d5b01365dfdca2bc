"""`run.py --mode=generate`: decode --prompt (repeatable) or --prompts_file with the draft the flags describe;
the texts go to stdout, the timing line to the log."""
from __future__ import annotations

from absl import app

from magicdec_jax import engine
from magicdec_jax.cli import flags as cli_flags


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.validate_acceptance_file(fv)
  if bool(fv.prompt) == bool(fv.prompts_file):
    raise app.UsageError("--mode=generate needs exactly one of --prompt (repeatable) or --prompts_file")
  if fv.prompts_file:
    cli_flags.readable_file("prompts_file", fv.prompts_file)
  if any(not p.strip() for p in fv.prompt):
    raise app.UsageError("--prompt: empty prompt")


def run(fv, log) -> None:
  prompts = fv.prompt or cli_flags.read_prompts_file(fv.prompts_file)
  model = cli_flags.load_target(fv, log)
  texts = [cli_flags.prompt_text(fv, model, p) for p in prompts]
  kw = cli_flags.gen_kwargs(fv, model)
  log(f"generating {len(texts)} prompt(s) ...")
  res = engine.generate(model, texts, shrink_batch=fv.shrink_batch, **kw)
  for i, (t, reason) in enumerate(zip(res.texts or res.tokens, res.finish_reasons)):
    if len(texts) > 1:
      print(f"=== [{i}] ({reason}) ===")
    print(t)
  s = res.stats
  log(f"{s['new_tokens']} tokens, prefill {s['prefill_s']:.2f}s, decode {s['decode_s']:.2f}s, "
      f"{s['tokens_per_s']:.1f} tokens/s, acceptance {s['acceptance_rate']}")
