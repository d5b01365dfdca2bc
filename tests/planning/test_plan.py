"""Plan once, run on a mesh: the DecodePlan is a frozen value every driver makes through make_plan, and the
engine executes it on one execution path (a 1 x 1 mesh on one device). References: plain autoregressive
decoding of the same prompts, and the plan's inputs (nothing the plan computes is checked against itself)."""
from __future__ import annotations

import ast
import dataclasses
import os

import jax
import pytest

import magicdec_jax as md
from magicdec_jax import backend, plan, prefilled, sharding, testing
from magicdec_jax.trees import AR_TREE, Tree

from conftest import tiny_model

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "magicdec_jax")


def _model():
  return testing.random_tiny_model(0)


def test_a_plan_is_frozen_and_replanning_returns_a_new_one():
  model = _model()
  st = md.DecodeSettings(max_new_tokens=16, draft=md.StreamingDraft(sink=1, window=8), gamma="auto",
                         auto_fallback=False, hardware="h100")
  p = md.make_plan(model, st, batch=4, shortest=100, longest=900)
  assert isinstance(p, md.DecodePlan) and p.variants is not None and p.learn
  with pytest.raises(dataclasses.FrozenInstanceError):
    p.tree = AR_TREE
  before = (p.thresholds, p.tree, p.variants)
  new, band = plan.replan(p, 0.3, 500)
  assert (p.thresholds, p.tree, p.variants) == before              # the old plan is untouched
  assert new is not p and new.variants == p.variants and isinstance(band, list)
  assert p.contexts == (100, 900 + 16) and p.batch == 4            # what it was asked for
  fixed = md.make_plan(model, dataclasses.replace(st, gamma=2, hardware=None), batch=4, shortest=100, longest=900)
  with pytest.raises(ValueError, match="replan re-prices a learning chain plan .* learn=False"):
    plan.replan(fixed, 0.3, 500)


def test_a_profile_measured_on_another_device_is_named_when_auto_prices_with_it(tmp_path):
  """gamma / tree = "auto" with a hardware profile from another device (or, on a CPU, another CPU model)
  warns, naming both; a profile of this device and host is used silently."""
  import json
  import warnings
  from magicdec_jax.tuning import profiles, stepfit
  dev = jax.devices()[0]
  here = f"{dev.platform}:{dev.device_kind}"
  fit = stepfit.FittedHardware("fake", (1e-3, 1e-5, 1e-11, 0.0, 1e-12, 0.0, 3e-10, 1e-12)).to_dict()
  with open("/proc/cpuinfo") as f:               # this host's CPU model, read here as the profile's writer does
    cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.lower().startswith("model name")), None)
  model = _model()
  for name, device, cpu_model, words in (("gpu", "gpu:NVIDIA H100 80GB HBM3", cpu, "measured on 'gpu:NVIDIA H100"),
                                         ("othercpu", here, "Some Other CPU", "measured on the CPU 'Some Other"),
                                         ("here", here, cpu, None)):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"format": profiles.PROFILE_FORMAT, "fit": fit, "device": device,
                                "cpu_model": cpu_model}))
    for kw in (dict(gamma="auto"), dict(tree="auto")):
      st = md.DecodeSettings(max_new_tokens=8, draft=md.StreamingDraft(sink=1, window=8), hardware=str(path), **kw)
      with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        md.make_plan(model, st, batch=2, shortest=20, longest=40)
      said = [str(w.message) for w in seen if "hardware profile" in str(w.message)]
      if words is None:
        assert said == []
      else:
        assert len(said) == 1 and words in said[0] and str(path) in said[0], said
        assert (here if name == "gpu" else repr(cpu)) in said[0]


