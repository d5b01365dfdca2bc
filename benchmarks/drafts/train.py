"""Trained drafts for SmolLM2-135M on Shakespeare: a distilled model draft, an EAGLE-style feature head, and
what one feature-head training step costs.

  model    distil the target's first `--layers` layers (+ final norm, tied head) with the target as teacher
           (training.distill); held out: the draft's teacher-forced greedy acceptance (sink 4 + window 256).
  feature  train a feature head (training.distill_feature) in resumable calls of `--max_seconds`, checkpointing
           in `--out_dir` (`finished`: all steps done); held out: its teacher-forced acceptance at depth 1..3.
  step     one feature-head training step in float32 and bfloat16 compute, alternated `--repeats` times.
Training text: the plays from the front; held out: `held_out=True` windows, which it never reaches (checked).

  nice -n 10 python -m benchmarks.drafts.train model --steps=200 --batch=4 --seq_len=256 --loss=kl
  flock /tmp/magicdec_cpu.lock python -m benchmarks.drafts.train feature --steps=400 --max_seconds=420
  python -m benchmarks.drafts.train step --batch=4 --seq_len=256 --draft_vocab=8192 --repeats=5
  python -m benchmarks.drafts.train model --smoke     # any kind: random tiny target, 2 steps, tiny shapes (seconds)
"""
from __future__ import annotations

import functools
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import feature_head, textdata
from magicdec_jax.layers.dense import narrow_weights
from magicdec_jax.training import distill, distill_feature


def training_text(tok, a) -> tuple[np.ndarray, np.ndarray, list]:
  """(training ids, [n, seq_len] training windows, held-out windows)."""
  train = np.asarray(textdata.shakespeare_prompt(tok, a.train_tokens), np.int32)
  n = len(train) // a.seq_len
  held = textdata.shakespeare_prompts(tok, a.eval_windows, a.eval_tokens, held_out=True)
  return train, train[:n * a.seq_len].reshape(n, a.seq_len), held


def heldout(tok, a, train: np.ndarray, held: list, metric: str) -> dict:
  """The held-out windows' record: which plays the training text and they come from (asserted apart)."""
  plays = textdata.play_paths()
  train_chars, held_chars = len(tok.decode(train.tolist())), sum(len(tok.decode(w)) for w in held)
  cum, n_train = 0, 0
  while cum < train_chars:
    cum, n_train = cum + len(textdata.play_text(n_train)), n_train + 1
  cum, n_held = 0, 0
  while cum < held_chars:
    cum, n_held = cum + len(textdata.play_text(len(plays) - 1 - n_held)), n_held + 1
  assert n_train + n_held <= len(plays), "training text overlaps the held-out plays"
  return {"windows": a.eval_windows, "tokens_each": a.eval_tokens, "sink": 4, "window": 256, "source":
          f"textdata held_out=True: the last {n_held} play(s) of {len(plays)} ({plays[-1].name}); training text: "
          f"the first {n_train} play(s)", "metric": metric}


def train_model(a, target, env) -> dict:
  train, data, held = training_text(target.tokenizer, a)
  cfg = distill.DistillConfig(steps=a.steps, lr=a.lr, warmup_steps=a.warmup, batch=a.batch, seq_len=a.seq_len,
                              loss=a.loss, checkpoint_every=a.eval_every, eval_every=a.eval_every, sink=4, window=256)
  t0, c0 = time.perf_counter(), time.process_time()
  _, history = distill.distill(target, distill.init_draft(target, layers=a.layers), data, a.out_dir, cfg,
                               eval_windows=held)
  return {"benchmark": "distill_smollm2", "env": env, "draft": f"first {a.layers} layers + final norm + tied head, "
          "all params trained", "loss": a.loss, "config": vars(a), "distill_config": cfg.__dict__,
          "train_windows": len(data), "train_tokens": len(data) * a.seq_len,
          "heldout": heldout(target.tokenizer, a, train, held, "teacher-forced greedy per-token acceptance at "
                             "positions >= sink + window"),
          "acceptance_untrained": history[0]["acceptance"] if history and history[0]["step"] == 0 else None,
          "acceptance_final": history[-1]["acceptance"] if history else None, "curve": history,
          "wall_s": round(time.perf_counter() - t0, 1), "process_cpu_s": round(time.process_time() - c0, 1)}


def train_feature(a, target, env) -> dict:
  t0 = time.perf_counter()
  train, data, held = training_text(target.tokenizer, a)
  cfg = distill_feature.FeatureDistillConfig(
      steps=a.steps, lr=a.lr, warmup_steps=a.warmup, batch=a.batch, seq_len=a.seq_len, ttt=a.ttt,
      checkpoint_every=a.eval_every, eval_every=a.eval_every, sink=4, window=256, compute=a.compute)
  vocab = feature_head.frequent_vocab(data, a.draft_vocab, target.config.vocab_size,
                                     target.config.eos_token_ids or ()) if a.draft_vocab else None
  head, history = distill_feature.train(target, feature_head.init_head(target, vocab=vocab), data, a.out_dir, cfg,
                                        eval_windows=held, stop_after_s=a.max_seconds)
  labels = np.concatenate([np.asarray(w) for w in held])[1:]
  return {"benchmark": "feature_head_smollm2", "env": env,
          "head": {"layers": list(head.layers), "params": int(sum(x.size for x in jax.tree.leaves(head.params)))},
          "config": vars(a), "distill_config": cfg.__dict__, "train_windows": len(data),
          "draft_vocab": None if vocab is None else {"size": len(vocab), "heldout_text_coverage":
                                                     float(np.isin(labels, np.asarray(vocab)).mean())},
          "train_tokens": len(data) * a.seq_len, "finished": os.path.isfile(os.path.join(a.out_dir, feature_head.HEAD_FILE)),
          "heldout": heldout(target.tokenizer, a, train, held, "teacher-forced greedy acceptance per draft depth, "
                             "positions >= sink + window"),
          "curve": history, "train_s_total": history[-1]["train_s"] if history else None,
          "this_call_wall_s": round(time.perf_counter() - t0, 1)}


