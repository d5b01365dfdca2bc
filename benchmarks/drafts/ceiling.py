"""How much can any imperfect draft agree with the target's greedy choice on this text? SmolLM2-135M, CPU.

On the held-out windows the feature head is scored on, the target's full forward gives its top-1 probability,
how often its top-1 is within a factor of its top-2, how often the target without its last k layers
(`truncate_layers`) picks the same argmax, and (`--head-dir`) how many argmaxes a head's draft vocabulary holds.

  python -m benchmarks.drafts.ceiling --head-dir out/fh_bf16
  python -m benchmarks.drafts.ceiling --smoke       # random tiny model, seconds
"""
from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import drafts, textdata
from magicdec_jax.model import full_forward


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny model, random ids")
  common.flags(ap, windows=2, tokens=1024)
  ap.add_argument("--drop", type=common.int_list, default=[1, 2, 4], help="top layers removed")
  ap.add_argument("--head-dir", default=None, help="a feature head (its feature_head.json's vocab)")
  args = common.parse(ap, argv, windows=2, tokens=64, drop=[1])
  model, source = common.model(args.smoke)
  windows = (np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 64)).tolist() if args.smoke else
             textdata.shakespeare_prompts(model.tokenizer, args.windows, args.tokens, held_out=True))
  if any(k < 1 or k >= model.config.num_layers for k in args.drop):
    ap.error(f"--drop: each value must be in [1, {model.config.num_layers - 1}]")
  ids = jnp.asarray(windows, jnp.int32)
  logits = np.asarray(full_forward(model.params, model.config, ids)).reshape(-1, model.config.vocab_size)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  top = np.sort(p, -1)
  argmax = logits.argmax(-1)
  doc = common.record(
      "acceptance_ceiling", source, text="random ids" if args.smoke else "shakespeare held-out plays",
      windows=args.windows, tokens=args.tokens, positions=int(argmax.size),
      target_top1_prob={"mean": float(top[:, -1].mean()), "median": float(np.median(top[:, -1]))},
      top1_over_top2_below={str(r): float(np.mean(top[:, -1] / top[:, -2] < r)) for r in (1.25, 1.5, 2.0)},
      truncated_target_agreement={})
  for k in args.drop:
    small = drafts.truncate_layers(model, model.config.num_layers - k)
    other = np.asarray(full_forward(small.params, small.config, ids)).reshape(-1, model.config.vocab_size)
    doc["truncated_target_agreement"][str(k)] = float(np.mean(other.argmax(-1) == argmax))
  if args.head_dir:
    if vocab := common.read_json(os.path.join(args.head_dir, "feature_head.json")).get("vocab"):
      doc["argmax_in_head_vocab"] = float(np.isin(argmax, np.asarray(vocab)).mean())
  common.finish(doc, args.output, f"acceptance_ceiling_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
