"""Does a round of the compiled loop cost the sum of its steps? SmolLM2-135M, StreamingDraft, CPU or GPU.

For each batch x context: the in-loop time of an AR step and of a gamma round (loop.decode over a zero-filled
cache, `--rounds` rounds) next to the same steps timed alone (`calibrate.time_step`: the target's forward of 1
and gamma+1 tokens, the draft's of 1 token over its sink + window ring). ratio = in-loop / (gamma * draft +
verify); well above 1, the loop body does work no step explains (tests/model/test_hlo_no_copies.py checks its
HLO for copies). Medians of `--repeats` runs.

  python -m benchmarks.steps.round_cost --shapes 8x4096,4x8000 --gammas 3
  python -m benchmarks.steps.round_cost --smoke       # random tiny model, seconds
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import common
from magicdec_jax import drafts, loop
from magicdec_jax.drafts import Prefill
from magicdec_jax.measure import calibrate
from magicdec_jax.cache import KVCache, aligned_slots
from magicdec_jax.layers.dense import narrow_weights
from magicdec_jax.plan import numerics_options
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree


def in_loop_round_s(model, batch: int, context: int, spec, tree: Tree, rounds: int, repeats: int,
                    draft_params=None) -> dict:
  """Median seconds per round of loop.decode (compiled once) over a zero cache of `context` tokens."""
  cfg, params = model.config, model.params
  slots = aligned_slots(context + rounds * tree.num_nodes + tree.num_nodes + 1)
  dcfg = loop.draft_config(cfg)
  ring_fn = jax.jit(lambda t, l: spec.prefill_ring(spec.empty_ring(dcfg, batch, tree, slots), Prefill(
      params, draft_params, dcfg, t, jnp.ones((batch, context), jnp.int32), l, tree, context)))

  def state():
    lengths = jnp.full((batch,), context, jnp.int32)
    target = KVCache.zeros(cfg, batch, slots)
    ring = ring_fn(target, lengths) if spec is not None else None
    s = loop.initial_state(jnp.ones((batch, context), jnp.int32), lengths, jnp.full((batch,), rounds, jnp.int32),
                           jnp.array([-1], jnp.int32), jax.random.split(jax.random.key(0), batch), target, ring,
                           rounds + tree.num_nodes, tree)
    return jax.block_until_ready(jax.tree.map(jnp.copy, s))   # XLA:CPU may share equal leaves: donated once each

  t0 = time.perf_counter()
  comp = loop.decode.lower(params, draft_params, state(), cfg=cfg, spec=spec, tree=tree, sampling=Sampling()).compile(
      compiler_options=numerics_options(cfg) or None)   # the engine's decode options for these numerics
  compile_s = time.perf_counter() - t0
  per_round = []
  for _ in range(repeats):
    s = state()
    t0 = time.perf_counter()
    out = comp(params, draft_params, s)
    jax.block_until_ready(out.out)
    per_round.append((time.perf_counter() - t0) / int(out.step))
  return {"median_s": statistics.median(per_round), "times": per_round, "compile_s": compile_s}


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--shapes", type=common.shape_list, default=[(8, 4096), (4, 8000)])
  ap.add_argument("--gammas", type=common.int_list, default=[3])
  common.flags(ap, sink=4, window=256, repeats=3)
  ap.add_argument("--draft_weights", choices=["none", "bfloat16"], default="none",
                  help="the self-draft's weights: the target's own, or a bfloat16 copy (the demo's draft)")
  ap.add_argument("--rounds", type=int, default=24, help="rounds per in-loop run")
  ap.add_argument("--numerics", choices=["fast", "invariant"], default="fast",
                  help="the target's numerics (layers/invariant.py); drafts always compute fast")
  args = common.parse(ap, argv, shapes=[(2, 64)], gammas=[2], window=16, rounds=4, repeats=1)
  model, source = common.model(args.smoke)
  model = dataclasses.replace(model, config=dataclasses.replace(model.config, numerics=args.numerics))
  out_path = common.output_path(args.output, "round_cost")
  weights = None if args.draft_weights == "none" else args.draft_weights
  spec = drafts.StreamingDraft(args.sink, args.window, weights=weights)
  doc = common.record("round_cost", source, model.config.dtype, numerics=args.numerics,
                      draft=dict(kind="StreamingDraft", sink=args.sink, window=args.window, weights=weights), rows=[])
  cfg, params = model.config, model.params
  draft_params = narrow_weights(params, weights) if weights else None
  for b, n in args.shapes:
    iso = lambda t: calibrate.time_step(params, cfg, b, n, t, "linear", repeats=args.repeats + 2,
                                        options=numerics_options(cfg))
    ar_alone = iso(1)
    ar_loop = in_loop_round_s(model, b, n, None, Tree((-1,)), args.rounds, args.repeats)
    draft = calibrate.time_step(draft_params or params, loop.draft_config(cfg), b, args.sink + args.window, 1,
                                "ring", repeats=args.repeats + 2)
    row = {"batch": b, "context": n, "ar_alone_s": ar_alone["median_s"], "ar_alone_min_s": ar_alone["seconds"],
           "ar_in_loop_s": ar_loop["median_s"], "ar_ratio": ar_loop["median_s"] / ar_alone["median_s"],
           "draft_alone_s": draft["median_s"], "gammas": []}
    for g in args.gammas:
      verify = iso(g + 1)
      rnd = in_loop_round_s(model, b, n, spec, Tree.chain(g), args.rounds, args.repeats, draft_params)
      parts = g * draft["median_s"] + verify["median_s"]
      row["gammas"].append({"gamma": g, "verify_alone_s": verify["median_s"], "sum_of_steps_s": parts,
                            "round_in_loop_s": rnd["median_s"], "ratio": rnd["median_s"] / parts,
                            "round_times": rnd["times"], "loop_compile_s": rnd["compile_s"]})
      print(f"{b}x{n} gamma {g}: round {1e3 * rnd['median_s']:.1f} ms in the loop vs {1e3 * parts:.1f} ms of "
            f"steps ({g} x draft {1e3 * draft['median_s']:.1f} + verify {1e3 * verify['median_s']:.1f}): "
            f"{rnd['median_s'] / parts:.2f}x", flush=True)
    print(f"{b}x{n} AR: {1e3 * ar_loop['median_s']:.1f} ms in the loop vs {1e3 * ar_alone['median_s']:.1f} alone",
          flush=True)
    doc["rows"].append(row)
    common.write_json(doc, out_path)
  common.finish(doc, out_path)


if __name__ == "__main__":
  main()
