"""Sharded prefill and decode: loop.prefill / loop.decode compiled with jit in/out shardings on a mesh.

The loop code is single-device code; these wrappers jit it with every input and output pinned to the
partition rules (rules.py) and let XLA's SPMD partitioner insert the collectives. Decoding stays one
`lax.while_loop` in one executable; the donated LoopState keeps its caches in place, shard by shard.
Calls run under `jax.set_mesh(mesh)` so code that needs the mesh at trace time (the Pallas kernel's
shard_map, kernels.py) finds it. Executables are compiled ahead of time (lower().compile()) and cached
per static configuration and argument signature in the engine's bounded executable LRU (compile.py), so
the HLO that `compiled_text` shows is the one run (while it is kept).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from magicdec_jax import checkpoints, loop, slots
from magicdec_jax import compile as compiling
from magicdec_jax.config import ModelConfig
from magicdec_jax.sharding import kernels, rules   # kernels: the Pallas kernel runs per shard
from magicdec_jax.sharding.mesh import DATA, axis_sizes

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def pad_batch(b: int, mesh: Mesh | None) -> int:
  """The batch bucket rounded up to a multiple of the data axis (every data shard gets whole rows)."""
  d = 1 if mesh is None else axis_sizes(mesh)[0]
  return -(-b // d) * d


def layouts(mesh: Mesh, cfg: ModelConfig, spec) -> tuple[rules.ModelLayout, rules.ModelLayout | None]:
  """(target layout, draft-ring layout): self drafts share the target's, a draft network has its own,
  a draft without one (prompt lookup) none."""
  m = axis_sizes(mesh)[1]
  target = rules.layout_for(cfg, m)
  dcfg = None if spec is None else spec.network_config(cfg)
  return target, None if dcfg is None else rules.layout_for(dcfg, m)


def place_params(params: Any, cfg: ModelConfig, mesh: Mesh) -> Any:
  """params device_put into their shards (a no-op for arrays already placed so)."""
  return jax.device_put(params, rules.param_shardings(params, cfg, mesh))


def shard_model(model, mesh: Mesh):
  """A copy of `model` whose params live in their shards on `mesh` (do this once, not per call)."""
  return dataclasses.replace(model, params=place_params(model.params, model.config, mesh))


def load_orbax_sharded(directory: str, mesh: Mesh, dtype: str | None = None):
  """checkpoints.load_orbax with every param restored straight into its tensor-parallel shard on `mesh`
  (rules.py): each device reads only its slice, no full host copy is ever made."""
  cfg = checkpoints._orbax_config(os.path.abspath(directory), dtype)
  return checkpoints.load_orbax(directory, dtype, shardings=rules.abstract_param_shardings(cfg, mesh))


def _param_sh(mesh, cfg, spec, target_params, draft_params):
  tp = rules.param_shardings(target_params, cfg, mesh)
  dcfg = None if spec is None else spec.network_config(cfg)   # a self draft's (narrower) copy: the target's
  dp = None if draft_params is None else rules.param_shardings(draft_params, dcfg, mesh)
  return tp, dp


def _state_sh(tree, mesh, tl, rl):
  return rules.shardings(tree, mesh, lambda keys, ndim: rules.state_spec(keys, ndim, tl, rl))


def _prefill_fn(mesh, target_params, draft_params, tokens, lengths, *, cfg, spec, tree, num_slots, chunk,
                impl, options=None):
  tl, rl = layouts(mesh, cfg, spec)
  row = NamedSharding(mesh, rules.fit(P(DATA), lengths.shape, mesh))
  tok = NamedSharding(mesh, rules.fit(P(DATA, None), tokens.shape, mesh))
  in_sh = (*_param_sh(mesh, cfg, spec, target_params, draft_params), tok, row)
  key = ("prefill", mesh, cfg, spec, tree, num_slots, chunk, impl,
         compiling.signature(target_params, draft_params, tokens, lengths))
  args = jax.device_put((target_params, draft_params, tokens, lengths), in_sh)

  def lower():
    fn = functools.partial(loop.prefill.__wrapped__, cfg=cfg, spec=spec, tree=tree, num_slots=num_slots,
                           chunk=chunk, impl=impl)
    out = jax.eval_shape(fn, *args)
    return jax.jit(fn, in_shardings=in_sh, out_shardings=_state_sh(out, mesh, tl, rl)).lower(*args)

  return compiling.executable(key, lower, options), args


def _decode_fn(mesh, target_params, draft_params, state, *, cfg, spec, tree, sampling, impl, options=None):
  tl, rl = layouts(mesh, cfg, spec)
  st = _state_sh(state, mesh, tl, rl)
  in_sh = (*_param_sh(mesh, cfg, spec, target_params, draft_params), st)
  key = ("decode", mesh, cfg, spec, tree, sampling, impl,
         compiling.signature(target_params, draft_params, state))
  args = jax.device_put((target_params, draft_params, state), in_sh)

  def lower():
    fn = functools.partial(loop.decode.__wrapped__, cfg=cfg, spec=spec, tree=tree, sampling=sampling,
                           impl=impl)
    return jax.jit(fn, in_shardings=in_sh, out_shardings=st, donate_argnums=2).lower(*args)

  return compiling.executable(key, lower, options), args


def prefill(mesh: Mesh, target_params, draft_params, tokens, lengths, **static):
  """loop.prefill on `mesh`: same arguments; caches come back split per rules.state_spec."""
  with jax.set_mesh(mesh):
    fn, args = _prefill_fn(mesh, target_params, draft_params, tokens, lengths, **static)
    return fn(*args)


def decode(mesh: Mesh, target_params, draft_params, state, **static):
  """loop.decode on `mesh` (the state is donated), every LoopState leaf split per rules.state_spec."""
  with jax.set_mesh(mesh):
    fn, args = _decode_fn(mesh, target_params, draft_params, state, **static)
    return fn(*args)


def empty_state(mesh: Mesh, eos, *, cfg, spec, tree, options=None, **static):
  """slots.empty_state built straight into its shards (each device allocates only its part of the caches)."""
  tl, rl = layouts(mesh, cfg, spec)
  fn = functools.partial(slots.empty_state, cfg=cfg, spec=spec, tree=tree, **static)
  key = ("empty_state", mesh, cfg, spec, tree, tuple(sorted(static.items())), compiling.signature(eos))
  eos = jax.device_put(eos, NamedSharding(mesh, P()))

  def lower():
    return jax.jit(fn, out_shardings=_state_sh(jax.eval_shape(fn, eos), mesh, tl, rl)).lower(eos)

  with jax.set_mesh(mesh):
    return compiling.executable(key, lower, options)(eos)


def insert(mesh: Mesh, state, target, ring, *rest, cfg, spec, options=None):
  """slots.insert on `mesh`: the donated state keeps its shardings (caches split per rules.state_spec), the
  prefilled rows come in as sharded by `prefill`, the slot / row / stream arrays are replicated."""
  tl, rl = layouts(mesh, cfg, spec)
  st = _state_sh(state, mesh, tl, rl)
  pre = rules.shardings((target, ring), mesh, lambda keys, ndim: rules.state_spec(keys, ndim, tl, rl))
  rep = tuple(NamedSharding(mesh, P()) for _ in rest)
  in_sh = (st, *pre, *rep)
  args = jax.device_put((state, target, ring, *rest), in_sh)
  key = ("insert", mesh, cfg, spec, compiling.signature(*args))

  def lower():
    fn = functools.partial(slots.insert, spec=spec)
    return jax.jit(fn, in_shardings=in_sh, out_shardings=st, donate_argnums=0).lower(*args)

  with jax.set_mesh(mesh):
    return compiling.executable(key, lower, options)(*args)


def compiled_text(kind: str, mesh: Mesh, *args, **static) -> str:
  """The optimized HLO of the sharded "prefill" or "decode" for these arguments (compiled once and
  cached: a later call with the same configuration runs this very executable)."""
  make = {"prefill": _prefill_fn, "decode": _decode_fn}[kind]
  with jax.set_mesh(mesh):
    compiled, _ = make(mesh, *args, **static)
    return compiled.as_text()


def count_collectives(hlo_text: str) -> dict[str, int]:
  """Collective ops in an HLO module's text: {"all-reduce": n, ...} (async start/done pairs count once)."""
  out = {}
  for op in COLLECTIVES:
    n = len(re.findall(rf" {op}(?:-start)?\(", hlo_text))
    if n:
      out[op] = n
  return out
