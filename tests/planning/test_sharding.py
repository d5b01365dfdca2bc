"""Tensor / data parallelism: the same tokens on every mesh, shardings, the memory planner, multi-host.

The mesh checks need 8 devices, but this pytest process already started jax with one CPU device, so
they run in a subprocess (sharding_worker.py, XLA_FLAGS=--xla_force_host_platform_device_count=8) that
prints facts as JSON; one subprocess per model batches every mesh case (compilation dominates). The
references are single-device `generate` calls in that subprocess, never the sharded code itself. The
multi-host check starts two `run.py --mode=datagen` processes joined by jax.distributed on localhost and
compares their merged output with a one-process run here.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

import jax
import pytest

from magicdec_jax import datagen, sharding
from magicdec_jax import testing
from magicdec_jax.cache import aligned_slots
from magicdec_jax.drafts import ModelDraft, StreamingDraft, truncate_layers
from magicdec_jax.generation import generate

from conftest import xla_flags

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(HERE)
MESHES = ("data:1,model:8", "data:2,model:4", "data:4,model:2", "data:8,model:1")
SMOL_MESHES = ("data:1,model:8", "data:4,model:2", "data:8,model:1")     # as sharding_worker.SMOL_MESHES


def worker(which: str) -> dict:
  """sharding_worker.py's facts for `which` model ("tiny", "family" or "smollm2"; "auto": plans only), from an
  8-device subprocess."""
  env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"), JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))   # this checkout's code
  with tempfile.TemporaryDirectory(prefix="shard_worker_") as tmp:
    r = subprocess.run([sys.executable, os.path.join(HERE, "sharding_worker.py"), which, tmp], env=env,
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
  lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
  assert r.returncode == 0 and lines, f"worker failed (rc {r.returncode}):\n{r.stderr[-4000:]}"
  out = json.loads(lines[-1][len("RESULT "):])
  print(f"{which} worker: {out['seconds']:.0f}s {out.get('timings')}\ncollectives: "
        f"{json.dumps(out.get('collectives'), indent=1)}")
  assert out["devices"] == 8
  return out


def check_same_on_every_mesh(results: dict, meshes=MESHES):
  for case, by_mesh in results.items():
    for mesh in meshes:
      assert by_mesh[mesh] == by_mesh["ref"], f"{case} on {mesh}: {by_mesh[mesh]} != {by_mesh['ref']}"


def check_collectives(c: dict):
  """Row-parallel o/down projections need all-reduces; the KV cache itself is never gathered inside the
  decode loop (a cache-sized all-gather may appear once after it, where a layout is re-established)."""
  assert c["decode"].get("all-reduce", 0) >= 2, c["decode"]
  print("big all-gathers in decode:", c["big_gathers"])
  assert c["cache_gathers_in_loop"] == 0, (c["big_gathers"], c["decode_by_op"])


# One test per model: each runs one subprocess (compilation dominates; ~2 minutes on 2 CPU cores), so
# under pytest-xdist the two can run side by side.

# slow: on the 2-vCPU Intel VM of 2026-11-24 the default suite took 96 min (CI allows 90); run with -m slow
def test_gamma_auto_prices_the_rows_one_device_holds():
  """On data:8 each device decodes 8 of the 64 rows: gamma="auto" plans as one device with 8 rows does (here
  plain decoding), not as one device with all 64 (a chain: the KV read would dominate)."""
  a = worker("auto")["auto"]
  assert a["mesh"] == a["device_rows"] and a["mesh"] != a["whole_batch"]


@pytest.mark.slow
def test_tiny_model_on_every_mesh():
  """Greedy AR / chain / tree and fixed-seed sampling on 1x8, 2x4, 4x2, 8x1; the Pallas kernel under
  shard_map; compiled collectives; orbax restore into shards; planner vs shard bytes; refusal."""
  out = worker("tiny")
  # 8 heads on 2 KV heads: head-split and KV-replicated ("q_heads") layouts
  assert out["layouts"] == {"data:1,model:8": "q_heads", "data:2,model:4": "q_heads",
                            "data:4,model:2": "heads", "data:8,model:1": "heads"}
  assert set(out["greedy"]) == {"ar", "chain", "tree"}
  check_same_on_every_mesh(out["greedy"])
  for case in ("chain", "tree"):              # drafts are rejected sometimes: every verify path runs
    assert 0 < out["greedy"][case]["acceptance"] < 1, out["greedy"][case]["acceptance"]

  check_same_on_every_mesh(out["sampling"])
  check_same_on_every_mesh(out["feature"])           # the feature-head draft: greedy chain / tree, sampled
  assert out["feature"]["greedy_chain"]["ref"] == out["greedy"]["chain"]["ref"]       # = autoregressive
  assert out["feature"]["sampled_chain"]["acceptance"] > 0
  assert out["sampling"]["chain_t0.8"]["ref"] != out["greedy"]["chain"]["ref"]     # really sampled
  # invariant sampling: a speculative tree on every mesh gives plain decoding's samples
  assert out["sampling"]["tree_invariant"]["ref"] == out["sampling"]["ar_invariant"]["ref"]
  check_same_on_every_mesh(out["pallas"], meshes=("data:2,model:4",))               # vs one-device XLA
  # int8 / int4 draft weights split as their parameters: plain decoding's tokens on both layouts
  check_same_on_every_mesh(out["quantized"], meshes=("data:2,model:4", "data:4,model:2"))
  # a packed int4 copy through the Pallas kernel: per shard over data (8x1), XLA's fallback with a model axis
  kernel = out["int4_kernel"]
  assert kernel.pop("packed_matrices") == 2                          # o in each of the 2 layers
  check_same_on_every_mesh(kernel, meshes=("data:8,model:1", "data:2,model:4"))

  c = out["collectives"]                       # 2x4: rows split over data, q heads over model
  check_collectives(c)
  assert c["cache_shard_shape"][0] * 2 == c["cache_shape"][0]     # one layer's [B, K, S, D] buffer

  o = out["orbax"]
  assert o["bad"] == []
  assert o["q_spec"] == "P(None, 'model', None)"
  assert o["q_shard_shape"] == [32, 2, 8] and o["num_devices_q"] == 8   # layer 0: 8 heads / 4 model devices

  for name, facts in out["planner"].items():
    for key, direct in facts["direct"].items():
      assert facts["plan"][key] == direct, f"{name}: planner {key} {facts['plan'][key]} != direct {direct}"
    assert facts["plan"]["activations"] > 0

  r = out["refusal"]
  assert r["refused"] and r["new_jits"] == 0, r
  assert "not supported with a mesh of several devices" in r.get("shrink_refused", ""), r
  for part in ("params", "target KV", "draft KV", "activations", "data:2,model:4", "10000 bytes"):
    assert part in r["message"]


# slow: on the 2-vCPU Intel VM of 2026-11-24 the default suite took 96 min (CI allows 90); run with -m slow
@pytest.mark.slow
def test_smollm2_on_every_mesh():
  """SmolLM2 (9 heads, 3 KV heads): greedy AR / chain / tree on 1x8, 4x2, 8x1 (sharding_worker.SMOL_MESHES;
  2x4 is the same replicated layout as 4x2 and runs on the tiny model)."""
  out = worker("smollm2")
  # attention replicated over 2 and 8 model devices; MLP and vocabulary still split
  assert out["layouts"] == {"data:1,model:8": "replicated", "data:4,model:2": "replicated",
                            "data:8,model:1": "heads"}
  assert set(out["greedy"]) == {"ar", "chain", "tree"}
  check_same_on_every_mesh(out["greedy"], meshes=SMOL_MESHES)
  assert all(len(t) == 4 for t in out["greedy"]["chain"]["ref"])
  c = out["collectives"]                       # 1x8: attention (and its cache) replicated over model
  check_collectives(c)
  assert c["cache_shard_shape"] == c["cache_shape"]


# slow: ~500 s of the default run's ~55 min on the 2-vCPU VM; meshes stay in the default run through
# tests/requests/test_stream.py (tokens on meshes = one device) and the family features single-device
@pytest.mark.slow
def test_family_model_on_every_mesh():
  """A tiny model with every family feature (q/k/v/o biases and q/k norms sharded by head, Gemma's norms,
  GeGLU, soft-caps, a local layer whose target cache is a ring): greedy AR and a chain on 1x8, 2x4, 4x2,
  8x1, and continuous batching with refills on 2x4, equal single-device plain decoding."""
  out = worker("family")
  assert out["ring_slots"] == [272, 576]                # the local layer keeps window + 256 slots
  check_same_on_every_mesh(out["greedy"])
  assert len(set(out["greedy"]["ar"]["ref"][0])) > 3 and 0 < out["chain_acceptance"] < 1
  assert out["stream"]["got"] == out["stream"]["ref"]     # generate_stream on 2x4, refilled: sharded inserts
  rep, split = "P(None,)", "P('model',)"
  for mesh, kv in (("data:2,model:4", rep), ("data:4,model:2", split)):      # q_heads, then heads layout
    assert out["specs"][mesh] == {"['q_bias']": split, "['k_bias']": kv, "['v_bias']": kv, "['o_bias']": rep,
                                  "['q_norm']['scale']": rep, "['k_norm']['scale']": rep}, out["specs"][mesh]


def test_planner_single_device_and_refusal_in_process():
  """One device (this process): exact parameter bytes, and generate refuses an oversize batch."""
  model = testing.random_tiny_model(0)
  cfg = model.config
  nbytes = sum(a.nbytes for a in jax.tree.leaves(model.params))
  assert sharding.plan_memory(cfg, None, batch=1, max_context=64).params == nbytes
  plan = sharding.plan_memory(cfg, None, batch=4, max_context=64, draft=StreamingDraft(sink=1, window=8),
                              tree_nodes=4)
  ring = 2 * cfg.num_layers * 4 * cfg.num_kv_heads * aligned_slots(1 + 8 + 4) * cfg.head_dim * 4 + 4 * 9 * 4
  assert plan.target_kv == 2 * cfg.num_layers * 4 * cfg.num_kv_heads * 64 * cfg.head_dim * 4
  assert plan.draft_kv == ring
  draft = ModelDraft(truncate_layers(model, 1), sink=1, window=8)
  assert sharding.plan_memory(cfg, None, batch=1, max_context=64, draft=draft).draft_params == \
      sum(a.nbytes for a in jax.tree.leaves(draft.model.params))
  with pytest.raises(ValueError, match=r"does not fit device memory.*target KV"):
    generate(model, [[1, 2, 3]] * 64, max_new_tokens=512, device_memory=plan.params * 2)


def test_mesh_spec_errors():
  for bad, fragment in (("data:2,modle:4", "unknown axis 'modle'"), ("data:x", "'x'"),
                        ("data:0", "must be >= 1"), ("data:2,data:1", "given twice"), ("model", "AXIS:SIZE"),
                        ("data:3,model:3", "9 devices, but there are 8"), ("data:3", "does not divide")):
    with pytest.raises(ValueError, match=fragment):
      sharding.parse_mesh(bad, 8)
  assert sharding.parse_mesh("model:4", 8) == {"data": 2, "model": 4}
  assert sharding.parse_mesh(" data:8 ", 8) == {"data": 8, "model": 1}
  mesh = sharding.make_mesh("data:1,model:1")
  assert mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2
  d = jax.devices()[0]
  for devices in ([], [d, d], ["cpu:0"]):
    with pytest.raises(ValueError, match="devices must be distinct jax devices"):
      sharding.make_mesh("data:1", devices=devices)
  explicit = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  with pytest.raises(ValueError, match="mesh axes must be Auto"):
    generate(testing.random_tiny_model(0), [[1, 2, 3]], max_new_tokens=2, mesh=explicit)


def test_layouts_for_any_model_axis():
  """SmolLM2's shape (9 heads, 3 KV heads) gets a valid layout on 1..8 model devices."""
  from magicdec_jax.tuning import shapes
  smol = testing.random_tiny_model(0).config.replace(num_heads=9, num_kv_heads=3, hidden_size=576,
                                                       intermediate_size=1536, vocab_size=49152)
  got = {m: sharding.layout_for(smol, m).attention for m in range(1, 9)}
  assert got == {1: "heads", 2: "replicated", 3: "heads", 4: "replicated", 5: "replicated",
                 6: "replicated", 7: "replicated", 8: "replicated"}
  assert [sharding.layout_for(smol, m).mlp for m in range(1, 9)] == [True, True, True, True, False, True,
                                                                      False, True]
  llama = shapes.model_shape("llama31_8b")          # 32 heads, 8 KV heads
  assert all(sharding.layout_for(llama, m).attention == "heads" for m in (1, 2, 4, 8))
  assert sharding.layout_for(llama, 16).attention == "q_heads"


