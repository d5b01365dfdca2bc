"""Why a verify pass costs more per token than an AR step on CPU: the K-cache layout in the QK product.

Decode attention over all L layers' caches at a decode shape (default SmolLM2-135M at 8 x 4096: 3 KV
heads, 3 query heads each, head_dim 64, float32), for T = 1 (an AR step) and T = 3..5 (a verify of a
gamma 2..4 chain), timed three ways on the same random K/V:
  * `cache_layout`  — the engine's `layers.attention.masked_attention`, K stored [B, K, S, D]: the QK
    product "BKQD,BKSD->BKQS" contracts over K's minor dimension;
  * `kt_layout`     — the same math with K stored transposed [B, K, D, S] ("BKQD,BKDS->BKQS"), a plain
    row-major [Q, D] x [D, S] GEMM;
  * `sq_orientation`— K as stored but the logits computed as [.., S, Q] ("BKSD,BKQD->BKSQ").
Also the QK product alone for both layouts, and a plain read of every K/V buffer (the bandwidth floor).
Outputs must agree to float32 rounding (checked, max abs difference reported). Nothing is estimated:
every figure is a min / median over repeats after a compiling call.

  python -m benchmarks.decode_attention_layout                  # 8 x 4096, T = 1, 3, 4, 5
  python -m benchmarks.decode_attention_layout --shape 4x8000 --tokens 1,4
  python -m benchmarks.decode_attention_layout --smoke         # 2 x 128, 2 layers, T = 1, 3 (seconds)
"""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax.layers.attention import NEG_INF, masked_attention
from magicdec_jax.pallas.xla_attention import fold_queries, unfold_queries

HIGHEST = jax.lax.Precision.HIGHEST


