"""Prefill at the compute floor? SmolLM2-135M chunked prefill: tokens/s and FLOP rate vs a large matmul.

In one run: (1) a large float32 matmul's FLOP rate (the floor's yardstick, same process, same moment);
(2) the engine's prefill (`loop.prefill`: causal triangle only, block by block); (3) unless --skip-old, the
previous prefill rule reproduced here (every chunk attends over every cache slot under a mask, the
decode-time PrefixTree rule) on the same prompts. Useful FLOPs count the matmuls (2 x matmul params x
tokens; no LM head: prefill computes no logits) and causal attention (4 x heads x head_dim x P(P+1)/2 per row
and layer); masked-out work is not useful. Medians of --repeats runs after one compiling run; JSON.

  python benchmarks/prefill_bench.py --shape 8x4096
  python benchmarks/prefill_bench.py --smoke
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from magicdec_jax import loop  # noqa: E402
from magicdec_jax import testing
from magicdec_jax.tuning import costmodel
from magicdec_jax.cache import KVCache, aligned_slots  # noqa: E402
from magicdec_jax.layers.attention import PrefixTree  # noqa: E402
from magicdec_jax.model import forward  # noqa: E402
from magicdec_jax.trees import Tree  # noqa: E402


@functools.partial(jax.jit, static_argnames=("cfg", "num_slots", "chunk"))
def old_prefill(params, tokens, *, cfg, num_slots: int, chunk: int):
  """The previous rule: chunk c attends over all `num_slots` slots, masked to slots < its own position."""
  b, p = tokens.shape
  anc = jnp.tril(jnp.ones((chunk, chunk), bool))

  def body(cache, c):
    start = c * chunk
    toks = jax.lax.dynamic_slice_in_dim(tokens, start, chunk, axis=1)
    pos = jnp.broadcast_to(start + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
    _, cache = forward(params, cfg, toks, pos, cache, pos, PrefixTree(jnp.full((b,), start, jnp.int32), anc),
                       compute_logits=False)
    return cache, None

  return jax.lax.scan(body, KVCache.zeros(cfg, b, num_slots), jnp.arange(p // chunk))[0]


def useful_flops(cfg, batch: int, p: int) -> float:
  matmul = 2.0 * (costmodel.matmul_params(cfg) - cfg.vocab_size * cfg.hidden_size) * batch * p
  attention = 4.0 * cfg.num_heads * cfg.head_dim * p * (p + 1) / 2 * cfg.num_layers * batch
  return matmul + attention


def matmul_rate(n: int, repeats: int) -> float:
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST))
  med, _ = common.median_time(lambda: f(a, a), repeats)
  return 2.0 * n ** 3 / med


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--shape", type=common.shape_list, default=[(8, 4096)])
  ap.add_argument("--chunk", type=int, default=256)
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--matmul-n", type=int, default=2048)
  ap.add_argument("--skip-old", action="store_true", help="do not time the previous rule")
  ap.add_argument("--output", default=None)
  ap.add_argument("--smoke", action="store_true", help="random tiny model, tiny shape (checks the script)")
  args = ap.parse_args(argv)
  if args.smoke:
    args.shape, args.chunk, args.matmul_n = [(2, 64)], 16, 256
    model, source = testing.random_tiny_model(0), "random-tiny"
  else:
    model, source = common.load_smollm(allow_random=False)
  (b, p), = args.shape
  cfg, params = model.config, model.params
  out = args.output or str(common.RESULTS_DIR / f"prefill_bench_{common.device_tag()}.json")
  tokens = jax.random.randint(jax.random.key(0), (b, p), 0, cfg.vocab_size, jnp.int32)
  lengths = jnp.full((b,), p, jnp.int32)
  num_slots = aligned_slots(p + 256)
  flops = useful_flops(cfg, b, p)
  doc = {"benchmark": "prefill_bench", "env": common.env_info(), "model": source, "dtype": cfg.dtype,
         "batch": b, "prompt_tokens": p, "chunk": args.chunk, "useful_flops": flops}
  rate_before = matmul_rate(args.matmul_n, 5)
  new = lambda: loop.prefill(params, None, tokens, lengths, cfg=cfg, spec=None, tree=Tree((-1,)),
                             num_slots=num_slots, chunk=args.chunk)[0].k[-1]
  med, times = common.median_time(new, args.repeats)
  doc["engine"] = {"median_s": med, "times": times, "tokens_per_s": b * p / med, "flop_rate": flops / med}
  print(f"engine prefill {b}x{p}: {med:.1f}s, {b * p / med:.0f} tokens/s, {flops / med / 1e9:.1f} GFLOP/s useful",
        flush=True)
  if not args.skip_old:
    old = lambda: old_prefill(params, tokens, cfg=cfg, num_slots=num_slots, chunk=args.chunk).k[-1]
    med_old, times_old = common.median_time(old, args.repeats)
    doc["previous_rule"] = {"median_s": med_old, "times": times_old, "tokens_per_s": b * p / med_old,
                            "flop_rate": flops / med_old}
    doc["speedup_over_previous"] = med_old / med
    print(f"previous rule: {med_old:.1f}s, {b * p / med_old:.0f} tokens/s -> engine {med_old / med:.2f}x", flush=True)
  rate_after = matmul_rate(args.matmul_n, 5)
  rate = max(rate_before, rate_after)      # the yardstick: the faster of the two (the conservative share)
  doc["matmul"] = {"n": args.matmul_n, "flop_rate": rate, "before": rate_before, "after": rate_after}
  doc["engine"]["share_of_matmul_rate"] = doc["engine"]["flop_rate"] / rate
  doc["env"]["loadavg_end"] = list(os.getloadavg())
  print(f"large matmul {rate / 1e9:.1f} GFLOP/s: engine prefill at {doc['engine']['share_of_matmul_rate']:.2f} of it")
  with open(out, "w") as f:
    json.dump(doc, f, indent=1)
  print(json.dumps({"output": out}))


if __name__ == "__main__":
  main()