def test_fixed_settings_plan_what_was_asked():
  model = _model()
  draft = md.StreamingDraft(sink=1, window=8)
  p = md.make_plan(model, md.DecodeSettings(max_new_tokens=8, draft=draft, gamma=2), batch=3, shortest=5, longest=9)
  assert p.tree == Tree.chain(2) and p.variants is None and p.thresholds is None and p.draft is draft
  ar = md.make_plan(model, md.DecodeSettings(max_new_tokens=8), batch=3, shortest=5, longest=9)
  assert ar.tree == AR_TREE and ar.draft is None and ar.eos == tuple(model.config.eos_token_ids)
  assert p.batch_rows(3) == 4 and p.prompt_bucket(9) == 16                # either numerics
  with pytest.raises(ValueError, match="batch"):
    md.make_plan(model, md.DecodeSettings(max_new_tokens=8), batch=0, shortest=1, longest=2)
  with pytest.raises(ValueError, match="DecodePlan"):
    md.Engine(model, md.DecodeSettings(max_new_tokens=8))


def test_fixed_shapes_refuse_a_round_deeper_than_their_tail():
  """Invariant numerics verify a round from a canonical tail of (tail_blocks - 1) x key_block slots: a
  chain one deeper is refused by name before anything compiles; fast numerics take it."""
  model, draft = _model(), md.StreamingDraft(sink=1, window=64)
  fixed = backend.fixed_shapes()
  deep = (fixed.tail_blocks - 1) * fixed.key_block + 1
  st = md.DecodeSettings(max_new_tokens=8, draft=draft, gamma=deep, numerics="invariant")
  with pytest.raises(ValueError, match=f"depth {deep} exceeds"):
    md.make_plan(model, st, batch=2, shortest=5, longest=9)
  md.make_plan(model, st.replace(gamma=deep - 1), batch=2, shortest=5, longest=9)
  md.make_plan(model, st.replace(numerics="fast"), batch=2, shortest=5, longest=9)


def test_a_prefills_disabled_passes_add_to_the_decodes():
  """XLA takes one list of disabled HLO passes: a prefill option or a call's xla_options naming more passes
  disables them besides the fixed shapes' (a plain dict merge would have switched those back on); other
  options replace."""
  fixed = dataclasses.replace(backend.CPU, xla_options=(("xla_disable_hlo_passes", "a"), ("x", 1)),
                              prefill_xla_options=(("xla_disable_hlo_passes", "b"), ("x", 2), ("y", 3)))
  assert fixed.compiler_options() == {"xla_disable_hlo_passes": "a", "x": 1}
  assert fixed.compiler_options(prefill=True) == {"xla_disable_hlo_passes": "a,b", "x": 2, "y": 3}
  # so do a call's own xla_options: the plan's executables keep the fixed shapes' disabled passes
  model = _model()
  st = md.DecodeSettings(max_new_tokens=4, numerics="invariant", xla_options={"xla_disable_hlo_passes": "dce"})
  p = md.make_plan(model, st, batch=1, shortest=5, longest=5)
  for opts, prefill in ((p.options, False), (p.prefill_options, True)):
    want = backend.fixed_shapes().compiler_options(prefill)["xla_disable_hlo_passes"].split(",") + ["dce"]
    assert dict(opts)["xla_disable_hlo_passes"].split(",") == want


def test_one_execution_path_a_one_by_one_mesh():
  """Without a mesh the plan holds a 1 x 1 mesh, the engine's outputs live on it, and the tokens are those of
  an explicit 1 x 1 mesh and of plain decoding."""
  model = _model()
  prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5]]
  p = md.make_plan(model, md.DecodeSettings(max_new_tokens=6), batch=2, shortest=3, longest=8)
  assert sharding.axis_sizes(p.mesh) == (1, 1) and p.mesh.devices.size == 1
  eng = md.Engine(model, p)
  tokens, lengths = (jax.numpy.asarray(x) for x in md.prompts.pad_prompts(prompts, 2, 16))
  target, ring = eng.prefill(tokens, lengths, p.num_slots(16))
  assert ring is None and isinstance(target.k[0].sharding, jax.sharding.NamedSharding)
  assert target.k[0].sharding.mesh == p.mesh
  ref = md.generate(model, prompts, max_new_tokens=6)
  mesh = sharding.make_mesh("data:1,model:1", devices=jax.devices()[:1])
  sd = md.generate(model, prompts, max_new_tokens=6, draft=md.StreamingDraft(sink=1, window=4), gamma=2,
                   mesh=mesh)
  assert sd.tokens == ref.tokens


