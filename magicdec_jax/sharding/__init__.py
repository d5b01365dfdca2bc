"""Tensor / data parallelism on a ("data", "model") mesh, the memory planner, and multi-host helpers.

  mesh = sharding.make_mesh("data:2,model:4")
  model = sharding.shard_model(model, mesh)            # params into their shards, once
  res = magicdec_jax.generate(model, prompts, max_new_tokens=64, draft=..., mesh=mesh)

Every run executes on a mesh (one device: a 1 x 1 mesh, plan.one_device_mesh); the engine compiles its
steps with the shardings these rules give. mesh.py (meshes from flags), rules.py (partition rules, placing
params), kernels.py (Pallas under shard_map), planner.py (bytes per device), distributed.py
(jax.distributed, per-process datagen shards and their merge).
"""
from magicdec_jax.sharding import kernels     # injects the Pallas kernel's per-shard wrapper
from magicdec_jax.sharding.mesh import AXES, DATA, MODEL, axis_sizes, describe, make_mesh, parse_mesh
from magicdec_jax.sharding.planner import DoesNotFit, MemoryPlan, check_fits, device_memory, plan_memory
from magicdec_jax.sharding.rules import (ModelLayout, abstract_param_shardings, layout_for, param_shardings,
                                         place_params, shard_model)
