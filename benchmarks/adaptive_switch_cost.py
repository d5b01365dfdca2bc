"""Adaptive speculation's two designs: a `lax.switch` of whole rounds inside one while_loop vs one executable
per variant (loop.decode(variant=i), what schedule.run re-enters). Seconds per round decoding 128 new tokens,
SmolLM2-135M, batch 8, prompt 1024, StreamingDraft(4, 256), greedy, the schedule at gamma 2 for every round
(both loops sized for variants plain / 1 / 2 / 3), min of 3 timed runs after one compiling run.

  python -m benchmarks.adaptive_switch_cost     # ~8 min on the 2-core CPU; JSON under benchmarks/results/
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import loop
from magicdec_jax import schedule as S
from magicdec_jax.cache import aligned_slots
from magicdec_jax.drafts import StreamingDraft
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree

B, P, NEW = 8, 1024, 128
model, _ = common.load_smollm()
cfg, params = model.config, model.params
spec = StreamingDraft(sink=4, window=256)
variants = (Tree((-1,)), Tree.chain(1), Tree.chain(2), Tree.chain(3))
wide = variants[-1]
toks = jnp.asarray(np.asarray(common.text_prompts(model, B, P, cfg.vocab_size, seed=1, held_out=True)[0], np.int32))
lengths = jnp.full((B,), P, jnp.int32)
num_slots = aligned_slots(P + NEW + wide.num_nodes + 1)
at, var = S.thresholds([(0, 2)])

@functools.partial(jax.jit, static_argnames=("variants",), donate_argnames=("state",))
def switch_decode(tp, state, variants):
  max_rounds = state.out.shape[1]
  branches = [functools.partial(loop._round, target_params=tp, draft_params=None, cfg=cfg, spec=spec, tree=t,
                                sampling=Sampling(), impl="xla") for t in variants]
  def cond(s):
    return (s.done.sum() < s.refill_at) & (s.rounds.max() < max_rounds)
  def body(s):
    ctx = S.context(s.lengths, s.done); v = S.pick(s.sched, ctx)
    s = s.replace(sched=S.record(s.sched, v, ctx, s.step))
    return jax.lax.switch(v, branches, s)
  return jax.lax.while_loop(cond, body, state)

def fresh():
  target, ring = loop.prefill(params, None, toks, lengths + 0, cfg=cfg, spec=spec, tree=wide, num_slots=num_slots, chunk=256)
  st = loop.initial_state(toks, lengths + 0, jnp.full((B,), NEW, jnp.int32), jnp.array([-1], jnp.int32),
                          jax.random.split(jax.random.key(0), B), target, ring, NEW + wide.num_nodes, wide, 4)
  return st.replace(sched=S.with_thresholds(st.sched, at, var))

runs = {"switch": lambda st: switch_decode(params, st, variants),
        "reentry": lambda st: loop.decode(params, None, st, cfg=cfg, spec=spec, tree=wide, sampling=Sampling(),
                                          variants=variants, variant=2)}


def main(argv=None) -> None:
  args = common.parse(common.parser(__doc__, smoke=None), argv)
  doc = {"benchmark": "adaptive_switch_cost", "env": common.env_info(), "command": common.command(),
         "model": "gguf:smollm2-135m", "batch": B, "prompt": P, "new": NEW,
         "draft": {"kind": "StreamingDraft", "sink": 4, "window": 256}, "greedy": True,
         "variants": ["plain", "gamma=1", "gamma=2", "gamma=3"], "schedule": "gamma=2 every round"}
  outs = {}
  for name, fn in runs.items():
    jax.block_until_ready(fn(fresh()).out)     # compile
    ts = []
    for _ in range(3):
      st = fresh(); jax.block_until_ready(st)
      t0 = time.perf_counter(); r = fn(st); jax.block_until_ready(r.out); ts.append(time.perf_counter() - t0)
    outs[name] = np.asarray(r.out)
    doc[name] = {"decode_s": ts, "rounds": int(r.step), "s_per_round": min(ts) / int(r.step)}
    print(name, doc[name], flush=True)
  doc["identical_tokens"] = bool((outs["switch"] == outs["reentry"]).all())
  doc["switch_over_reentry_per_round"] = doc["switch"]["s_per_round"] / doc["reentry"]["s_per_round"]
  common.finish(doc, args.output, f"adaptive_switch_cost_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