# ---- multi-host datagen --------------------------------------------------------------------------------

def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_datagen_equals_one_process(tmp_path):
  inp = tmp_path / "in.jsonl"
  with open(inp, "w") as f:
    for i in range(6):
      f.write(json.dumps({"id": f"r{i}", "prompt": f"record {i}: " + "abc " * i}) + "\n")
  gen = dict(max_new_tokens=6, draft=StreamingDraft(sink=1, window=8), gamma=2, temperature=1.0, seed=3)
  flags_ = ["--model=random-tiny", f"--input={inp}", "--max_new_tokens=6", "--draft=streaming", "--sink=1",
            "--window=8", "--gamma=2", "--temperature=1.0", "--seed=3", "--batch_size=2", "--noprogress",
            "--mode=datagen"]
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = xla_flags("")
  procs = [subprocess.Popen([sys.executable, "run.py", *flags_, f"--output={tmp_path / 'multi.jsonl'}",
                             f"--coordinator_address=localhost:{port}", "--num_processes=2",
                             f"--process_id={i}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, (so, se) in zip(procs, outs):
    assert p.returncode == 0, se[-3000:]
  summary = json.loads(outs[0][0][outs[0][0].index("{"):])     # (gloo may print a line first)
  assert summary["shards"] == 2 and summary["records_total"] == 6
  assert summary["records_per_shard"] == [3, 3]
  # the reference: one process, here
  datagen.run(testing.random_tiny_model(0), str(inp), str(tmp_path / "one.jsonl"), batch_size=2,
              progress=False, **gen)
  read = lambda p: [json.loads(x) for x in open(p)]
  multi, one = read(tmp_path / "multi.jsonl"), read(tmp_path / "one.jsonl")
  key = lambda r: (r["id"], r["sample"])
  assert [r["id"] for r in multi] == [f"r{i}" for i in range(6)]                # merged in input order
  assert sorted(multi, key=key) == sorted(one, key=key)
  shard0 = read(str(tmp_path / "multi.jsonl") + ".shard-00000-of-00002")
  assert [r["id"] for r in shard0] == ["r0", "r2", "r4"]                        # split by process index
