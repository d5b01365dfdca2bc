"""How the engine's executables are compiled and kept: a bounded LRU of AOT executables, XLA options
scoped to them, and JAX's persistent compilation cache.

Why: every distinct static setting (draft window, gamma, tree, sampling, bucket) is a new XLA executable.
Kept forever by `jax.jit`'s own cache, a long-lived process that tries many settings grows by hundreds of
memory maps and ~20 MB per setting until XLA's CPU backend dies (`LLVM ERROR: Unable to allocate section
memory!`). Here each executable is compiled ahead of time from a fresh `jax.jit` of a fresh
`functools.partial` (`jit(fn).lower(*args).compile(compiler_options=...)`): nothing enters a jit cache that
outlives it, so when the LRU evicts an entry and drops it, XLA frees the code.

  * bound: `MAGICDEC_MAX_EXECUTABLES` (default 16) or `set_max_executables(n)`;
  * counters: `compile_count()` (executables compiled so far), `executable_count()` (kept now),
    `compile_seconds()` (seconds spent tracing, lowering and compiling);
  * XLA options for the engine's executables only: `engine_options(user_options)` merges
    `GPU_DECODE_OPTIONS` (on a GPU backend) with the caller's; never through XLA_FLAGS, so the user's other
    computations are untouched;
  * persistent cache: `enable_persistent_cache()` (run.py and the first `generate` call) points
    `jax_compilation_cache_dir` at `~/.cache/magicdec_jax/xla` ($XDG_CACHE_HOME respected) unless the user
    configured a directory; `MAGICDEC_COMPILATION_CACHE=DIR` moves it, `=off` disables it. Which
    executables are written is JAX's own setting (`jax_persistent_cache_min_compile_time_secs`, 1 s by
    default), never overridden here.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
import time
import warnings
from typing import Any, Callable, Mapping

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cc

from magicdec_jax import backend

MAX_ENV = "MAGICDEC_MAX_EXECUTABLES"
CACHE_ENV = "MAGICDEC_COMPILATION_CACHE"
DEFAULT_MAX_EXECUTABLES = 16
# XLA options the engine's own executables get on a GPU backend (a caller's xla_options override them):
# XLA's Triton GEMMs for the skinny decode / verify matmuls (they beat cuBLAS once one-row matmuls are
# padded), and no dot merger (merging q/k/v dots concatenates their weights on every forward of the decode
# loop). What each measured: docs/decisions.md#gpu-decode-options.
GPU_DECODE_OPTIONS: dict[str, Any] = {"xla_gpu_enable_triton_gemm": True, "xla_gpu_dot_merger_threshold_mb": 0}

_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")

_lock = threading.RLock()
_cache: collections.OrderedDict = collections.OrderedDict()
_counts = {"compiles": 0, "hits": 0, "evictions": 0}
_seconds = [0.0]
_in_aot = threading.local()
_persistent = {"checked": False, "dir": None}


def max_executables_from_env() -> int:
  """The executable bound MAGICDEC_MAX_EXECUTABLES asks for (unset or empty: the default); a ValueError
  naming the variable for anything but an integer >= 1."""
  raw = os.environ.get(MAX_ENV)
  if raw is None or raw == "":
    return DEFAULT_MAX_EXECUTABLES
  try:
    n = int(raw)
  except ValueError:
    raise ValueError(f"{MAX_ENV}={raw!r}: expected an integer >= 1") from None
  if n < 1:
    raise ValueError(f"{MAX_ENV}={raw!r}: expected an integer >= 1")
  return n


_max = [max_executables_from_env()]


# ---- counters ------------------------------------------------------------------------------------------

def _on_duration(event: str, seconds: float, **_):
  """Compile time jax reports outside our own AOT compiles (small eager ops of a first call)."""
  if event in _COMPILE_EVENTS and not getattr(_in_aot, "on", False):
    _seconds[0] += seconds


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def compile_count() -> int:
  """Executables compiled through this module so far (monotonic; a cache hit adds nothing)."""
  return _counts["compiles"]


def executable_count() -> int:
  """Executables kept right now (at most max_executables())."""
  return len(_cache)


def compile_seconds() -> float:
  """Seconds spent tracing, lowering and compiling (ours timed directly, jax's other compiles by event)."""
  return _seconds[0]


def stats() -> dict:
  return dict(_counts, kept=len(_cache), max=_max[0], compile_s=_seconds[0])


def max_executables() -> int:
  return _max[0]


def set_max_executables(n: int) -> None:
  """Keep at most `n` executables (least recently used dropped first, now and from then on)."""
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise ValueError(f"max executables must be an integer >= 1, got {n!r}")
  with _lock:
    _max[0] = n
    _evict()


def clear() -> None:
  """Drop every kept executable (XLA frees them once nothing else holds them)."""
  with _lock:
    _counts["evictions"] += len(_cache)
    _cache.clear()


def _evict() -> None:
  while len(_cache) > _max[0]:
    _cache.popitem(last=False)
    _counts["evictions"] += 1


# ---- executables ---------------------------------------------------------------------------------------

def _freeze(x):
  if isinstance(x, Mapping):
    return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
  if isinstance(x, (list, tuple)):
    return tuple(_freeze(v) for v in x)
  return x


def signature(*trees) -> tuple:
  """A hashable key for the abstract values of pytrees of arrays: structure, shapes, dtypes, weak types."""
  leaves, treedef = jax.tree.flatten(trees)
  return treedef, tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves)


