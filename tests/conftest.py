"""Shared tiny random models and helpers for the engine tests.

`tiny_model(seed, attn_scale=...)`: init_params initializes attention at std 0.02, which makes a tiny model
a near bigram model (attention contributes nothing, drafts with any window accept everything). Scaling
the attention weights up (attn_scale ~ 10) makes context matter, so windowed and SnapKV drafts really
disagree with the target and rejection paths run. Models are cached: one per argument tuple.
"""
from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import tempfile

# Compile time, not run time, is what the suite spends (a tiny model's decode loop compiles for seconds and
# runs for milliseconds), so the tests (and the subprocesses they start) build code at LLVM -O0 and with
# XLA:CPU's elemental loop emitters instead of its MLIR fusion emitters: each roughly halves the backend
# compile; as one LLVM module, not split for a thread pool the busy workers leave no core to; and with
# XLA:CPU's fast-compile preset of HLO passes (docs/testing.md#compile-time). Float semantics are the
# same (no fast-math either way).
FAST_COMPILE_FLAG = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                     "--xla_cpu_parallel_codegen_split_count=1 --xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()

# A real model's tests (SmolLM2: 30 layers and real work at -O0) are faster compiled nearer to how users
# compile them, LLVM -O2 with the fusion emitters: these options, passed per call (docs/testing.md#compile-time).
REAL_MODEL_XLA = {"xla_backend_optimization_level": 2, "xla_cpu_use_fusion_emitters": True}

# One persistent compilation cache per test session, shared by the xdist workers and every subprocess (the
# controlling process makes it before the workers start; they inherit the variable), removed at the end:
# the suite never reads or writes ~/.cache, and a program two processes compile is compiled once.
_SESSION_CACHE_ENV = "MAGICDEC_TEST_SESSION_XLA_CACHE"
if _SESSION_CACHE_ENV not in os.environ:
  os.environ[_SESSION_CACHE_ENV] = tempfile.mkdtemp(prefix="magicdec-test-xla-")
  atexit.register(shutil.rmtree, os.environ[_SESSION_CACHE_ENV], True)
os.environ["MAGICDEC_COMPILATION_CACHE"] = os.environ[_SESSION_CACHE_ENV]

# The engine keeps 16 executables by default; a worker runs tests one after another that often compile the
# same loop (the same tiny model, bucketed shapes and settings), and under the persistent cache's 1 s floor a
# program that fell out of those 16 was traced, lowered and compiled again. Tiny models' executables are
# small: keep more (a test of the bound sets its own).
os.environ.setdefault("MAGICDEC_MAX_EXECUTABLES", "96")

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import compile as compiling
from magicdec_jax import loop
from magicdec_jax.cache import aligned_slots
from magicdec_jax.config import ModelConfig
from magicdec_jax.model import Model, init_params
from magicdec_jax.sampling import Sampling

# A worker holds many long-lived objects (jaxprs, executables, models); the collector's default thresholds
# walk them all again every few thousand allocations. Freeze what is alive after the imports and collect
# less often: cycles are still collected (docs/testing.md#compile-time).
gc.collect()
gc.freeze()
gc.set_threshold(100_000, 50, 100)


@functools.lru_cache(maxsize=None)
def tiny_model(seed: int = 0, *, vocab: int = 64, layers: int = 2, scale: float = 0.5,
               attn_scale: float = 1.0, max_pos: int = 512, hidden: int = 32, heads: int = 4,
               kv_heads: int = 2) -> Model:
  cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                    num_heads=heads, num_kv_heads=kv_heads, head_dim=8, max_position_embeddings=max_pos)
  params = init_params(cfg, jax.random.key(seed), scale=scale)
  if attn_scale != 1.0:
    params["layers"] = tuple(dict(lp, attn=jax.tree.map(lambda a: a * attn_scale, lp["attn"]))
                             for lp in params["layers"])
  return Model(cfg, params, name=f"tiny{seed}-v{vocab}-l{layers}-a{attn_scale}")


def random_prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def xla_flags(flags: str) -> str:
  """XLA_FLAGS for a subprocess that needs `flags` (e.g. a host device count), keeping the suite's own."""
  return f"{flags} {FAST_COMPILE_FLAG}"


def compiled_decode(params, dparams, cfg, spec, tree, batch: int, prompt: int, new: int, variants=None,
                    variant: int = 0):
  """(optimized HLO text of loop.decode, target cache, ring) for `batch` prompts of `prompt` ones prefilled
  and `new` tokens to come, as the engine lays them out (variants: an adaptive schedule's trees, the state
  sized for all of them; variant: the one this loop runs)."""
  tokens, lengths = jnp.ones((batch, prompt), jnp.int32), jnp.full((batch,), prompt, jnp.int32)
  target, ring = loop.prefill_with_draft(params, dparams, tokens, lengths, cfg=cfg, spec=spec, tree=tree,
                                         num_slots=aligned_slots(prompt + new + tree.num_nodes + 1), chunk=16)
  state = loop.initial_state(tokens, lengths, jnp.full((batch,), new, jnp.int32), jnp.array([-1], jnp.int32),
                             jax.random.split(jax.random.key(0), batch), target, ring, new + tree.num_nodes, tree,
                             len(variants) if variants else 1)
  adaptive = dict(variants=variants, variant=variant) if variants else {}
  text = loop.decode.lower(params, dparams, state, cfg=cfg, spec=spec, tree=tree, sampling=Sampling(),
                           **adaptive).compile().as_text()
  return text, target, ring


def float64_attention(q, k, v, base, anc, scale: float | None = None) -> np.ndarray:
  """float64 softmax attention under the prefix + tree rule, the reference every attention kernel is held to.

  q [B, T, H, D]; k, v [B, K, S, D] (H a multiple of K); row r's query j sees slots 0 .. base[r]-1 and
  base[r] + i for every i with anc[j, i] (a causal chunk at `start` is base = start, anc = lower triangle).
  Only visible slots are read, so poisoned never-visible slots cannot leak into it.
  """
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  anc, base = np.asarray(anc, bool), np.broadcast_to(np.asarray(base), (q.shape[0],))
  b, t, h, d = q.shape
  g, scale = h // k.shape[1], d ** -0.5 if scale is None else scale
  out = np.zeros_like(q)
  for r in range(b):
    for j in range(t):
      vis = np.zeros(k.shape[2], bool)
      vis[:int(base[r])] = True
      vis[int(base[r]) + np.flatnonzero(anc[j])] = True
      for head in range(h):
        logits = k[r, head // g][vis] @ q[r, j, head] * scale
        p = np.exp(logits - logits.max())
        out[r, j, head] = p @ v[r, head // g][vis] / p.sum()
  return out


def compile_count() -> int:
  """Executables the engine has compiled so far (compile.py's counter; a reused executable adds nothing)."""
  return compiling.compile_count()


def random_hf_llama(seed: int, norm_noise: float, **config):
  """A random HF LlamaForCausalLM (torch, eval mode) from LlamaConfig(**config), with norm weights moved
  off 1.0 by norm_noise * N(0, 1) so the norms are really tested. Needs torch + transformers."""
  import torch
  import transformers
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(norm_noise * torch.randn_like(p))
  return model


def pytest_collection_modifyitems(config, items):
  """Tests marked `heavy` run first: xdist's worksteal hands each worker a contiguous share of the collection
  and idle workers steal from the end of the others' shares, so a long test started late is a tail that only
  one worker runs; collected first, they run early on the first worker while the others take the light tests
  (docs/testing.md#compile-time). The order is otherwise the files' own."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)
