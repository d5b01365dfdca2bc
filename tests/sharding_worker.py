"""Runs in a subprocess with 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8) for
test_sharding.py; prints one JSON object of facts (tokens per mesh, shardings, byte counts, collectives)
that the test asserts on. Usage: python sharding_worker.py tiny|family|smollm2 [tmpdir].

References are single-device `generate` calls (no mesh) in the same process.
"""
from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np

import magicdec_jax as md
from magicdec_jax import checkpoints, engine, loop, plan, sharding
from magicdec_jax.cache import ring_margin
from magicdec_jax import compile as compiling
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers import quant
from magicdec_jax.prompts import pad_prompts
from magicdec_jax.sharding import rules
from magicdec_jax.tuning import hlo

MESHES = ("data:1,model:8", "data:2,model:4", "data:4,model:2", "data:8,model:1")
# SmolLM2 (30 layers: every compile is dear) on the meshes where its layout differs: attention replicated
# over 8 and over 2 model devices, and split by heads with no model axis (2x4 is the tiny model's case)
SMOL_MESHES = ("data:1,model:8", "data:4,model:2", "data:8,model:1")


def tiny_model(seed: int = 0):
  """8 heads on 2 KV heads (head-split and KV-replicated layouts), vocab 64; numpy normals (no init
  compile), attention weights large enough that the windowed draft disagrees with the target."""
  cfg = md.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=8,
                       num_kv_heads=2, head_dim=8, max_position_embeddings=512)
  shapes = checkpoints.expected_shapes(cfg)
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      return jax.numpy.ones(shape, np.float32)
    std = 0.5 if "embed" in name else (10.0 if "attn" in name else 1.0) * cfg.hidden_size ** -0.5
    return jax.numpy.asarray(rng.normal(size=shape) * std, np.float32)

  params = jax.tree_util.tree_map_with_path(leaf, shapes, is_leaf=checkpoints.is_shape)
  return md.Model(cfg, params, name="tiny-8h2kv")


def family_model(seed: int = 3):
  """The tiny model with every family feature (Qwen3's biases and q/k norms, Gemma 3's (1 + w) norms,
  post-norms, GeGLU, scaled embedding, soft-caps, local layers with their own RoPE base): layer 0 slides
  (window 6), so its target cache is a ring once a prompt passes 6 + 256 tokens."""
  base = tiny_model(seed)
  cfg = base.config.replace(qkv_bias=True, o_bias=True, qk_norm=True, norm_plus_one=True, post_norms=True,
                            activation="gelu_tanh", embed_scale=True, query_pre_attn_scalar=12.0,
                            attn_softcap=20.0, final_softcap=15.0, layer_windows=(6, 0), local_rope_theta=100.0)
  rng = np.random.default_rng(seed)

  def leaf(path, shape):
    name = jax.tree_util.keystr(path)
    if "norm" in name or "bias" in name or "scale" in name:
      return jax.numpy.asarray(0.3 * rng.normal(size=shape), np.float32)
    std = 0.5 if "embed" in name else (6.0 if "attn" in name else 1.0) * cfg.hidden_size ** -0.5
    return jax.numpy.asarray(rng.normal(size=shape) * std, np.float32)

  params = jax.tree_util.tree_map_with_path(leaf, checkpoints.expected_shapes(cfg), is_leaf=checkpoints.is_shape)
  return md.Model(cfg, params, name="tiny-family-8h2kv")


def modes(window: int, tree=(2, 2)):
  draft = md.StreamingDraft(sink=1, window=window)
  return {"ar": dict(draft=None), "chain": dict(draft=draft, gamma=2),
          "tree": dict(draft=draft, tree=md.Tree.kary(list(tree)))}


def mesh_tokens(model, prompts, cases: dict, meshes=MESHES, refs: dict | None = None, **kw) -> dict:
  """{case: {"ref": tokens, mesh: tokens, ...}} with one shard_model per mesh; refs: given references
  (else single-device generate with the case's own arguments)."""
  out = {}
  for c, v in cases.items():
    if refs is not None:
      out[c] = {"ref": refs[c]}
      continue
    ref = md.generate(model, prompts, **kw, **v)
    out[c] = {"ref": ref.tokens, "acceptance": ref.stats["acceptance_rate"]}
  for spec in meshes:
    mesh = sharding.make_mesh(spec)
    sm = sharding.shard_model(model, mesh)
    for c, v in cases.items():
      out[c][spec] = md.generate(sm, prompts, mesh=mesh, **kw, **v).tokens
  return out


