"""Prefill and decode tokens/s of SmolLM2-135M on CPU: ours (`generate`, autoregressive) vs HF transformers.

Both sides load the same GGUF (dequantized to float32) and get the same Shakespeare token ids; each is
warmed up once, then the median of `--repeats` runs: ours `generate`'s prefill_s / decode_s, HF (torch,
`--threads` threads, in a child process) one forward over the prompt and `max_new` single-token greedy steps
with past_key_values. The greedy tokens are compared as a sanity check (`greedy_prefix_match`).

  python -m benchmarks.steps.vs_hf                          # B {1, 8} x context {512, 2048}
  python -m benchmarks.steps.vs_hf --shapes 1x512 --repeats 3 --no-hf
  python -m benchmarks.steps.vs_hf --hlo 8x512              # also report cache ops in the decode HLO
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import checkpoints, loop
from magicdec_jax.tuning import hlo
from magicdec_jax.cache import aligned_slots, ring_margin
from magicdec_jax.generation import generate
from magicdec_jax.plan import bucket
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import AR_TREE


def ours(model, prompts: list[list[int]], max_new: int, repeats: int) -> dict:
  """Median prefill / decode seconds of autoregressive `generate` after one warm-up call."""
  t0 = time.perf_counter()
  generate(model, prompts, max_new_tokens=max_new, eos_token_id=[])
  warm_s = time.perf_counter() - t0
  runs = [generate(model, prompts, max_new_tokens=max_new, eos_token_id=[]) for _ in range(repeats)]
  times = [(r.stats["prefill_s"], r.stats["decode_s"]) for r in runs]
  return {"warmup_call_s": warm_s, **figures(times, len(prompts), len(prompts[0]), max_new), "tokens": runs[-1].tokens}


def figures(runs: list, b: int, p: int, max_new: int) -> dict:
  """Medians and rates of (prefill seconds, decode seconds) runs of b rows of p prompt tokens."""
  pre, dec = [r[0] for r in runs], [r[1] for r in runs]
  pre_s, dec_s = statistics.median(pre), statistics.median(dec)
  return {"prefill_s": pre_s, "decode_s": dec_s, "prefill_runs_s": pre, "decode_runs_s": dec,
          "prefill_tok_s": b * p / pre_s, "decode_tok_s": b * max_new / dec_s,
          "decode_ms_per_step": 1e3 * dec_s / max_new}


def hf(model, prompts: list[list[int]], max_new: int, repeats: int) -> dict:
  """Median prefill seconds (one forward with use_cache) and decode seconds (max_new greedy steps)."""
  import torch
  ids = torch.tensor(prompts, dtype=torch.long)
  b, p = ids.shape

  def run():
    with torch.inference_mode():
      t0 = time.perf_counter()
      out = model(input_ids=ids, use_cache=True)
      t1 = time.perf_counter()
      past, nxt, toks = out.past_key_values, out.logits[:, -1].argmax(-1), []
      for _ in range(max_new):
        toks.append(nxt)
        out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1)
      t2 = time.perf_counter()
    return t1 - t0, t2 - t1, torch.stack(toks, 1).tolist()

  run()                                                       # warm-up (allocator, oneDNN kernels)
  runs = [run() for _ in range(repeats)]
  return {**figures(runs, b, p, max_new), "tokens": runs[-1][2]}


def prefix_match(a: list[list[int]], b: list[list[int]]) -> float:
  """Mean over rows of the fraction of leading tokens that agree."""
  lead = lambda x, y: next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
  return float(np.mean([lead(x, y) / max(len(x), 1) for x, y in zip(a, b)]))


def hlo_cache_ops(model, batch: int, context: int, max_new: int = 32) -> dict:
  """Ops in the compiled AR decode loop body that copy, slice or pad a weight matrix or a layer's cache
  (magicdec_jax.tuning.hlo.loop_body_copies; expected: none)."""
  cfg = model.config
  s = aligned_slots(bucket(context) + bucket(max_new) + AR_TREE.num_nodes + 1)
  tokens = jnp.zeros((batch, context), jnp.int32)
  lengths = jnp.full((batch,), context, jnp.int32)
  chunk = min(context, 256)
  target = jax.eval_shape(lambda: loop.prefill(model.params, tokens, lengths, cfg=cfg, num_slots=s,
                                               margin=ring_margin(AR_TREE.num_nodes, chunk), chunk=chunk))
  target = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), target)
  st = loop.initial_state(tokens, lengths, jnp.full((batch,), max_new, jnp.int32), jnp.array([-1], jnp.int32),
                          jax.random.split(jax.random.key(0), batch), target, None, bucket(max_new) + 1,
                          AR_TREE)
  text = loop.decode.lower(model.params, None, st, cfg=cfg, spec=None, tree=AR_TREE,
                           sampling=Sampling()).compile().as_text()
  shapes = {tuple(a.shape) for a in jax.tree.leaves(model.params) if a.ndim >= 2} | {tuple(target.k[0].shape)}
  bad = hlo.loop_body_copies(text, shapes)
  return {"cache_layer_shape": list(target.k[0].shape), "copies_in_loop_body": len(bad),
          "examples": [i.line[:240] for i in bad[:8]], "hlo_chars": len(text)}


def hf_child(args, shapes) -> None:
  """Child process: HF figures for every shape (the same GGUF, float32) on the prompts the parent wrote to
  --output, which then takes the figures."""
  import torch
  import transformers
  torch.set_num_threads(args.threads)
  path = checkpoints.known_model_path("smollm2-135m")
  model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                           torch_dtype=torch.float32).eval()
  env = {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
         "torch_threads": torch.get_num_threads()}
  res = []
  for (b, ctx), prompts in zip(shapes, common.read_json(args.output)):
    h = hf(model, prompts, args.max_new, args.repeats)
    h["loadavg_after"] = list(os.getloadavg())
    res.append(h)
    common.log(f"[{b}x{ctx}] hf decode {h['decode_tok_s']:.2f} tok/s prefill {h['prefill_tok_s']:.1f} tok/s")
  common.write_json({"env": env, "results": res}, args.output, stamp=False)


def main(argv=None):
  ap = common.parser(__doc__, smoke=None)
  ap.add_argument("--shapes", default="1x512,8x512,1x2048,8x2048", help="BxCONTEXT,... ")
  common.flags(ap, max_new=32, repeats=3)
  ap.add_argument("--threads", type=int, default=2, help="torch threads for HF")
  ap.add_argument("--no-hf", action="store_true")
  ap.add_argument("--hf-only", action="store_true",
                  help="internal: measure only HF (run in a child process, so JAX's CPU threads are absent)")
  ap.add_argument("--hlo", default="", help="BxCONTEXT: also analyse the compiled decode loop at this shape")
  args = common.parse(ap, argv)
  shapes = common.shape_list(args.shapes)

  if args.hf_only:
    return hf_child(args, shapes)
  model, source = common.model(False)
  doc = common.record("cpu_decode_vs_hf", model.name, "float32", weights=source, max_new_tokens=args.max_new,
                      repeats=args.repeats, hf_threads=args.threads, xla_flags=os.environ.get("XLA_FLAGS", ""),
                      method="ours in this process; HF afterwards in a child process (no JAX thread pool beside it)",
                      results=[])
  rows, ours_tokens, all_prompts = [], [], []
  for b, ctx in shapes:
    prompts, text_src = common.text_prompts(model, b, ctx, model.config.vocab_size)
    row = {"batch": b, "context": ctx, "prompt_source": text_src, "loadavg_before": list(os.getloadavg())}
    o = ours(model, prompts, args.max_new, args.repeats)
    row["ours"] = {k: v for k, v in o.items() if k != "tokens"}
    row["loadavg_after"] = list(os.getloadavg())
    rows.append(row)
    ours_tokens.append(o["tokens"])
    common.log(f"[{b}x{ctx}] ours decode {o['decode_tok_s']:.2f} tok/s prefill {o['prefill_tok_s']:.1f} tok/s")
    all_prompts.append(prompts)
  if not args.no_hf:
    out = common.write_json(all_prompts, f"/tmp/cpu_decode_vs_hf_{os.getpid()}.json", stamp=False)
    cmd = [sys.executable, "-m", "benchmarks.steps.vs_hf", "--hf-only", "--shapes", args.shapes,
           "--max-new", str(args.max_new), "--repeats", str(args.repeats), "--threads", str(args.threads),
           "--output", out]
    subprocess.run(cmd, check=True, cwd=common.REPO_ROOT)
    hf_doc = common.read_json(out)
    doc["env"].update(hf_doc["env"])
    for row, toks, h in zip(rows, ours_tokens, hf_doc["results"]):
      row["hf"] = {k: v for k, v in h.items() if k != "tokens"}
      row["decode_ratio_ours_over_hf"] = row["ours"]["decode_tok_s"] / h["decode_tok_s"]
      row["prefill_ratio_ours_over_hf"] = row["ours"]["prefill_tok_s"] / h["prefill_tok_s"]
      row["greedy_prefix_match"] = prefix_match(toks, h["tokens"])
  doc["results"] = rows
  if args.hlo:
    b, ctx = (int(x) for x in args.hlo.split("x"))
    doc["hlo_decode_loop"] = dict(batch=b, context=ctx, **hlo_cache_ops(model, b, ctx, args.max_new))
  common.finish(doc, args.output, f"cpu_decode_vs_hf_{common.device_tag()}.json")


if __name__ == "__main__":
  main()
