"""`run.py --mode=distill`: train a draft into --distill_out on --distill_data (datagen JSONL and/or text):
a smaller model draft (the target's first --draft_layers layers, or a random --draft_config; training/distill.py)
or, with --draft=feature, an EAGLE-style feature head (training/distill_feature.py). A rerun resumes."""
from __future__ import annotations

import json
import os
import re

from absl import app

from magicdec_jax import feature_head, textdata
from magicdec_jax.cli import build as cli_build, draft_flags, flags as cli_flags
from magicdec_jax.training import distill, distill_data, distill_feature

OWN_FLAGS = ("distill_data", "distill_out", "draft_config", "distill_steps", "lr", "warmup_steps", "batch",
             "seq_len", "checkpoint_every", "eval_every", "distill_loss", "distill_heldout", "mesh")
SETTINGS_FLAGS = ("seed",)


def validate(fv) -> None:
  cli_flags.need(fv, "distill_data", "distill_out")
  for p in fv.distill_data:
    cli_flags.readable_file("distill_data", p)
    if os.path.getsize(p) == 0:
      raise app.UsageError(f"--distill_data={p}: empty file")
  head = draft_flags.trains_head(fv)
  trains = ["model"] + draft_flags.names(lambda e: e.trains_head)
  if fv["draft"].present and fv.draft not in trains:
    raise app.UsageError(f"--mode=distill trains a draft model or a feature head (--draft={'|'.join(trains)}), "
                         f"not --draft={fv.draft}")
  cli_flags.refuse_flags(fv, ("draft_weights",), "it trains in the target's precision or --distill_compute")
  if fv.draft_vocab and not head:
    heads = "|".join(draft_flags.names(lambda e: e.trains_head))
    raise app.UsageError(f"--draft_vocab={fv.draft_vocab} applies to --draft={heads} only")
  if head:
    if fv.draft_layers or fv.draft_config or fv.draft_model:
      raise app.UsageError(f"--mode=distill --draft={fv.draft} trains a new head: no --draft_layers, "
                           "--draft_config or --draft_model")
    if fv.mesh:
      raise app.UsageError(f"--mode=distill --draft={fv.draft} runs on one device (no --mesh)")
    if fv["distill_loss"].present:
      raise app.UsageError(f"--distill_loss={fv.distill_loss} is for a draft model (--draft_layers / "
                           f"--draft_config): a head trains on the target's soft cross-entropy")
  elif bool(fv.draft_layers) == bool(fv.draft_config):
    raise app.UsageError("--mode=distill needs exactly one of --draft_layers (the target's first N layers) "
                         "or --draft_config (a config JSON for a random draft)")
  if fv.draft_config:
    cli_flags.readable_file("draft_config", fv.draft_config)
    cli_flags.draft_config_from_flag(fv.draft_config)
  if fv.distill_heldout:
    cli_flags.readable_file("distill_heldout", fv.distill_heldout)
    if os.path.getsize(fv.distill_heldout) == 0:
      raise app.UsageError(f"--distill_heldout={fv.distill_heldout}: empty file")
  out = os.path.abspath(fv.distill_out)
  if os.path.exists(out) and not os.path.isdir(out):
    raise app.UsageError(f"--distill_out={fv.distill_out}: exists and is not a directory")
  probe = out if os.path.isdir(out) else os.path.dirname(out)
  if not os.path.isdir(probe):
    raise app.UsageError(f"--distill_out={fv.distill_out}: directory {probe} does not exist")
  if not os.access(probe, os.W_OK):
    raise app.UsageError(f"--distill_out={fv.distill_out}: {probe} is not writable")
  if fv.mesh:
    m = re.search(r"data\s*:\s*(\d+)", fv.mesh)      # the rest is checked by setup_mesh (needs devices)
    if m and int(m.group(1)) > 0 and fv.batch % int(m.group(1)):
      raise app.UsageError(f"--batch={fv.batch}: must be a multiple of the mesh's data axis ({m.group(1)})")