def int4_kernel_tokens(model, prompts, ar) -> dict:
  """A StreamingDraft on a packed int4 copy (the Pallas kernel, interpreted; groups of 32, so o [64, 32] is
  packed): per shard over "data" on 8 x 1, XLA's fallback on 2 x 4 (a model axis); plain decoding's tokens."""
  platform = jax.default_backend()
  old = quant.FORMS.get(platform)
  quant.FORMS[platform] = quant.backend_form().replace(kernel=True, group=32)
  draft_weights.drop_copies()
  try:
    packed = [x.packed for x in jax.tree.leaves(draft_weights.copy_of(model.params, "int4"),
                                                  is_leaf=lambda x: isinstance(x, quant.QuantizedWeight))
              if isinstance(x, quant.QuantizedWeight)]
    cases = {"chain_int4_kernel": dict(draft=md.StreamingDraft(sink=1, window=4, weights="int4"), gamma=2)}
    out = mesh_tokens(model, prompts, cases, meshes=("data:8,model:1", "data:2,model:4"), max_new_tokens=8,
                      refs={"chain_int4_kernel": ar})
  finally:
    if old is None:
      quant.FORMS.pop(platform, None)
    else:
      quant.FORMS[platform] = old
    draft_weights.drop_copies()
  out["packed_matrices"] = sum(packed)
  return out


def collectives(model, prompts, mesh_spec: str, case: dict, max_new_tokens: int) -> dict:
  """Collective ops in the compiled sharded decode (and prefill) of one case, with all-gather shapes."""
  import re
  mesh = sharding.make_mesh(mesh_spec)
  sm = sharding.shard_model(model, mesh)
  # the executables generate() compiles for this case: one plan, one engine on the mesh
  ids = [list(p) for p in prompts]
  st = md.DecodeSettings(max_new_tokens=max_new_tokens, draft=case["draft"], gamma=case.get("gamma"),
                         tree=case.get("tree"))
  p = plan.make_plan(sm, st, batch=len(ids), shortest=min(map(len, ids)), longest=max(map(len, ids)), mesh=mesh)
  eng = engine.Engine(sm, p)
  b, p_bucket = p.batch_rows(len(ids)), p.prompt_bucket(max(map(len, ids)))
  tokens, lengths = pad_prompts(ids, b, p_bucket)
  num_slots = p.num_slots(p_bucket)
  pre_text = eng.compiled_text("prefill", tokens, lengths, num_slots)
  target, ring = eng.prefill(tokens, lengths, num_slots)
  state = eng.initial_state(tokens, lengths, np.full((b,), max_new_tokens, np.int32),
                            jax.random.split(jax.random.key(0), b), target, ring)
  target, ring = state.target, state.ring
  dec_text = eng.compiled_text("decode", state)
  # a gathered cache layer: the all-gather's result is one layer's [B, K, S, D] buffer (target or ring), or
  # a shard of it; other big all-gathers (vocab-sharded logits for sampling) are expected
  cache_layer = {tuple(target.k[0].shape)} | ({tuple(ring.k[0].shape)} if ring is not None else set())
  in_loop, after_loop, where, big_gathers = 0, 0, {}, []
  for line in dec_text.splitlines():
    m = re.search(r"= \(?(\w+)\[([\d,]*)\]\S* (all-gather|all-reduce|collective-permute)(?:-start)?\(", line)
    if not m:
      continue
    name = re.search(r'op_name="([^"]*)"', line)
    name = name.group(1).split("jit(decode)/")[-1] if name else "?"
    where[f"{m.group(3)} {name}"] = where.get(f"{m.group(3)} {name}", 0) + 1
    dims = tuple(int(x) for x in m.group(2).split(",") if x)
    if m.group(3) == "all-gather" and int(np.prod(dims or (1,))) >= 4096:
      big_gathers.append(f"{list(dims)} {name}")
    if m.group(3) == "all-gather" and any(len(d) == len(dims) and sum(a != c for a, c in zip(d, dims)) <= 1
                                          for d in cache_layer):
      in_loop += "while/body" in name
      after_loop += "while/body" not in name
  return {"prefill": hlo.count_collectives(pre_text), "decode": hlo.count_collectives(dec_text),
          "decode_by_op": where, "big_gathers": big_gathers, "cache_gathers_in_loop": in_loop, "cache_gathers_after_loop": after_loop,
          "cache_shard_shape": list(target.k[0].addressable_shards[0].data.shape),
          "cache_shape": list(target.k[0].shape)}


