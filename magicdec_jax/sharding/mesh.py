"""Device meshes with a data axis and a model axis, built from strings such as "data:2,model:4".

Axes are `AxisType.Auto`: shardings are hints that XLA's partitioner (GSPMD/Shardy) propagates through
the whole program, so the model code stays unannotated single-device code. "data" splits the batch,
"model" splits heads / MLP columns / vocabulary (tensor parallelism).
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)


def parse_mesh(spec: str, num_devices: int) -> dict[str, int]:
  """"data:2,model:4" -> {"data": 2, "model": 4}; a missing axis takes the remaining devices.

  Raises ValueError naming the bad part: unknown axis, repeated axis, non-integer or < 1 size, or sizes
  whose product is not the device count.
  """
  if not isinstance(spec, str) or not spec.strip():
    raise ValueError(f"mesh spec must be a string like 'data:2,model:4', got {spec!r}")
  sizes: dict[str, int] = {}
  for part in spec.split(","):
    name, sep, value = part.strip().partition(":")
    name = name.strip()
    if not sep:
      raise ValueError(f"mesh spec {spec!r}: {part.strip()!r} is not AXIS:SIZE (axes: data, model)")
    if name not in AXES:
      raise ValueError(f"mesh spec {spec!r}: unknown axis {name!r} (axes: data, model)")
    if name in sizes:
      raise ValueError(f"mesh spec {spec!r}: axis {name!r} given twice")
    try:
      size = int(value.strip())
    except ValueError:
      raise ValueError(f"mesh spec {spec!r}: size {value.strip()!r} of axis {name!r} is not an "
                       "integer") from None
    if size < 1:
      raise ValueError(f"mesh spec {spec!r}: size {size} of axis {name!r} must be >= 1")
    sizes[name] = size
  given = math.prod(sizes.values())
  missing = [a for a in AXES if a not in sizes]
  if missing:
    if num_devices % given:
      raise ValueError(f"mesh spec {spec!r}: {given} does not divide the {num_devices} devices")
    sizes[missing[0]] = num_devices // given
    for a in missing[1:]:
      sizes[a] = 1
  total = sizes[DATA] * sizes[MODEL]
  if total != num_devices:
    raise ValueError(f"mesh spec {spec!r}: data:{sizes[DATA]} x model:{sizes[MODEL]} = {total} devices, "
                     f"but there are {num_devices}")
  return {a: sizes[a] for a in AXES}


def make_mesh(spec: str | dict | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ("data", "model") Auto mesh over `devices` (default: this process's devices; a mesh spans one
  process, hosts split the data, see distributed.py).

  spec: "data:D,model:M" (either may be omitted), a {"data": D, "model": M} dict, or None (1 x all).
  """
  devices = list(jax.local_devices() if devices is None else devices)
  if not devices or not all(isinstance(d, jax.Device) for d in devices) or len(set(devices)) != len(devices):
    raise ValueError(f"devices must be distinct jax devices, at least one, got {devices!r:.120}")
  if spec is None:
    sizes = {DATA: 1, MODEL: len(devices)}
  elif isinstance(spec, dict):
    sizes = parse_mesh(",".join(f"{k}:{v}" for k, v in spec.items()), len(devices))
  else:
    sizes = parse_mesh(spec, len(devices))
  return jax.make_mesh((sizes[DATA], sizes[MODEL]), AXES, axis_types=(AxisType.Auto, AxisType.Auto),
                       devices=devices)


def axis_sizes(mesh: Mesh) -> tuple[int, int]:
  """(data size, model size) of a mesh made by make_mesh (a missing axis counts as 1)."""
  shape = dict(mesh.shape)
  unknown = set(shape) - set(AXES)
  if unknown:
    raise ValueError(f"mesh axes must be among {AXES}, got {tuple(shape)}")
  return shape.get(DATA, 1), shape.get(MODEL, 1)


def describe(mesh: Mesh) -> str:
  d, m = axis_sizes(mesh)
  return f"data:{d},model:{m}"