# process-wide JAX settings that change what a trace lowers to (as jax.jit's own cache keys on them): a
# long-lived process that flips one compiles anew, as a fresh one would
TRACE_SETTINGS = ("jax_enable_x64", "jax_threefry_partitionable", "jax_default_prng_impl",
                  "jax_default_matmul_precision", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion")


def executable(key, lower: Callable[[], "jax.stages.Lowered"], options: Mapping[str, Any] | None = None):
  """The compiled executable for `key`: kept from an earlier call, or `lower().compile(options)` now.

  `key` must determine the executable (static configuration + argument signature); `lower` must build a
  fresh `jax.jit` (so that no jit cache keeps what the LRU drops). The JAX settings in TRACE_SETTINGS join
  the key.
  """
  full = (key, _freeze(options or {}), tuple(getattr(jax.config, n, None) for n in TRACE_SETTINGS))
  with _lock:
    if full in _cache:
      _cache.move_to_end(full)
      _counts["hits"] += 1
      return _cache[full]
    t0 = time.perf_counter()
    _in_aot.on = True
    try:
      compiled = lower().compile(compiler_options=dict(options) if options else None)
    finally:
      _in_aot.on = False
      _seconds[0] += time.perf_counter() - t0
    _counts["compiles"] += 1
    _cache[full] = compiled
    _evict()
    return compiled


def jit_executable(name: str, fun: Callable, args: tuple, static: Mapping[str, Any], *,
                   options: Mapping[str, Any] | None = None, donate_argnames: tuple[str, ...] = (),
                   in_shardings=None, out_shardings=None):
  """`fun(*args, **static)` compiled ahead of time (one executable per static values and argument shapes).

  fun: a plain function or a `jax.jit` one (its undecorated function is used; its own jit cache is never
  touched). in_shardings: one sharding pytree per argument (the args must already be placed so);
  out_shardings: the result's, or a function of the result's abstract value (`jax.eval_shape`, called
  only when compiling). Call the result with `args` only.
  """
  raw = getattr(fun, "__wrapped__", fun)
  shardings = tuple(getattr(x, "sharding", None) for x in jax.tree.leaves(args))   # compiled for these
  key = (name, raw, _freeze(static), donate_argnames, signature(args), shardings)

  def lower():
    fn = functools.partial(raw, **static)
    placed = {}
    if in_shardings is not None:
      placed["in_shardings"] = in_shardings
    if out_shardings is not None:
      placed["out_shardings"] = out_shardings(jax.eval_shape(fn, *args)) if callable(out_shardings) \
          else out_shardings
    return jax.jit(fn, donate_argnames=donate_argnames, **placed).lower(*args)

  return executable(key, lower, options)


TRITON_CALL = "__gpu$xla.gpu.triton"       # the custom call a Pallas Triton kernel lowers to


def export_for(platform: str, fun: Callable, *args) -> "jax.export.Exported":
  """fun(*args) lowered for `platform` through jax.export: another platform's lowering, Pallas Triton kernels
  included, checked on this machine (Triton's own compile to GPU code is not part of it)."""
  triton = jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)
  return jax.export.export(jax.jit(fun), platforms=[platform], disabled_checks=[triton])(*args)