def per_device_bytes(tree) -> int:
  """The most any one device holds of a pytree of arrays (a direct count of shard bytes)."""
  per = {}
  for a in jax.tree.leaves(tree):
    for s in a.addressable_shards:
      per[s.device] = per.get(s.device, 0) + s.data.nbytes
  return max(per.values())


def planner_facts(model, prompts, mesh_spec: str) -> dict:
  """Planner figures vs direct counts of the shard bytes of params, target cache and draft ring."""
  mesh = sharding.make_mesh(mesh_spec)
  out = {}
  for name, draft in (("streaming", md.StreamingDraft(sink=1, window=4)),
                      ("model", md.ModelDraft(md.truncate_layers(model, 1), sink=1, window=4))):
    sm = sharding.shard_model(model, mesh)
    p = plan.make_plan(sm, md.DecodeSettings(max_new_tokens=16, draft=draft, gamma=2), batch=len(prompts), shortest=3,
                  longest=max(map(len, prompts)), mesh=mesh)
    eng = engine.Engine(sm, p)
    dparams, tree = eng.draft_params, eng.tree
    b = p.batch_rows(len(prompts))
    p_bucket = plan.bucket(max(map(len, prompts)))
    num_slots = p_bucket + 16 + tree.num_nodes + 1
    tokens = np.ones((b, p_bucket), np.int32)
    lengths = np.full((b,), 3, np.int32)
    target, ring = eng.prefill(tokens, lengths, num_slots)
    mem = sharding.plan_memory(model.config, mesh, batch=b, max_context=num_slots, draft=draft,
                                tree_nodes=tree.num_nodes, prompt_len=p_bucket, chunk=p_bucket)
    out[name] = {"plan": {k: getattr(mem, k) for k in ("params", "draft_params", "target_kv", "draft_kv",
                                                         "activations")},
                 "direct": {"params": per_device_bytes(sm.params),
                            "draft_params": 0 if dparams is None else per_device_bytes(dparams),
                            "target_kv": per_device_bytes((target.k, target.v)),
                            "draft_kv": per_device_bytes((ring.k, ring.v, ring.pos))}}
  return out


def auto_facts(mesh_spec: str) -> dict:
  """gamma="auto" plans (LLaMA-3.1-8B's shapes, an H100, 64 rows at 2K) on the mesh, on one device with the
  rows one device of the mesh holds, and on one device with them all: (variants, thresholds, speedup)."""
  from magicdec_jax.model import Model
  from magicdec_jax.tuning import shapes
  m = Model(shapes.model_shape("llama31_8b"), None, name="shape-only")
  st = md.DecodeSettings(max_new_tokens=256, draft=md.StreamingDraft(sink=4, window=256), gamma="auto",
                         hardware="h100")
  mesh = sharding.make_mesh(mesh_spec)
  fact = lambda p: [repr(p.variants), repr(p.thresholds), p.report.get("speedup")]
  kw = dict(shortest=2000, longest=2000, fixed_batch=True)
  return {"mesh": fact(plan.make_plan(m, st, batch=64, mesh=mesh, **kw)),
          "device_rows": fact(plan.make_plan(m, st, batch=64 // mesh.shape["data"], **kw)),
          "whole_batch": fact(plan.make_plan(m, st, batch=64, **kw))}


def orbax_facts(model, tmpdir: str, mesh_spec: str) -> dict:
  """Save, restore straight into shards; every leaf's sharding and per-device block vs the rules."""
  path = os.path.join(tmpdir, "ckpt")
  checkpoints.save_orbax(model, path)
  mesh = sharding.make_mesh(mesh_spec)
  back = checkpoints.load_orbax_sharded(path, mesh)
  lay = rules.layout_for(model.config, sharding.axis_sizes(mesh)[1])
  specs = rules.param_specs(model.params, lay)
  bad = []
  flat = jax.tree_util.tree_flatten_with_path(back.params)[0]
  for (path_, arr), spec, ref in zip(flat, jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)),
                                     jax.tree.leaves(model.params)):
    name = jax.tree_util.keystr(path_)
    want = jax.sharding.NamedSharding(mesh, spec)
    if not arr.sharding.is_equivalent_to(want, arr.ndim):
      bad.append(f"{name}: {arr.sharding.spec} != {spec}")
    for shard in arr.addressable_shards:          # each device holds exactly its block of the values
      if not np.array_equal(np.asarray(shard.data), np.asarray(ref)[shard.index]):
        bad.append(f"{name}: device {shard.device.id} block {shard.index} differs")
  q = back.params["layers"][0]["attn"]["q"]
  return {"bad": bad, "q_spec": str(q.sharding.spec), "q_shard_shape": list(q.addressable_shards[0].data.shape),
          "num_devices_q": len({s.device for s in q.addressable_shards})}


