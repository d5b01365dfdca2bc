"""Distil an 8-layer draft of SmolLM2-135M (its first 8 layers) on Shakespeare with the target as teacher.

  nice -n 10 python -m benchmarks.distill_smollm2 --steps=200 --batch=4 --seq_len=256 --loss=kl

Training text: the plays in textdata order from the front (`shakespeare_prompt`, tokens 0 .. N); held-out
text: `held_out=True` windows (plays read from the other end), which the training tokens never reach
(checked below). The held-out metric is the draft's greedy per-token acceptance with a StreamingLLM cache
(sink 4 + window 256) against the full-attention target, teacher-forced (acceptance.profile, W=1), at
positions past sink + window where the window really cuts. Writes
benchmarks/results/distill_smollm2_<loss>_<device>_<date>.json with the curve (acceptance vs steps), wall
and CPU seconds, and the environment record.
"""
from __future__ import annotations

import json
import time

from benchmarks import common
from magicdec_jax import checkpoints, textdata
from magicdec_jax.training import distill


def main(argv=None):
  ap = common.parser(__doc__, smoke=None, output="json")
  common.add_training_flags(ap, steps=200, lr=6e-4, warmup=20, eval_every=25)
  ap.add_argument("--loss", default="kl", choices=distill.LOSSES)
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--out_dir", default="/tmp/distill_smollm2")
  a = common.parse(ap, argv)
  env = common.env_info()
  t0, c0 = time.perf_counter(), time.process_time()
  target = checkpoints.load_model("smollm2-135m", dtype="float32")
  tok = target.tokenizer
  train, data, held = common.training_text(tok, a)
  n = len(data)
  # the held-out windows come from the other end of the play list: count the plays training reaches
  plays = textdata.play_paths()
  train_plays, held_plays = common.play_split(tok, train, len(tok.decode(held[-1])) * a.eval_windows)
  draft = distill.init_draft(target, layers=a.layers)
  cfg = distill.DistillConfig(steps=a.steps, lr=a.lr, warmup_steps=a.warmup, batch=a.batch, seq_len=a.seq_len,
                              loss=a.loss, checkpoint_every=a.eval_every, eval_every=a.eval_every,
                              sink=4, window=256)
  model, history = distill.distill(target, draft, data, a.out_dir, cfg, eval_windows=held)
  wall, cpu = time.perf_counter() - t0, time.process_time() - c0
  out = {
      "benchmark": "distill_smollm2", "env": env,
      "target": "smollm2-135m (GGUF Q4_1 dequantized, float32)", "draft": f"first {a.layers} layers + final "
      "norm + tied head, all params trained", "loss": a.loss, "config": vars(a),
      "distill_config": cfg.__dict__, "train_windows": int(n), "train_tokens": int(n * a.seq_len),
      "heldout": {"windows": a.eval_windows, "tokens_each": a.eval_tokens, "sink": 4, "window": 256,
                  "source": f"textdata held_out=True: the last {held_plays} play(s) of {len(plays)} "
                            f"({plays[-1].name}); training text: the first {train_plays} play(s)",
                  "metric": "teacher-forced greedy per-token acceptance (draft argmax == target argmax) at "
                            "positions >= sink + window, draft with StreamingLLM attention"},
      "acceptance_untrained": history[0]["acceptance"] if history and history[0]["step"] == 0 else None,
      "acceptance_final": history[-1]["acceptance"] if history else None,
      "curve": history, "wall_s": round(wall, 1), "process_cpu_s": round(cpu, 1),
      "note": "wall and CPU seconds include model load, compile and held-out evaluations; each curve point's "
              "wall_s counts from the start of training; load averages at start and end are in env.",
  }
  path = common.write_json(out, common.output_path(a.json, f"distill_smollm2_{a.loss}"))
  print(json.dumps({k: out[k] for k in ("acceptance_untrained", "acceptance_final", "wall_s", "process_cpu_s")}))
  print(path)


if __name__ == "__main__":
  main()
