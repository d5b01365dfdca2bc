"""Train an EAGLE-style feature head (FeatureDraft) for SmolLM2-135M on Shakespeare, in resumable chunks.

  flock /tmp/magicdec_cpu.lock python -m benchmarks.feature_head_smollm2 --steps=400 --max_seconds=420

Each call trains until `--max_seconds` have passed (checkpointing), so a 30-minute run is a few calls,
each resuming from the orbax checkpoint in --out_dir (other work can use the CPU in between). Training
text: the plays in textdata order from the front; held-out: `held_out=True` windows (the last play(s)),
which the training tokens never reach (checked). The held-out metric is the head's teacher-forced greedy
acceptance at draft depth 1, 2, 3 (distill_feature.heldout_acceptance: sink 4 + window 256, positions
>= sink + window). Writes benchmarks/results/feature_head_smollm2_<device>_<date>.json after every call
(`finished` says whether all steps are done); `train_s` sums the steps' seconds over every call,
compilation excluded.
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from benchmarks import common
from magicdec_jax import checkpoints, feature_head, textdata
from magicdec_jax.training import distill_feature


def main(argv=None):
  ap = common.parser(__doc__, smoke=None, output="json")
  common.add_training_flags(ap, steps=400, lr=1e-3, warmup=10, eval_every=50)
  ap.add_argument("--ttt", type=int, default=3)
  ap.add_argument("--max_seconds", type=float, default=420.0, help="stop this call after this long")
  ap.add_argument("--out_dir", default="out/feature_head_smollm2")
  ap.add_argument("--draft_vocab", type=int, default=0, help="the head's own vocabulary: the N most frequent "
                  "ids of the training text + EOS (0: the target's)")
  ap.add_argument("--compute", default="float32", choices=distill_feature.COMPUTE_DTYPES,
                  help="precision of the target's pass and the head's matmuls during training")
  a = common.parse(ap, argv)
  env = common.env_info()
  t0 = time.perf_counter()
  target = checkpoints.load_model("smollm2-135m", dtype="float32")
  tok = target.tokenizer
  train, data, held = common.training_text(tok, a)
  n = len(data)
  train_plays, held_plays = common.play_split(tok, train, sum(len(tok.decode(w)) for w in held))
  cfg = distill_feature.FeatureDistillConfig(
      steps=a.steps, lr=a.lr, warmup_steps=a.warmup, batch=a.batch, seq_len=a.seq_len, ttt=a.ttt,
      checkpoint_every=a.eval_every, eval_every=a.eval_every, sink=4, window=256, compute=a.compute)
  vocab = feature_head.frequent_vocab(data, a.draft_vocab, target.config.vocab_size,
                                     target.config.eos_token_ids or ()) if a.draft_vocab else None
  head = feature_head.init_head(target, vocab=vocab)
  held_labels = np.concatenate([np.asarray(w) for w in held])[1:]      # held-out text (greedy labels aside)
  head, history = distill_feature.train(target, head, data, a.out_dir, cfg, eval_windows=held,
                                        stop_after_s=a.max_seconds)
  finished = os.path.isfile(os.path.join(a.out_dir, feature_head.HEAD_FILE))
  plays = textdata.play_paths()
  out = {
      "benchmark": "feature_head_smollm2", "env": env,
      "target": "smollm2-135m (GGUF dequantized, float32)",
      "head": {"layers": list(head.layers), "params": int(sum(x.size for x in jax.tree.leaves(head.params))),
               "what": "fuse(3 x 576 -> 576) + fc(2 x 576 -> 576) + one SmolLM2 decoder layer + norm; the "
                       "target's frozen tied embedding / LM head" if vocab is None else
                       "fuse + fc + one SmolLM2 decoder layer + norm + its own LM head over the draft "
                       "vocabulary (initialised from the target's tied embedding rows)"},
      "config": vars(a), "distill_config": cfg.__dict__, "train_windows": int(n),
      "draft_vocab": None if vocab is None else {
          "size": len(vocab), "chosen": "most frequent ids of the training text + EOS",
          "heldout_text_coverage": float(np.isin(held_labels, np.asarray(vocab)).mean())},
      "train_tokens": int(n * a.seq_len), "finished": finished,
      "heldout": {"windows": a.eval_windows, "tokens_each": a.eval_tokens, "sink": 4, "window": 256,
                  "source": f"textdata held_out=True: the last {held_plays} play(s) of {len(plays)} "
                            f"({plays[-1].name}); training text: the first {train_plays} play(s)",
                  "metric": "teacher-forced greedy acceptance per draft depth (head argmax == target argmax "
                            "for token t+2; depth k reads its own features for k-1 steps), positions >= "
                            "sink + window"},
      "curve": history,
      "train_s_total": history[-1]["train_s"] if history else None,
      "this_call_wall_s": round(time.perf_counter() - t0, 1),
  }
  path = common.write_json(out, common.output_path(a.json, "feature_head_smollm2"))
  print(json.dumps({"finished": finished, "last": history[-1] if history else None}))
  print(path)


if __name__ == "__main__":
  main()
