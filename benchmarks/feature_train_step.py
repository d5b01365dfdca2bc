"""Time one feature-head training step (distill_feature.train_step) in float32 and bfloat16 compute.

  python -m benchmarks.feature_train_step --batch=4 --seq_len=256 --draft_vocab=8192 --repeats=5

SmolLM2-135M (float32 weights), the head the README trains (layers 2, 15, 29, ttt 3, a draft vocabulary
of the N most frequent ids of Shakespeare). The two settings are timed alternately, one step each per
repeat, so a drifting machine affects both alike; each setting's params advance step by step (a real
training run, not one cached batch). Prints and writes JSON: medians, all times, compile seconds and the
ratio measured in this run. bfloat16 compute multiplies bfloat16 copies of the target's and the head's
matrices (float32 accumulation, float32 master weights); on CPUs with AMX / AVX512-BF16 XLA's bfloat16
dots run several times faster than float32 ones.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import checkpoints, feature_head, textdata
from magicdec_jax.training import distill_feature
from magicdec_jax.layers.dense import narrow_weights


def main(argv=None):
  ap = common.parser(__doc__, smoke=None, output="json")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq_len", type=int, default=256)
  ap.add_argument("--draft_vocab", type=int, default=8192, help="0: the target's whole vocabulary")
  ap.add_argument("--repeats", type=int, default=5)
  a = common.parse(ap, argv)
  env = common.env_info()
  target = checkpoints.load_model("smollm2-135m", dtype="float32")
  tok = target.tokenizer
  train = np.asarray(textdata.shakespeare_prompt(tok, a.batch * a.seq_len * (a.repeats + 1) * 2), np.int32)
  data = train[:(len(train) // a.seq_len) * a.seq_len].reshape(-1, a.seq_len)
  vocab = feature_head.frequent_vocab(data, a.draft_vocab, target.config.vocab_size,
                                     target.config.eos_token_ids or ()) if a.draft_vocab else None
  runs = {}
  for compute in distill_feature.COMPUTE_DTYPES:
    cfg = distill_feature.FeatureDistillConfig(steps=1000, batch=a.batch, seq_len=a.seq_len, compute=compute)
    head = feature_head.init_head(target, vocab=vocab)
    opt = cfg.optimizer()
    params = jax.tree.map(jnp.copy, head.params)
    tparams = target.params if compute == "float32" else narrow_weights(target.params, compute)
    fn = functools.partial(distill_feature.train_step, cfg=head.config, tcfg=target.config,
                           layers=tuple(head.layers), fcfg=cfg, opt=opt, vocab=head.vocab)
    runs[compute] = {"fn": fn, "params": params, "opt_state": opt.init(params), "tparams": tparams,
                     "times": [], "loss": []}

  def one(r, i):
    batch = jnp.asarray(data[(i * a.batch) % len(data):][:a.batch])
    t = time.perf_counter()
    r["params"], r["opt_state"], m = r["fn"](r["params"], r["opt_state"], r["tparams"], batch)
    m = jax.device_get(m)
    r["loss"].append(float(m["loss"]))
    return time.perf_counter() - t

  for r in runs.values():
    r["compile_and_first_s"] = one(r, 0)
  for i in range(1, a.repeats + 1):
    for r in runs.values():
      r["times"].append(one(r, i))
  out = {
      "benchmark": "feature_train_step", "env": env,
      "target": "smollm2-135m (GGUF dequantized, float32)",
      "shape": {"batch": a.batch, "seq_len": a.seq_len, "ttt": 3, "layers": list(feature_head.default_layers(
          target.config.num_layers)), "draft_vocab": None if vocab is None else len(vocab)},
      "method": "one step of each setting alternately per repeat; seconds per step incl. the host fetch of "
                "the metrics; compile_and_first_s is the first call",
      "results": {c: {"median_s": float(np.median(r["times"])), "times_s": [round(x, 3) for x in r["times"]],
                      "compile_and_first_s": round(r["compile_and_first_s"], 2),
                      "loss": [round(x, 4) for x in r["loss"]]} for c, r in runs.items()},
  }
  out["speedup_bfloat16_over_float32"] = out["results"]["float32"]["median_s"] / out["results"]["bfloat16"]["median_s"]
  print(common.finish(out, common.output_path(a.json, "feature_train_step")))


if __name__ == "__main__":
  main()