def refusal_facts(model, prompts) -> dict:
  """An over-budget config is refused with the numbers, before anything new compiles."""
  mesh = sharding.make_mesh("data:2,model:4")
  before = compiling.compile_count()
  t = time.perf_counter()
  try:
    md.generate(model, prompts, max_new_tokens=4, mesh=mesh, device_memory=10_000)
    return {"refused": False}
  except ValueError as e:
    out = {"refused": True, "message": str(e), "seconds": time.perf_counter() - t,
           "new_jits": compiling.compile_count() - before}
  try:
    md.generate(model, prompts, max_new_tokens=4, mesh=mesh, shrink_batch=True)
  except ValueError as e:
    out["shrink_refused"] = str(e)
  return out


class Timed(dict):
  """out[key] = value, recording the seconds since the previous assignment under out["timings"]."""

  def __init__(self):
    super().__init__(timings={})
    self._t = time.perf_counter()

  def __setitem__(self, key, value):
    now = time.perf_counter()
    self["timings"][key] = round(now - self._t, 1)
    self._t = now
    super().__setitem__(key, value)


def main(which: str, tmpdir: str):
  t0 = time.perf_counter()
  out = Timed()
  out["devices"] = jax.device_count()
  if which == "tiny":
    model = tiny_model()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 64, n).tolist() for n in (5, 9, 3)]      # ragged rows
    out["layouts"] = {s: rules.layout_for(model.config, sharding.make_mesh(s).shape["model"]).attention
                      for s in MESHES}
    out["greedy"] = mesh_tokens(model, prompts, modes(4), max_new_tokens=8)
    sample = {"chain_t0.8": dict(draft=md.StreamingDraft(sink=1, window=4), gamma=2, temperature=0.8,
                                 seed=7),
              "ar_invariant": dict(draft=None, temperature=0.8, top_p=0.9, seed=7, sampling="invariant"),
              "tree_invariant": dict(draft=md.StreamingDraft(sink=1, window=4), tree=md.Tree.kary([2, 2]),
                                     temperature=0.8, top_p=0.9, seed=7, sampling="invariant")}
    out["sampling"] = mesh_tokens(model, prompts, sample, max_new_tokens=8)
    pallas = {"chain_pallas": dict(draft=md.StreamingDraft(sink=1, window=4), gamma=2,
                                   attention_impl="pallas_interpret")}
    out["pallas"] = mesh_tokens(model, prompts, pallas, meshes=("data:2,model:4",), max_new_tokens=8,
                                refs={"chain_pallas": out["greedy"]["chain"]["ref"]})   # vs one-device XLA
    quantized = {"chain_int8": dict(draft=md.StreamingDraft(sink=1, window=4, weights="int8"), gamma=2),
                 "tree_int4": dict(draft=md.StreamingDraft(sink=1, window=4, weights="int4"),
                                   tree=md.Tree.kary([2, 2]))}
    ar = out["greedy"]["ar"]["ref"]                                      # greedy: plain decoding's tokens
    out["quantized"] = mesh_tokens(model, prompts, quantized, meshes=("data:2,model:4", "data:4,model:2"),
                                   max_new_tokens=8, refs={"chain_int8": ar, "tree_int4": ar})
    out["int4_kernel"] = int4_kernel_tokens(model, prompts, ar)
    head = md.init_head(model, seed=1)
    feature = {"greedy_chain": dict(draft=md.FeatureDraft(head, sink=1, window=4), gamma=2),
               "greedy_tree": dict(draft=md.FeatureDraft(head, sink=1, window=4), tree=md.Tree.kary([2, 2])),
               "sampled_chain": dict(draft=md.FeatureDraft(head, sink=1, window=4), gamma=3, temperature=1.0,
                                     seed=3)}
    out["feature"] = mesh_tokens(model, prompts, feature, max_new_tokens=8)
    out["collectives"] = collectives(model, prompts, "data:2,model:4", modes(4)["chain"], 8)
    out["planner"] = planner_facts(model, prompts, "data:2,model:4")
    out["orbax"] = orbax_facts(model, tmpdir, "data:2,model:4")
    out["refusal"] = refusal_facts(model, prompts)
  elif which == "auto":                                   # plans only: nothing compiles
    out["auto"] = auto_facts("data:8,model:1")
  elif which == "family":
    model = family_model()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 64, n).tolist() for n in (290, 7)]     # the first passes the ring's 272 slots
    out["ring_slots"] = [int(c.shape[2]) for c in loop.prefill(
        model.params, jax.numpy.asarray([prompts[0] + [0] * 222]), jax.numpy.asarray([290]),
        cfg=model.config, num_slots=576, margin=ring_margin(1, 256), chunk=256).k]
    ar = md.generate(model, prompts, max_new_tokens=6).tokens                # single-device plain decoding
    cases = {"ar": dict(draft=None), "chain": dict(draft=md.StreamingDraft(sink=1, window=4), gamma=2)}
    out["greedy"] = mesh_tokens(model, prompts, cases, max_new_tokens=6, refs={"ar": ar, "chain": ar})
    out["specs"] = {}
    for spec in ("data:2,model:4", "data:4,model:2"):     # K/V replicated over model, then split by head
      sm = sharding.shard_model(model, sharding.make_mesh(spec))
      out["specs"][spec] = {jax.tree_util.keystr(k): str(v.sharding.spec) for k, v in
                            jax.tree_util.tree_leaves_with_path(sm.params["layers"][0]["attn"])
                            if "bias" in jax.tree_util.keystr(k) or "norm" in jax.tree_util.keystr(k)}
    out["collectives"] = {}
    mesh = sharding.make_mesh("data:2,model:4")         # continuous batching: ring and linear prefills
    reqs = prompts + [rng.integers(0, 64, 280).tolist(), rng.integers(0, 64, 12).tolist()]
    got = {r.index: r.tokens for r in md.generate_stream(sharding.shard_model(model, mesh), reqs, batch_size=2,
                                                          refill_at=1, max_new_tokens=6, mesh=mesh)}
    out["stream"] = {"ref": md.generate(model, reqs, max_new_tokens=6).tokens, "got": [got[i] for i in range(4)]}
    out["chain_acceptance"] = md.generate(model, prompts, max_new_tokens=6, **cases["chain"]).stats["acceptance_rate"]
  else:
    model = md.load_model("smollm2-135m")
    prompts = [model.tokenizer.encode(p).ids for p in ("To be, or not to be", "Once upon a time")]
    out["layouts"] = {s: rules.layout_for(model.config, sharding.make_mesh(s).shape["model"]).attention
                      for s in SMOL_MESHES}
    smol_modes = modes(8, tree=(3,))          # a one-level tree: every compile and step costs 30 layers
    out["greedy"] = mesh_tokens(model, prompts, smol_modes, meshes=SMOL_MESHES, max_new_tokens=4)
    out["collectives"] = collectives(model, prompts, "data:1,model:8", smol_modes["chain"], 4)
  out["seconds"] = time.perf_counter() - t0
  print("RESULT " + json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "/tmp")