def timed(fn: Callable, *args, **kwargs) -> tuple[Any, float, float]:
  """fn(*args, **kwargs) waited for -> (its result, seconds without compilation, seconds compiling)."""
  c0, t0 = compile_seconds(), time.perf_counter()
  out = fn(*args, **kwargs)
  jax.block_until_ready(out)
  compiled = compile_seconds() - c0
  return out, max(time.perf_counter() - t0 - compiled, 0.0), compiled


def engine_options(xla_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The XLA compiler options for the engine's executables: GPU_DECODE_OPTIONS on a GPU backend, then the
  caller's `xla_options` (which win)."""
  if xla_options is not None and not isinstance(xla_options, Mapping):
    raise ValueError(f"xla_options must be a dict of XLA option name -> value, got {xla_options!r:.80}")
  out = dict(GPU_DECODE_OPTIONS) if backend.name() == "gpu" else {}
  for k, v in (xla_options or {}).items():
    if not isinstance(k, str) or not k.startswith("xla_"):
      raise ValueError(f"xla_options: {k!r} is not an XLA option name (they start with 'xla_')")
    out[k] = v
  if xla_options:
    check_options(tuple(sorted((k, _freeze(v)) for k, v in xla_options.items())))
  return out


@functools.lru_cache(maxsize=64)
def check_options(options: tuple) -> None:
  """ValueError naming the option unless XLA takes these (name, value) pairs: a one-op program compiled
  with them (tens of milliseconds), so that a misspelt option fails before the engine's long compiles."""
  try:
    jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options=dict(options))
  except jax.errors.JaxRuntimeError as e:
    raise ValueError(f"xla_options: {str(e).partition(': ')[2] or e}") from None


# ---- persistent compilation cache -----------------------------------------------------------------------

def default_cache_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "magicdec_jax", "xla")


def enable_persistent_cache(path: str | None = None) -> str | None:
  """Turn on JAX's persistent compilation cache; returns the directory in use (None: off).

  A directory the user configured (jax_compilation_cache_dir) is left alone. `path`: where (None: the
  MAGICDEC_COMPILATION_CACHE environment variable, else default_cache_dir(); "" or "off": disabled).
  """
  with _lock:
    _persistent["checked"] = True
    user_dir = jax.config.jax_compilation_cache_dir
    if user_dir and user_dir != _persistent["dir"]:
      return user_dir
    if path is None:
      path = os.environ.get(CACHE_ENV)
      if path is None:
        path = default_cache_dir()
    if path.strip().lower() in ("", "off", "0", "none", "false"):
      return None
    path = os.path.abspath(os.path.expanduser(path))
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      warnings.warn(f"persistent compilation cache disabled: cannot create {path!r} ({e})", RuntimeWarning)
      return None
    jax.config.update("jax_compilation_cache_dir", path)
    _jax_cc.reset_cache()     # jax decides once whether the cache is used; make it decide again
    _persistent["dir"] = path
    return path


def ensure_persistent_cache() -> str | None:
  """enable_persistent_cache() once per process (the first `generate` call)."""
  if not _persistent["checked"]:
    return enable_persistent_cache()
  return _persistent["dir"] or jax.config.jax_compilation_cache_dir