def kt_attention(q, kt, v, mask):
  """masked_attention with K stored [B, K, D, S]."""
  b, t, h, d = q.shape
  kh = kt.shape[1]
  logits = jnp.einsum("BKQD,BKDS->BKQS", fold_queries(q, kh), kt, preferred_element_type=jnp.float32,
                      precision=HIGHEST) * d ** -0.5
  logits = jnp.where(jnp.repeat(mask, h // kh, axis=1)[:, None], logits, NEG_INF)
  out = jnp.einsum("BKQS,BKSD->BKQD", jax.nn.softmax(logits, axis=-1), v, preferred_element_type=jnp.float32,
                   precision=HIGHEST)
  return unfold_queries(out, t)


def sq_attention(q, k, v, mask):
  """masked_attention with the logits laid out [B, K, S, Q]."""
  b, t, h, d = q.shape
  kh = k.shape[1]
  logits = jnp.einsum("BKSD,BKQD->BKSQ", k, fold_queries(q, kh), preferred_element_type=jnp.float32,
                      precision=HIGHEST) * d ** -0.5
  mask_q = jnp.swapaxes(jnp.repeat(mask, h // kh, axis=1), 1, 2)                      # [B, S, T*G]
  logits = jnp.where(mask_q[:, None], logits, NEG_INF)
  out = jnp.einsum("BKSQ,BKSD->BKQD", jax.nn.softmax(logits, axis=2), v, preferred_element_type=jnp.float32,
                   precision=HIGHEST)
  return unfold_queries(out, t)


def timed(fn, args, repeats):
  jax.block_until_ready(fn(*args))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return {"min_ms": min(ts) * 1e3, "median_ms": float(np.median(ts)) * 1e3}


def main(argv=None):
  ap = common.parser(__doc__, smoke="tiny shapes: 2 x 128, 2 layers, T = 1, 3, one repeat")
  ap.add_argument("--shape", default="8x4096", help="batch x context")
  ap.add_argument("--tokens", type=common.int_list, default=[1, 3, 4, 5], help="query tokens per row (T)")
  ap.add_argument("--layers", type=int, default=30)
  ap.add_argument("--kv-heads", type=int, default=3)
  ap.add_argument("--group", type=int, default=3, help="query heads per KV head")
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=9)
  args = common.parse(ap, argv, shape="2x128", layers=2, tokens=[1, 3], repeats=1)
  (b, s), = common.shape_list(args.shape)
  kh, g, d, n = args.kv_heads, args.group, args.head_dim, args.layers
  if min(b, s, kh, g, d, n, args.repeats, *args.tokens) < 1:
    ap.error("every size must be >= 1")
  rng = np.random.default_rng(0)
  ks_np = [rng.standard_normal((b, kh, s, d), np.float32) for _ in range(n)]
  ks = [jnp.asarray(k) for k in ks_np]
  kts = [jnp.asarray(np.ascontiguousarray(np.swapaxes(k, 2, 3))) for k in ks_np]
  del ks_np
  vs = [jnp.asarray(rng.standard_normal((b, kh, s, d), np.float32)) for _ in range(n)]
  doc = {"benchmark": "decode_attention_layout", "env": common.env_info(), "command": common.command(),
         "shape": {"batch": b, "context": s, "layers": n, "kv_heads": kh, "group": g, "head_dim": d,
                   "dtype": "float32", "kv_bytes": 2 * n * b * kh * s * d * 4},
         "read_all_kv": timed(jax.jit(lambda ks, vs: [x.sum() for x in ks + vs]), (ks, vs), args.repeats),
         "by_tokens": []}
  over_layers = lambda f: jax.jit(lambda q, ks, vs, m: [f(q, k, v, m) for k, v in zip(ks, vs)])
  for t in args.tokens:
    q = jnp.asarray(rng.standard_normal((b, t, kh * g, d), np.float32))
    base = s - 64 - t
    mask = jnp.broadcast_to((jnp.arange(s)[None, :] < base + 1 + jnp.arange(t)[:, None])[None], (b, t, s))
    ref = np.asarray(masked_attention(q, ks[0], vs[0], mask))
    row = {"tokens": t, "max_abs_diff": {
        "kt_layout": float(np.abs(np.asarray(kt_attention(q, kts[0], vs[0], mask)) - ref).max()),
        "sq_orientation": float(np.abs(np.asarray(sq_attention(q, ks[0], vs[0], mask)) - ref).max())}}
    row["attention"] = {"cache_layout": timed(over_layers(masked_attention), (q, ks, vs, mask), args.repeats),
                        "kt_layout": timed(over_layers(kt_attention), (q, kts, vs, mask), args.repeats),
                        "sq_orientation": timed(over_layers(sq_attention), (q, ks, vs, mask), args.repeats)}
    qf = fold_queries(q, kh)
    row["qk_only"] = {
        "cache_layout": timed(jax.jit(lambda qf, ks: [jnp.einsum("BKQD,BKSD->BKQS", qf, k, precision=HIGHEST)
                                                      for k in ks]), (qf, ks), args.repeats),
        "kt_layout": timed(jax.jit(lambda qf, ks: [jnp.einsum("BKQD,BKDS->BKQS", qf, k, precision=HIGHEST)
                                                   for k in ks]), (qf, kts), args.repeats)}
    doc["by_tokens"].append(row)
    a = row["attention"]
    print(f"[decode_attention_layout] T={t}: attention (min ms) cache layout {a['cache_layout']['min_ms']:.1f}, "
          f"K transposed {a['kt_layout']['min_ms']:.1f}, SQ logits {a['sq_orientation']['min_ms']:.1f}; QK alone "
          f"{row['qk_only']['cache_layout']['min_ms']:.1f} vs {row['qk_only']['kt_layout']['min_ms']:.1f}",
          file=sys.stderr, flush=True)
  ar = {r["tokens"]: r["attention"] for r in doc["by_tokens"]}
  if 1 in ar:
    doc["ratio_to_T1"] = {t: {lay: ar[t][lay]["min_ms"] / ar[1][lay]["min_ms"] for lay in ar[t]} for t in ar}
  common.finish(doc, args.output, f"decode_attention_layout_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
