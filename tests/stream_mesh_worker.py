"""Subprocess for test_stream.py: generate_stream on 4 CPU devices (meshes data:2,model:2 and data:4,model:1)
vs single-device `generate`. Prints one line `RESULT {json}`: per mesh and case, whether every sample's
tokens equal the reference, and the slot utilization; whether a chain's and a tree's log-probabilities on
data:2,model:2 are plain decoding's on that mesh bit for bit."""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]      # this checkout's magicdec_jax, and conftest

import jax  # noqa: E402

from magicdec_jax import sharding, trees  # noqa: E402
from magicdec_jax.drafts import StreamingDraft  # noqa: E402
from magicdec_jax.generation import generate  # noqa: E402
from magicdec_jax.stream import generate_stream  # noqa: E402

from conftest import random_prompts, tiny_model  # noqa: E402


def main():
  model = tiny_model(0, attn_scale=10.0)
  prompts = random_prompts((5, 9, 3, 12, 7, 14), 64, seed=1)
  cases = {"ar-sampling": dict(temperature=0.9),
           "chain-greedy": dict(draft=StreamingDraft(sink=2, window=4), gamma=3),
           "chain-sampling": dict(draft=StreamingDraft(sink=2, window=4), gamma=2, temperature=0.9)}
  out = {"devices": jax.device_count()}
  for spec in ("data:2,model:2", "data:4,model:1"):
    mesh = sharding.make_mesh(spec)
    placed = sharding.shard_model(model, mesh)
    for name, kw in cases.items():
      kw = dict(kw, max_new_tokens=10, seed=5)
      ref = generate(model, prompts, **kw).tokens
      g = generate_stream(placed, prompts, batch_size=4, refill_at=1, mesh=mesh, **kw)
      got = {r.index: r.tokens for r in g}
      out[f"{spec}/{name}"] = {"equal": [got[i] == ref[i] for i in range(len(prompts))],
                               "utilization": g.stats["slot_utilization"]}
  # fixed-shape numerics with a data axis (rows split over it): a chain's and a tree's log-probabilities
  # are plain decoding's bits on the same mesh
  mesh = sharding.make_mesh("data:2,model:2")
  kw = dict(max_new_tokens=6, eos_token_id=[], logprobs=True, mesh=mesh)
  lp = {name: generate(tiny_model(0), random_prompts((14, 20, 17), 64, seed=0), **kw, **d).logprobs for name, d in (
      ("ar", {}), ("chain", dict(draft=StreamingDraft(sink=2, window=4), gamma=2)),
      ("tree", dict(draft=StreamingDraft(sink=2, window=4), tree=trees.default_tree("sequoia16"))))}
  out["bitwise"] = {name: v == lp["ar"] for name, v in lp.items()}
  print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
  main()
