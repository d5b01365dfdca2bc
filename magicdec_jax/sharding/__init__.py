"""Tensor / data parallelism on a ("data", "model") mesh, the memory planner, and multi-host helpers.

  mesh = sharding.make_mesh("data:2,model:4")
  model = sharding.shard_model(model, mesh)            # params into their shards, once
  res = magicdec_jax.generate(model, prompts, max_new_tokens=64, draft=..., mesh=mesh)

mesh.py (meshes from flags), rules.py (partition rules), runtime.py (sharded prefill / decode / slot insert),
kernels.py (Pallas under shard_map), planner.py (bytes per device), distributed.py (jax.distributed,
per-process datagen shards and their merge).
"""
from magicdec_jax.sharding.mesh import AXES, DATA, MODEL, axis_sizes, describe, make_mesh, parse_mesh
from magicdec_jax.sharding.planner import DoesNotFit, MemoryPlan, check_fits, device_memory, plan_memory
from magicdec_jax.sharding.rules import (ModelLayout, abstract_param_shardings, layout_for,
                                         param_shardings)
from magicdec_jax.sharding.runtime import (count_collectives, compiled_text, decode, empty_state, insert,
                                           load_orbax_sharded, pad_batch, place_params, prefill, shard_model)
