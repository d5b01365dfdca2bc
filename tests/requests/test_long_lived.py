"""A long-lived process stays healthy: executables are kept in a bounded LRU (compile.py), evicted ones are
freed (the process's memory maps stop growing), and results do not depend on what was evicted. Also the
per-executable XLA options and the persistent-cache switch."""
from __future__ import annotations

import gc
import os

import jax
import pytest

import magicdec_jax as md
from magicdec_jax import compile as compiling

from conftest import compile_count, random_prompts, tiny_model


def _maps() -> int:
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)


@pytest.fixture
def bound():
  old = compiling.max_executables()
  yield compiling.set_max_executables
  compiling.set_max_executables(old)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc (Linux)")
def test_many_settings_memory_maps_stop_growing(bound):
  """8 distinct sampling settings (one decode executable each; ~175 maps apiece when all are kept) under a
  bound of 4 (prefill, initial state, two decodes): past the bound the map count stays flat, and an
  evicted setting recomputes the same tokens."""
  bound(4)
  model = tiny_model(0, layers=1)
  prompts = random_prompts([5, 9], 64, seed=1)
  settings = [dict(temperature=1.0, top_k=k) for k in range(1, 9)]
  first, counts = None, []
  for s in settings:
    res = md.generate(model, prompts, max_new_tokens=4, **s)
    first = first or res.tokens
    gc.collect()
    counts.append(_maps())
    assert compiling.executable_count() <= 4
  growth = counts[-1] - counts[3]
  assert growth <= 40, f"memory maps kept growing past the bound: {counts}"
  assert compiling.stats()["evictions"] >= len(settings) - 2
  before = compile_count()
  again = md.generate(model, prompts, max_new_tokens=4, **settings[0]).tokens   # evicted: compiled anew
  assert compile_count() == before + 1
  assert again == first


def test_bound_setter_and_env_validation(bound, monkeypatch):
  with pytest.raises(ValueError, match="integer >= 1"):
    compiling.set_max_executables(0)
  monkeypatch.setenv(compiling.MAX_ENV, "lots")
  with pytest.raises(ValueError, match="MAGICDEC_MAX_EXECUTABLES"):
    compiling.max_executables_from_env()
  monkeypatch.setenv(compiling.MAX_ENV, "5")
  assert compiling.max_executables_from_env() == 5


def test_xla_options_reach_the_engines_executables_only():
  """A CPU option is accepted by Lowered.compile (the plumbing works); an unknown option or a bad value is
  XLA's error, raised as a ValueError before the engine compiles anything (a one-op program checks them);
  bad names are refused before compiling; the user's own jit is untouched (no XLA_FLAGS)."""
  model = tiny_model(0, layers=1)
  prompts = random_prompts([6], 64, seed=2)
  plain = md.generate(model, prompts, max_new_tokens=4).tokens
  n = compile_count()
  opt = md.generate(model, prompts, max_new_tokens=4, xla_options={"xla_cpu_enable_fast_math": False})
  assert opt.tokens == plain
  assert compile_count() == n + 3            # its own prefill, initial-state and decode executables
  assert "xla_cpu_enable_fast_math" not in os.environ.get("XLA_FLAGS", "")
  for bad, words in (({"xla_no_such_option": 1}, "No such compile option: 'xla_no_such_option'"),
                     ({"xla_backend_optimization_level": "abc"}, "'abc' is not a valid int32")):
    n = compile_count()
    with pytest.raises(ValueError, match=f"xla_options: .*{words}"):
      md.generate(model, prompts, max_new_tokens=4, xla_options=bad)
    assert compile_count() == n              # none of the engine's (the check is a one-op program)
  with pytest.raises(ValueError, match="not an XLA option"):
    md.generate(model, prompts, max_new_tokens=4, xla_options={"fast": True})
  assert compiling.engine_options(None) == ({} if jax.default_backend() != "gpu"
                                            else compiling.GPU_DECODE_OPTIONS)


def test_persistent_cache_switch(tmp_path, monkeypatch):
  """Default dir under XDG_CACHE_HOME; MAGICDEC_COMPILATION_CACHE moves it or turns it off; a directory
  the user configured is left alone, and so is JAX's floor on which compiles are written."""
  old_dir = jax.config.jax_compilation_cache_dir
  floor = jax.config.jax_persistent_cache_min_compile_time_secs
  try:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiling.default_cache_dir() == str(tmp_path / "xdg" / "magicdec_jax" / "xla")
    monkeypatch.setenv(compiling.CACHE_ENV, "off")
    assert compiling.enable_persistent_cache() is None
    assert jax.config.jax_compilation_cache_dir == old_dir
    monkeypatch.setenv(compiling.CACHE_ENV, str(tmp_path / "cc"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 7.5)        # the user's floor
    assert compiling.enable_persistent_cache() == str(tmp_path / "cc")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cc")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 7.5
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "users"))      # the user's own choice
    assert compiling.enable_persistent_cache(str(tmp_path / "other")) == str(tmp_path / "users")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "users")
  finally:
    monkeypatch.undo()                                        # the session's environment, then its cache,
    jax.config.update("jax_compilation_cache_dir", None)      # set as generate sets it (old_dir None: the
    compiling.enable_persistent_cache(old_dir)                # environment's directory, as generate would)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", floor)


def test_a_jax_setting_flipped_mid_process_is_compiled_anew():
  """jax_threefry_partitionable changes every sampled token: a process that flips it gets what a fresh
  cache computes, not the executable compiled before (as jax.jit's own cache)."""
  model, prompts = tiny_model(2), random_prompts([6, 9], 64, seed=4)
  kw = dict(max_new_tokens=8, temperature=1.0, seed=1)
  before = md.generate(model, prompts, **kw).tokens
  was = jax.config.jax_threefry_partitionable
  try:
    jax.config.update("jax_threefry_partitionable", not was)
    got = md.generate(model, prompts, **kw).tokens
    compiling.clear()
    assert got == md.generate(model, prompts, **kw).tokens != before
  finally:
    jax.config.update("jax_threefry_partitionable", was)
