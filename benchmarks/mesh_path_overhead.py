"""What the one execution path costs on one device: the Engine's decode on its 1 x 1 mesh (in/out
shardings, issue 47) against the same `loop.decode` compiled bare (no shardings: the single-device path
before issue 47), in one process, interleaved, from the same prefilled state each time; SmolLM2-135M float32,
4 x 512, 64 new tokens, greedy, plain decoding and the self-draft (sink 4 + window 64, gamma 2).

  PYTHONPATH=. python -m benchmarks.mesh_path_overhead --output benchmarks/results/NAME.json
"""
import json, sys, time, statistics
import jax, jax.numpy as jnp, numpy as np
import magicdec_jax as md
from magicdec_jax import engine, loop, plan
from magicdec_jax import compile as compiling
from magicdec_jax.prompts import pad_prompts
from benchmarks import common

model, _ = common.load_smollm("float32")
B, P, NEW = 4, 512, 64
rng = np.random.default_rng(0)
ids = [rng.integers(100, 20000, P).tolist() for _ in range(B)]
out = {"device": jax.devices()[0].device_kind, "env": common.env_info(), "batch": B,
       "context": P, "new_tokens": NEW, "jax": jax.__version__, "runs": {}}
for name, draft, gamma in (("ar", None, 3), ("self_gamma2", md.StreamingDraft(sink=4, window=64), 2)):
  st = md.DecodeSettings(max_new_tokens=NEW, draft=draft, gamma=gamma)
  p = plan.make_plan(model, st, batch=B, shortest=P, longest=P)
  eng = engine.Engine(model, p)
  pb = p.prompt_bucket(P)
  tok, ln = pad_prompts(ids, B, pb)
  tok, ln = jnp.asarray(tok), jnp.asarray(ln)
  target, ring = eng.prefill(tok, ln, p.num_slots(pb))
  keys = engine.stream_keys(0, range(B))
  def fresh():
    t, r = jax.tree.map(jnp.copy, (target, ring))
    return eng.initial_state(tok, ln, jnp.full((B,), NEW, jnp.int32), keys, t, r)
  static = eng._decode_static()
  def bare(state):
    state = jax.device_put(state, jax.devices()[0])
    args = (eng.target_params, eng.draft_params, state)
    return compiling.jit_executable("decode_bare", loop.decode, args, static, options=p.xla_options,
                                    donate_argnames=("state",))(*args)
  times = {"engine": [], "bare": []}
  toks = {}
  for i in range(4):
    for k, fn in (("engine", eng.decode), ("bare", bare)):
      s = fresh(); jax.block_until_ready(s)
      t0 = time.perf_counter(); s = jax.block_until_ready(fn(s)); dt = time.perf_counter() - t0
      if i:
        times[k].append(dt)
      toks[k] = np.asarray(s.out).tolist()
  out["runs"][name] = {k: {"median_s": statistics.median(v), "all_s": v} for k, v in times.items()}
  out["runs"][name]["engine_over_bare"] = statistics.median(times["engine"]) / statistics.median(times["bare"])
  out["runs"][name]["same_tokens"] = toks["engine"] == toks["bare"]
out["date"] = time.strftime("%Y-%m-%d")
text = json.dumps(out, indent=1)
print(text)
if "--output" in sys.argv:
  with open(sys.argv[sys.argv.index("--output") + 1], "w") as f:
    f.write(text + "\n")
