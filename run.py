"""magicdec_jax command line: the demo (no flags), generate, bench, datagen, convert, plan, profile_acceptance,
calibrate.

  python run.py                                   # SmolLM2-135M: autoregressive vs MagicDec on Shakespeare
  python run.py --mode=generate --prompt="To be, or not to be" --draft=streaming --gamma=3
  python run.py --mode=datagen --input=prompts.jsonl --output=out.jsonl --batch_size=8
  python run.py --mode=distill --distill_data=out.jsonl --distill_out=draft --draft_layers=8
  python run.py --mode=distill --draft=feature --distill_data=text.txt --distill_out=head
  python run.py --mode=generate --draft=feature --draft_model=head --prompt="To be, or not to be"
  python run.py --mode=bench --bench_preset=long_context  # where MagicDec wins: AR vs gamma over batch x context
  python run.py --mode=calibrate --output=profile.json   # measure this device -> hardware profile
  python run.py --mode=plan --hardware=profile.json      # plan with it (datasheet column beside)
  python run.py --helpfull                        # every flag

Flags are validated (magicdec_jax/cli/flags.py) before any model is loaded; progress goes to stderr,
results (generated text, tables, summaries) to stdout.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time

from absl import app, flags

import jax


from magicdec_jax import checkpoints, datagen, engine, feature_head, textdata
from magicdec_jax.tuning import acceptance, calibrate, costmodel, shapes, sweep
from magicdec_jax.cli import bench as cli_bench, demo as cli_demo, flags as cli_flags
from magicdec_jax.training import distill, distill_data, distill_feature
from magicdec_jax import compile as compiling
from magicdec_jax.tuning.autotune import detect_hardware
from magicdec_jax.sampling import Sampling
from magicdec_jax.sharding import distributed
from magicdec_jax.sharding.planner import DoesNotFit

FLAGS = cli_flags.define_flags(flags.FLAGS)
flags.adopt_module_key_flags(cli_flags)   # --help lists them


def log(msg: str):
  if FLAGS.progress:
    print(f"[magicdec {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_target():
  log(f"loading {FLAGS.model} ...")
  t = time.perf_counter()
  model = cli_flags.load(FLAGS.model, cli_flags.setup_mesh(FLAGS))
  log(f"loaded {model.name}: {model.config.num_layers} layers, vocab {model.config.vocab_size} "
      f"({time.perf_counter() - t:.1f}s)")
  return model


# ---- demo ---------------------------------------------------------------------------------------------------

def mode_demo():
  """The main job (magicdec_jax/cli/demo.py): prefill once, decode AR and MagicDec, print the comparison.
  Unless given, batch, prompt length and gamma are where MagicDec should win on this backend, DEMO_NEW_TOKENS
  new tokens, decoded twice each way (alternately)."""
  model = load_target()
  batch, prompt_tokens, gamma = cli_demo.default_shape()
  given = lambda name: FLAGS[name].present
  cli_demo.run(model, batch=FLAGS.batch_size if given("batch_size") else batch,
               prompt_tokens=FLAGS.prompt_tokens if given("prompt_tokens") else prompt_tokens,
               max_new_tokens=FLAGS.max_new_tokens if given("max_new_tokens") else cli_demo.DEMO_NEW_TOKENS,
               gamma=cli_flags.parse_gamma(FLAGS.gamma) if given("gamma") else gamma, sink=FLAGS.sink,
               window=FLAGS.window,
               temperature=FLAGS.temperature, seed=FLAGS.seed, progress=FLAGS.progress,
               shared_tokens=FLAGS.shared_tokens, repeats=FLAGS.demo_repeats, shrink_batch=FLAGS.shrink_batch,
               draft_weights=(None if FLAGS.draft_weights == "none" else FLAGS.draft_weights)
               if given("draft_weights") else "bfloat16", log=log, root=os.path.dirname(os.path.abspath(__file__)))


# ---- generate -----------------------------------------------------------------------------------------------

def read_prompts_file(path: str) -> list:
  """One prompt per line, or JSONL objects with 'prompt' (or 'messages')."""
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      if line.lstrip().startswith("{"):
        try:
          rec = json.loads(line)
        except json.JSONDecodeError as e:
          raise app.UsageError(f"--prompts_file={path} line {n}: malformed JSON ({e.msg})") from None
        if not isinstance(rec.get("prompt", rec.get("messages")), (str, list)):
          raise app.UsageError(f"--prompts_file={path} line {n}: needs a 'prompt' or 'messages' field")
        out.append(rec.get("prompt", rec.get("messages")))
      else:
        out.append(line.rstrip("\n"))
  if not out:
    raise app.UsageError(f"--prompts_file={path}: no prompts")
  return out


def mode_generate():
  prompts = FLAGS.prompt or read_prompts_file(FLAGS.prompts_file)
  model = load_target()
  texts = []
  for p in prompts:
    if isinstance(p, list) or FLAGS.chat:
      p = cli_flags.render_chat(model, p if isinstance(p, list) else [{"role": "user", "content": p}])
    texts.append(p)
  kw = cli_flags.gen_kwargs(FLAGS, model)
  log(f"generating {len(texts)} prompt(s) ...")
  res = engine.generate(model, texts, shrink_batch=FLAGS.shrink_batch, **kw)
  for i, (t, reason) in enumerate(zip(res.texts or res.tokens, res.finish_reasons)):
    if len(texts) > 1:
      print(f"=== [{i}] ({reason}) ===")
    print(t)
  s = res.stats
  log(f"{s['new_tokens']} tokens, prefill {s['prefill_s']:.2f}s, decode {s['decode_s']:.2f}s, "
      f"{s['tokens_per_s']:.1f} tokens/s, acceptance {s['acceptance_rate']}")


# ---- bench, datagen, convert, plan, profile -------------------------------------------------------------------

def mode_bench():
  preset = sweep.LONG_CONTEXT if FLAGS.bench_preset == "long_context" else {}
  if preset and not FLAGS["window"].present:
    FLAGS.window = preset["window"]
  if preset and not FLAGS["max_new_tokens"].present:
    FLAGS.max_new_tokens = preset["max_new_tokens"]
  grid = {name: (cli_flags.int_list(FLAGS, name, low) if FLAGS[name].present or not preset else list(preset[name]))
          for name, low in (("batches", 1), ("contexts", 16), ("gammas", 1))}
  model = load_target()
  st = cli_flags.decode_settings(FLAGS, model)
  out = cli_bench.run_bench(
      model, st.draft, **grid, output_dir=FLAGS.output_dir, log=log, hardware=FLAGS.hardware,
      max_batch_tokens=preset.get("max_batch_tokens"),
      gen=dict(max_new_tokens=st.max_new_tokens, temperature=st.temperature, top_k=st.top_k, top_p=st.top_p,
               seed=st.seed, attention_impl=st.attention_impl))
  print(json.dumps({"json": out["json"], "plots": out["plots"]}, indent=1))


def mode_datagen():
  model = load_target()
  kw = cli_flags.gen_kwargs(FLAGS, model)
  index, count = jax.process_index(), jax.process_count()
  try:
    summary = datagen.run(model, FLAGS.input, FLAGS.output, batch_size=FLAGS.batch_size,
                          refill_at=FLAGS.refill_at, num_samples=FLAGS.num_samples_per_prompt, on_error=FLAGS.on_error,
                          truncate=FLAGS.truncate, chat=FLAGS.chat, progress=FLAGS.progress,
                          process_index=index, process_count=count, **kw)
    if count > 1:        # every process has written its shard; process 0 merges them into --output
      distributed.barrier("datagen-shards-written")
      if index == 0:
        summary = dict(datagen.merge_shards(FLAGS.output, FLAGS.input, count), this_process=summary)
      distributed.barrier("datagen-merged")
  except datagen.DatagenError as e:
    raise app.UsageError(f"datagen: {e}") from None
  print(json.dumps(summary, indent=1))


def mode_convert():
  log(f"converting {FLAGS.src} -> {FLAGS.dst} (orbax) ...")
  print(json.dumps(checkpoints.convert(FLAGS.src, FLAGS.dst)))


PLAN_BATCHES = (1, 4, 8, 16, 32, 64)
PLAN_CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)


def mode_plan():
  cfg = shapes.model_shape(FLAGS.model_shape)
  kind = {"streaming": "self", "snapkv": "snapkv", "model": "model"}[FLAGS.draft]
  hw_name = FLAGS.hardware or "h100"
  profile, datasheet = None, None
  if calibrate.is_profile_path(hw_name):
    profile = calibrate.load_profile(hw_name)[1]
    cfg = shapes.model_shape(FLAGS.model_shape, dtype=profile.get("dtype", cfg.dtype))   # as it was measured
    guess = next((k for k in ("h200", "h100", "a100") if k in profile.get("device", "").lower()), "h100")
    datasheet = detect_hardware(FLAGS.datasheet or guess)
  draft_cfg = cfg.replace(num_layers=FLAGS.draft_layers) if kind == "model" else None
  draft = costmodel.Draft(kind, draft_cfg=draft_cfg, sink=FLAGS.sink, window=FLAGS.window, budget=FLAGS.budget)
  vec = cli_flags.load_acceptance_vector(FLAGS.acceptance_file) if FLAGS.acceptance_file else None
  if vec is None and profile is not None and profile.get("acceptance_vector"):
    vec = profile["acceptance_vector"]
  # the plan's own grid (long contexts, serving batches), not the bench grid, unless given on the command line
  batches = cli_flags.int_list(FLAGS, "batches", 1) if FLAGS["batches"].present else list(PLAN_BATCHES)
  contexts = cli_flags.int_list(FLAGS, "contexts", 1) if FLAGS["contexts"].present else list(PLAN_CONTEXTS)
  hw = detect_hardware(hw_name)
  alpha = None if vec else FLAGS.alpha
  rows = costmodel.plan_table(cfg, hw, batches, contexts, draft, alpha=alpha, acceptance_vector=vec)
  print(f"plan: {FLAGS.model_shape} on {hw_name if profile is None else 'profile ' + hw_name + ' (' + profile.get('device', '?') + ')'}, "
        f"draft {kind} (sink {FLAGS.sink}, window {FLAGS.window}{', budget %d' % FLAGS.budget if kind == 'snapkv' else ''}), "
        f"{'acceptance vector ' + (FLAGS.acceptance_file or 'from the profile') if vec else 'alpha %.2f' % FLAGS.alpha}")
  if datasheet is not None:
    ds = costmodel.plan_table(cfg, datasheet, batches, contexts, draft, alpha=alpha, acceptance_vector=vec)
    print(f"(gamma / speedup / T_AR from the fitted profile; ds_* columns: the {datasheet.name} datasheet roofline)")
    print(costmodel.format_plan(rows, compare=ds))
  else:
    print(costmodel.format_plan(rows))
  a = vec[0] if vec else FLAGS.alpha
  print(f"\nS_inflection (smallest context where a gamma chain's speedup grows from batch 64 to 128; "
        f"alpha {a:.2f}):")
  for name, h in [(hw.name, hw)] + ([(datasheet.name + " datasheet", datasheet)] if datasheet else []):
    cells = []
    for g in range(1, 7):
      n = costmodel.s_inflection(cfg, h, draft, g, a)
      cells.append(f"gamma={g}: {n if n is not None else 'none <= 1M'}")
    print(f"  {name}: " + ", ".join(cells))


def mode_profile_acceptance():
  model = load_target()
  draft = cli_flags.build_draft(FLAGS, model)
  n = min(FLAGS.profile_tokens, model.config.max_position_embeddings)
  if FLAGS.input:            # the user's prompts: each one (its last n tokens) is a window
    windows = []
    for p in read_prompts_file(FLAGS.input):
      if isinstance(p, list) or FLAGS.chat:
        p = cli_flags.render_chat(model, p if isinstance(p, list) else [{"role": "user", "content": p}])
      ids = model.tokenizer.encode(p).ids[-n:]
      if len(ids) >= 32:
        windows.append(ids)
    if not windows:
      raise app.UsageError(f"--input={FLAGS.input}: no prompt has >= 32 tokens to profile on")
    source = FLAGS.input
  else:
    windows = textdata.shakespeare_prompts(model.tokenizer, FLAGS.profile_windows, n, held_out=True)
    source = "shakespeare (held out)"
  log(f"profiling {len(windows)} windows ({source}) of <= {n} tokens, width {FLAGS.width} ...")
  out = acceptance.profile(model, draft, windows, width=FLAGS.width, seed=FLAGS.seed,
                           sampling=Sampling(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p))
  out["source"] = source
  with open(FLAGS.output, "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out, indent=1))


def mode_distill_feature(model):
  """--mode=distill --draft=feature: train a feature head (distill_feature.py) into --distill_out."""
  if FLAGS.mesh:
    raise app.UsageError("--mode=distill --draft=feature runs on one device (no --mesh)")
  cfg = distill_feature.FeatureDistillConfig(
      steps=FLAGS.distill_steps, lr=FLAGS.lr, warmup_steps=FLAGS.warmup_steps, batch=FLAGS.batch,
      seq_len=FLAGS.seq_len, seed=FLAGS.seed, checkpoint_every=FLAGS.checkpoint_every,
      eval_every=FLAGS.eval_every, sink=FLAGS.sink, window=FLAGS.window, compute=FLAGS.distill_compute)
  v = model.config.vocab_size
  eos = model.config.eos_token_ids[0] if model.config.eos_token_ids else None
  try:
    data = distill_data.load_windows(FLAGS.distill_data, model.tokenizer, v, cfg.seq_len, eos)
    held = _heldout_windows(model)
    if FLAGS.draft_vocab > v:
      raise ValueError(f"--draft_vocab={FLAGS.draft_vocab} exceeds the target's vocabulary of {v}")
    vocab = feature_head.frequent_vocab(data, FLAGS.draft_vocab, v, model.config.eos_token_ids or ()) \
        if FLAGS.draft_vocab else None
    head = feature_head.init_head(model, seed=FLAGS.seed, vocab=vocab)
    log(f"training a feature head (layers {list(head.layers)}, vocabulary "
        f"{v if vocab is None else len(vocab)}) on {data.shape[0]} windows of {cfg.seq_len} "
        f"tokens, {cfg.steps} steps of {cfg.batch} -> {FLAGS.distill_out}")
    _, history = distill_feature.train(model, head, data, FLAGS.distill_out, cfg, eval_windows=held,
                                       progress=FLAGS.progress)
  except ValueError as e:
    raise app.UsageError(f"distill: {e}") from None
  print(json.dumps({"out": FLAGS.distill_out, "steps": cfg.steps, "history": history}, indent=1))


def _heldout_windows(model):
  n_eval = min(1024, model.config.max_position_embeddings)
  if FLAGS.distill_heldout:
    return distill_data.load_windows(FLAGS.distill_heldout, model.tokenizer, model.config.vocab_size,
                                     n_eval)[:2].tolist()
  if model.tokenizer is not None:
    return textdata.shakespeare_prompts(model.tokenizer, 2, n_eval, held_out=True)
  return None


def mode_distill():
  model = load_target()
  if FLAGS.draft == "feature":
    return mode_distill_feature(model)
  cfg = distill.DistillConfig(
      steps=FLAGS.distill_steps, lr=FLAGS.lr, warmup_steps=FLAGS.warmup_steps, batch=FLAGS.batch,
      seq_len=FLAGS.seq_len, loss=FLAGS.distill_loss, seed=FLAGS.seed, checkpoint_every=FLAGS.checkpoint_every,
      eval_every=FLAGS.eval_every, sink=FLAGS.sink, window=FLAGS.window)
  v = model.config.vocab_size
  eos = model.config.eos_token_ids[0] if model.config.eos_token_ids else None
  try:
    if FLAGS.draft_config:
      draft = distill.init_draft(model, config=cli_flags.draft_config_from_flag(FLAGS.draft_config),
                                 seed=FLAGS.seed)
    else:
      if FLAGS.draft_layers > model.config.num_layers:
        raise ValueError(f"--draft_layers={FLAGS.draft_layers}: the target has only "
                         f"{model.config.num_layers} layers")
      draft = distill.init_draft(model, layers=FLAGS.draft_layers)
    data = distill_data.load_windows(FLAGS.distill_data, model.tokenizer, v, cfg.seq_len, eos)
    held = _heldout_windows(model)
    log(f"distilling a {draft.config.num_layers}-layer draft on {data.shape[0]} windows of {cfg.seq_len} "
        f"tokens, {cfg.steps} steps of {cfg.batch}, loss {cfg.loss} -> {FLAGS.distill_out}")
    _, history = distill.distill(model, draft, data, FLAGS.distill_out, cfg, eval_windows=held,
                                 mesh=cli_flags.setup_mesh(FLAGS), progress=FLAGS.progress)
  except ValueError as e:
    raise app.UsageError(f"distill: {e}") from None
  print(json.dumps({"out": FLAGS.distill_out, "steps": cfg.steps, "history": history}, indent=1))


def mode_calibrate():
  model = load_target()
  d = cli_flags.build_draft(FLAGS, model)
  under_test = [] if d is None else d.calibration_cases(model)
  kw = {}
  if FLAGS["batches"].present:
    kw["batches"] = cli_flags.int_list(FLAGS, "batches", 1)
  if FLAGS["contexts"].present:
    kw["contexts"] = cli_flags.int_list(FLAGS, "contexts", 1)
  kw["tokens"] = cli_flags.int_list(FLAGS, "calibrate_tokens", 1)
  kw["draft_tokens"] = cli_flags.int_list(FLAGS, "calibrate_draft_tokens", 1)
  vec = cli_flags.load_acceptance_vector(FLAGS.acceptance_file) if FLAGS.acceptance_file else None
  prof = calibrate.calibrate(model.params, model.config, drafts=under_test, model_name=model.name,
                             repeats=FLAGS.calibrate_repeats, passes=FLAGS.calibrate_passes,
                             acceptance_vector=vec, log=log, **kw)
  calibrate.save_profile(prof, FLAGS.output)
  fit = prof["fit"]
  ho = fit["holdout_rel_err"] or {}
  print(json.dumps({"profile": FLAGS.output, "device": prof["device"], "measured_steps": len(prof["measurements"]),
                    "seconds": round(prof["total_s"], 1), "coef": dict(zip(fit["features"], fit["coef"])),
                    "train_rel_err": fit["train_rel_err"], "holdout_rel_err": ho}, indent=1))


MODE_FNS = {"demo": mode_demo, "generate": mode_generate, "bench": mode_bench, "datagen": mode_datagen,
            "convert": mode_convert, "plan": mode_plan, "profile_acceptance": mode_profile_acceptance,
            "distill": mode_distill, "calibrate": mode_calibrate}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]} (flags need --name=value)")
  cli_flags.validate(FLAGS)
  if not FLAGS["verbosity"].present:          # absl's default verbosity shows jax's INFO chatter
    logging.getLogger("jax").setLevel(logging.WARNING)
  t = time.perf_counter()
  if FLAGS.num_processes > 1:                 # before anything touches a device
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    log(f"jax.distributed: process {FLAGS.process_id} of {FLAGS.num_processes}")
  cache_dir = compiling.enable_persistent_cache(FLAGS.compilation_cache_dir)   # None: the env var / default
  log(f"persistent compilation cache: {cache_dir or 'off'}")
  mesh = cli_flags.setup_mesh(FLAGS)          # None without --mesh
  try:
    with mesh if mesh is not None else contextlib.nullcontext():
      MODE_FNS[FLAGS.mode]()
  except DoesNotFit as e:                     # refused before compiling: the figures, no traceback
    print(f"magicdec: {e}", file=sys.stderr)
    sys.exit(2)
  log(f"--mode={FLAGS.mode} done in {time.perf_counter() - t:.1f}s")


if __name__ == "__main__":
  app.run(main)