def time_step(a, target, env) -> dict:
  tok = target.tokenizer
  train = np.asarray(textdata.shakespeare_prompt(tok, a.batch * a.seq_len * (a.repeats + 1) * 2), np.int32)
  data = train[:(len(train) // a.seq_len) * a.seq_len].reshape(-1, a.seq_len)
  vocab = feature_head.frequent_vocab(data, a.draft_vocab, target.config.vocab_size,
                                     target.config.eos_token_ids or ()) if a.draft_vocab else None
  runs = {}
  for compute in distill_feature.COMPUTE_DTYPES:
    cfg = distill_feature.FeatureDistillConfig(steps=1000, batch=a.batch, seq_len=a.seq_len, compute=compute)
    head, opt = feature_head.init_head(target, vocab=vocab), cfg.optimizer()
    params = jax.tree.map(jnp.copy, head.params)
    fn = functools.partial(distill_feature.train_step, cfg=head.config, tcfg=target.config, layers=tuple(head.layers),
                           fcfg=cfg, opt=opt, vocab=head.vocab)
    runs[compute] = {"fn": fn, "params": params, "opt_state": opt.init(params), "times": [], "loss": [],
                     "tparams": target.params if compute == "float32" else narrow_weights(target.params, compute)}

  def one(r, i):
    t = time.perf_counter()
    r["params"], r["opt_state"], m = r["fn"](r["params"], r["opt_state"], r["tparams"],
                                             jnp.asarray(data[(i * a.batch) % len(data):][:a.batch]))
    r["loss"].append(float(jax.device_get(m)["loss"]))
    return time.perf_counter() - t

  first = {c: one(r, 0) for c, r in runs.items()}
  for i in range(1, a.repeats + 1):
    for r in runs.values():
      r["times"].append(one(r, i))
  res = {c: {"median_s": float(np.median(r["times"])), "times_s": [round(x, 3) for x in r["times"]],
             "compile_and_first_s": round(first[c], 2), "loss": [round(x, 4) for x in r["loss"]]}
         for c, r in runs.items()}
  return {"benchmark": "feature_train_step", "env": env, "results": res,
          "shape": {"batch": a.batch, "seq_len": a.seq_len, "ttt": 3, "draft_vocab": None if vocab is None else len(vocab),
                    "layers": list(feature_head.default_layers(target.config.num_layers))},
          "speedup_bfloat16_over_float32": res["float32"]["median_s"] / res["bfloat16"]["median_s"]}


SMOKE = dict(steps=2, batch=2, seq_len=32, train_tokens=2048, eval_windows=1, eval_tokens=300, eval_every=1,
             layers=1, repeats=2, max_seconds=600.0, draft_vocab=64)


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny target (byte tokenizer), 2 steps, tiny shapes, a temporary out_dir",
                     output="json")
  ap.add_argument("kind", choices=("model", "feature", "step"))
  for name, typ, default in (("steps", int, None), ("batch", int, 4), ("seq_len", int, 256), ("lr", float, None),
                             ("warmup", int, None), ("eval_every", int, None), ("eval_windows", int, 2),
                             ("eval_tokens", int, 1024), ("train_tokens", int, 400_000), ("repeats", int, 5),
                             ("layers", int, 8), ("ttt", int, 3), ("max_seconds", float, 420.0), ("out_dir", str, None),
                             ("draft_vocab", int, None)):
    ap.add_argument(f"--{name}", type=typ, default=default)
  ap.add_argument("--loss", default="kl", choices=distill.LOSSES)
  ap.add_argument("--compute", default="float32", choices=distill_feature.COMPUTE_DTYPES)
  a = common.parse(ap, argv, **SMOKE)
  if a.smoke and a.out_dir is None:
    a.out_dir = tempfile.mkdtemp(prefix=f"train-{a.kind}-smoke-")
  defaults = {"model": dict(steps=200, lr=6e-4, warmup=20, eval_every=25, out_dir="/tmp/distill_smollm2", draft_vocab=0),
              "feature": dict(steps=400, lr=1e-3, warmup=10, eval_every=50, out_dir="out/feature_head_smollm2",
                              draft_vocab=0),
              "step": dict(draft_vocab=8192)}[a.kind]
  for k, v in defaults.items():
    if getattr(a, k) is None:
      setattr(a, k, v)
  target, source = common.model(a.smoke)
  run = {"model": train_model, "feature": train_feature, "step": time_step}[a.kind]
  out = run(a, target, common.env_info())
  out["target"] = f"{source} (float32)"
  name = {"model": f"distill_smollm2_{a.loss}", "feature": "feature_head_smollm2", "step": "feature_train_step"}[a.kind]
  common.finish(out, common.output_path(a.json, name))


if __name__ == "__main__":
  main()
