"""`traced_once(fn, *args)`: fn(*args) inside a traced program, traced once per static values and argument
shapes and inlined wherever it is called again.

Why: a model's layers, a draft's steps and the layers of every forward pass in a decode loop call the same
function on arguments of the same shapes; tracing each call again is most of a compile's Python time (the
30 layers of SmolLM2-135M: docs/measurements.md#traced-once). The calls are inlined where they are made,
so the program XLA compiles is the one the plain calls give.
"""
from __future__ import annotations

import functools

import jax
import numpy as np


class _Static:
  """A leaf that is not an array, as a hashable static value (a numpy constant compared by its bytes)."""
  __slots__ = ("value", "key")

  def __init__(self, value):
    self.value = value
    if isinstance(value, (np.ndarray, np.generic)):
      self.key = ("numpy", value.shape, value.dtype.str, value.tobytes())
    else:
      self.key = ("python", type(value), value)

  def __hash__(self):
    return hash(self.key)

  def __eq__(self, other):
    return isinstance(other, _Static) and self.key == other.key


def _is_array(x) -> bool:
  return isinstance(x, jax.Array)          # (a tracer is one too)


@functools.partial(jax.jit, static_argnums=(0, 1, 2), inline=True)
def _call(fn, treedef, statics, *arrays):
  it = iter(arrays)
  return fn(*jax.tree.unflatten(treedef, [next(it) if s is None else s.value for s in statics]))


def traced_once(fn, *args):
  """fn(*args), fn a module-level function. Array leaves of args (jax arrays, tracers) are its traced
  arguments; every other leaf (numpy constants, numbers, strings, configs) is a static value, so fn sees
  it as it is and a call with other values is traced anew."""
  leaves, treedef = jax.tree.flatten(args)
  statics = tuple(None if _is_array(x) else _Static(x) for x in leaves)
  return _call(fn, treedef, statics, *(x for x in leaves if _is_array(x)))