def run(fv, log) -> None:
  model = cli_build.load_target(fv, log)
  try:
    steps, history = (_train_head if draft_flags.trains_head(fv) else _train_draft)(fv, log, model)
  except ValueError as e:
    raise app.UsageError(f"distill: {e}") from None
  print(json.dumps({"out": fv.distill_out, "steps": steps, "history": history}, indent=1))


def _schedule(fv) -> dict:
  """The training settings both kinds of draft share."""
  return dict(steps=fv.distill_steps, lr=fv.lr, warmup_steps=fv.warmup_steps, batch=fv.batch, seq_len=fv.seq_len,
              seed=fv.seed, checkpoint_every=fv.checkpoint_every, eval_every=fv.eval_every, sink=fv.sink,
              window=fv.window)


def _data(fv, model, seq_len: int):
  """(training windows of seq_len tokens from --distill_data, held-out windows or None)."""
  eos = model.config.eos_token_ids[0] if model.config.eos_token_ids else None
  data = distill_data.load_windows(fv.distill_data, model.tokenizer, model.config.vocab_size, seq_len, eos)
  n_eval = min(1024, model.config.max_position_embeddings)
  if fv.distill_heldout:
    try:
      held = distill_data.load_windows(fv.distill_heldout, model.tokenizer, model.config.vocab_size,
                                       n_eval)[:2].tolist()
      if len(held) < 2:
        raise ValueError(f"{len(held)} window, the held-out measure needs 2")
    except ValueError as e:     # (its windows are the held-out measure's n_eval tokens, not --seq_len)
      raise ValueError(f"--distill_heldout={fv.distill_heldout} (held-out windows of {n_eval} tokens): "
                       f"{e}") from None
  elif model.tokenizer is not None:
    held = textdata.shakespeare_prompts(model.tokenizer, 2, n_eval, held_out=True)
  else:
    held = None
  return data, held


def _train_draft(fv, log, model):
  """A model draft: the target's first --draft_layers layers, or a random --draft_config model."""
  cfg = distill.DistillConfig(loss=fv.distill_loss, **_schedule(fv))
  if fv.draft_config:
    draft = distill.init_draft(model, config=cli_flags.draft_config_from_flag(fv.draft_config), seed=fv.seed)
  else:
    if fv.draft_layers > model.config.num_layers:
      raise ValueError(f"--draft_layers={fv.draft_layers}: the target has only {model.config.num_layers} layers")
    draft = distill.init_draft(model, layers=fv.draft_layers)
  data, held = _data(fv, model, cfg.seq_len)
  log(f"distilling a {draft.config.num_layers}-layer draft on {data.shape[0]} windows of {cfg.seq_len} "
      f"tokens, {cfg.steps} steps of {cfg.batch}, loss {cfg.loss} -> {fv.distill_out}")
  _, history = distill.distill(model, draft, data, fv.distill_out, cfg, eval_windows=held,
                               mesh=cli_build.setup_mesh(fv), progress=fv.progress)
  return cfg.steps, history


def _train_head(fv, log, model):
  """--draft=feature: a feature head (on --draft_vocab's most frequent tokens, if given)."""
  cfg = distill_feature.FeatureDistillConfig(compute=fv.distill_compute, **_schedule(fv))
  v = model.config.vocab_size
  data, held = _data(fv, model, cfg.seq_len)
  if fv.draft_vocab > v:
    raise ValueError(f"--draft_vocab={fv.draft_vocab} exceeds the target's vocabulary of {v}")
  vocab = feature_head.frequent_vocab(data, fv.draft_vocab, v, model.config.eos_token_ids or ()) \
      if fv.draft_vocab else None
  head = feature_head.init_head(model, seed=fv.seed, vocab=vocab)
  log(f"training a feature head (layers {list(head.layers)}, vocabulary "
      f"{v if vocab is None else len(vocab)}) on {data.shape[0]} windows of {cfg.seq_len} "
      f"tokens, {cfg.steps} steps of {cfg.batch} -> {fv.distill_out}")
  _, history = distill_feature.train(model, head, data, fv.distill_out, cfg, eval_windows=held,
                                     progress=fv.progress)
  return cfg.steps, history