def test_prefilled_plans_auto_too():
  """prefilled.decode plans gamma="auto" for its batch (it refused it before): plain decoding's tokens."""
  model = _model()
  prompts = [[7, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 3, [4, 4, 2] * 5]
  pre = prefilled.prefill(model, prompts, max_new_tokens=8, chunk=16, progress=False)
  ar = prefilled.decode(model, pre)
  auto = prefilled.decode(model, pre, draft=md.StreamingDraft(sink=1, window=4), gamma="auto")
  assert auto.tokens == ar.tokens == md.generate(model, prompts, max_new_tokens=8).tokens


def test_datagen_fingerprint_holds_the_plan(tmp_path):
  """datagen plans over its whole input once; the fingerprint names the tree it planned."""
  from magicdec_jax import datagen, datagen_formats
  model = _model()
  items = [datagen_formats.Item(line=i + 1, id=str(i), key=f'"{i}"', ids=[1 + i] * (5 + i), truncated=0)
           for i in range(3)]
  st = md.DecodeSettings(max_new_tokens=4, draft=md.StreamingDraft(sink=1, window=4), gamma=2, temperature=0.8)
  p = datagen_formats.plan_over(model, st, items, 2, None)
  fp = datagen.fingerprint(model, p)
  assert fp["tree"] == repr(Tree.chain(2)) and "gamma" not in fp and fp["draft"] == repr(st.draft)


def test_the_engine_is_not_rewritten_and_has_one_path():
  """No `resolve_auto`, no `mesh is not None` branch in the engine, no attribute set on an Engine from outside."""
  src = open(os.path.join(ROOT, "engine.py"), encoding="utf-8").read()
  assert "resolve_auto" not in src and "mesh is not None" not in src and "mesh is None" not in src
  for dirpath, _, files in os.walk(ROOT):
    for f in files:
      if f.endswith(".py"):
        tree = ast.parse(open(os.path.join(dirpath, f), encoding="utf-8").read())
        for node in ast.walk(tree):
          if isinstance(node, ast.Attribute) and node.attr == "resolve_auto":
            raise AssertionError(f"{f}:{node.lineno} uses resolve_auto")
          if isinstance(node, ast.Assign):
            for t in node.targets:
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("eng", "engine"):
                raise AssertionError(f"{f}:{node.lineno} sets {t.value.id}.{t.attr} from outside the Engine")


def test_tree_auto_never_picks_a_node_wider_than_the_vocabulary():
  """A vocabulary of 4 and an acceptance vector of 8 entries: the cost model would build a node of 7
  children, which no draft can fill with distinct tokens (a given tree that wide is refused by name)."""
  model = tiny_model(0, vocab=4)
  vec = [0.3, 0.15, 0.12, 0.1, 0.08, 0.07, 0.06, 0.05]
  st = md.DecodeSettings(max_new_tokens=24, draft=md.StreamingDraft(1, 8), tree="auto", hardware="h100",
                         acceptance=vec, auto_fallback=False)
  p = md.make_plan(model, st, batch=64, shortest=33, longest=60, fixed_batch=True)
  assert 1 < p.tree.max_width <= 4
  with pytest.raises(ValueError, match="a node of 7 children, more than the vocabulary's 4 tokens"):
    md.make_plan(model, st.replace(tree=Tree((-1,) + (0,) * 7), hardware=None, acceptance=None), batch=64,
                 shortest=33, longest=60)
