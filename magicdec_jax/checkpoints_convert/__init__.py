"""Convert an HF dir, a GGUF file or a built-in model name to an orbax dir that `load_model` restores fast."""
from __future__ import annotations

import time

from magicdec_jax import checkpoints


def convert(src: str, dst: str, dtype: str = "float32") -> dict:
  """Load `src` (anything `load_model` accepts) and save it to the orbax dir `dst`; returns a summary."""
  t0 = time.perf_counter()
  model = checkpoints.load_model(src, dtype=dtype)
  t1 = time.perf_counter()
  checkpoints.save_orbax(model, dst)
  t2 = time.perf_counter()
  cfg = model.config
  return {"src": src, "dst": dst, "dtype": dtype, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
          "vocab": cfg.vocab_size, "tokenizer": model.tokenizer is not None,
          "chat_template": bool(model.chat_template), "load_s": round(t1 - t0, 2),
          "save_s": round(t2 - t1, 2)}
