"""The benchmarks' harness: command line, model set-up, environment record, timing, text, JSON and PNG out.

A benchmark is a module run from the repository root as `python -m benchmarks.GROUP.NAME [...]`:

  ap = common.parser(__doc__)                       # --output and --smoke, plus the script's own flags
  args = common.parse(ap, argv, shapes=[(2, 64)])   # with --smoke: these values replace the flags'
  model, source = common.model(args.smoke)          # the random tiny model, else SmolLM2-135M
  doc = common.record(NAME, source, model.config.dtype, ...)  # benchmark, env, command, model, dtype, ...
  common.finish(doc, args.output, f"NAME_{common.device_tag()}.json")

Benchmarks vary plan and draft fields (DecodeSettings, a quantized copy's QuantForm through `QuantFormDraft`),
never module attributes (docs/measurements.md#module-overrides). Every JSON's `env` block says where and when
it ran, with the load average before / after (a shared CPU's load is part of the record).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from magicdec_jax import checkpoints, drafts, engine, plan, prefilled, testing, textdata
from magicdec_jax.drafts import weights as draft_weights
from magicdec_jax.layers import quant
from magicdec_jax.layers.dense import weight_copy
from magicdec_jax.settings import DecodeSettings
from magicdec_jax.tuning import profiles

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
REPO_ROOT = RESULTS_DIR.parent.parent
SMOKE_HELP = "random tiny model, tiny shapes: checks the script in seconds"


# ---- command line ------------------------------------------------------------------------------------------

def parser(doc: str | None, smoke: str | None = SMOKE_HELP, output: str | None = "output") -> argparse.ArgumentParser:
  """An ArgumentParser whose --help shows the module docstring, with the shared flags: --output (the JSON's
  path, default results/<name>_<device>_<date>.json; stored as args.<output>, and also spelled --json where
  output="json", as the training scripts' recorded configs name it; None: no flag) and, unless `smoke` is
  None, --smoke (help: `smoke`)."""
  ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
  if output:
    ap.add_argument("--output", *(["--json"] if output == "json" else []), dest=output, default=None,
                    help="the JSON's path (default: under benchmarks/results/)")
  if smoke is not None:
    ap.add_argument("--smoke", action="store_true", help=smoke)
  return ap


def parse(ap: argparse.ArgumentParser, argv=None, **smoke) -> argparse.Namespace:
  """ap.parse_args(argv); with --smoke, the attributes named in `smoke` take those values (tiny shapes)."""
  args = ap.parse_args(argv)
  if getattr(args, "smoke", False):
    for k, v in smoke.items():
      setattr(args, k, v)
  return args


def model(smoke: bool, dtype: str = "float32"):
  """(Model, source): smoke (--smoke): the random tiny model, "random-tiny"; else the real SmolLM2-135M."""
  if smoke:
    return testing.random_tiny_model(0), "random-tiny"
  return checkpoints.load_model("smollm2-135m", dtype=dtype), "gguf:smollm2-135m"


def output_path(output: str | None, name: str) -> str:
  """`output` (the --output flag), else results/<name>_<device tag>.json."""
  return output or str(RESULTS_DIR / f"{name}_{device_tag()}.json")


def env_info() -> dict:
  """Where and when: device, versions, date, CPU count and model, load average."""
  dev = jax.devices()[0]
  return {
      "device": f"{dev.platform}:{dev.device_kind}", "num_devices": jax.device_count(),
      "jax_version": jax.__version__, "python": platform.python_version(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "host_cpus": os.cpu_count(), "cpu_model": profiles.host_cpu_model(),
      "loadavg_start": list(os.getloadavg()),
  }


def record(name: str, model: str | None = None, dtype: str | None = None, **fields) -> dict:
  """A JSON's head, {"benchmark": name, "env": env_info(), "command": this process's command line, "model": model,
  "dtype": dtype} (model and dtype where given), then `fields` (an `env` among them replaces this one)."""
  head = {"benchmark": name, "env": env_info(), "command": " ".join(sys.argv), "model": model, "dtype": dtype}
  return {**{k: v for k, v in head.items() if v is not None}, **fields}


def device_tag() -> str:
  """A file-name-safe tag such as 'cpu' or 'gpu-h100' plus today's date."""
  dev = jax.devices()[0]
  kind = dev.device_kind.lower().replace(" ", "-")
  kind = "".join(c for c in kind if c.isalnum() or c == "-")[:24]
  name = dev.platform if dev.platform == "cpu" else f"{dev.platform}-{kind}"
  return f"{name}_{datetime.date.today().isoformat()}"


def interleaved_decodes(model, pre, settings: dict, repeats: int, warm: bool = True) -> dict:
  """{name: [GenerateResult] x repeats}: every setting (prefilled.decode keywords) decodes the prefilled
  batch once untimed (compiling; unless not `warm`), then all settings in turn, `repeats` times, the order
  reversed every other time, so a burst of load on the shared machine hits one run of each rather than all
  runs of one and a drift in the machine's pace favours no setting. pre: a Prefilled, or
  {(numerics, fixed_shapes): Prefilled} (a setting decodes the batch prefilled with its numerics and fixed
  shapes; None: the default's)."""
  batch = lambda kw: pre[kw.get("numerics"), kw.get("fixed_shapes")] if isinstance(pre, dict) else pre
  for kw in settings.values() if warm else ():
    prefilled.decode(model, batch(kw), **kw)
  runs = {k: [] for k in settings}
  for i in range(repeats):
    for k, kw in list(settings.items())[::-1 if i % 2 else 1]:
      runs[k].append(prefilled.decode(model, batch(kw), **kw))
  return runs


def paired_ratios(num: list[float], den: list[float]) -> dict:
  """num[i] / den[i] for runs made side by side (interleaved_decodes' repeats): the median, a 95% interval
  for it that assumes nothing of the distribution (order statistics of the binomial sign test; None below
  6 pairs), and every ratio. Pairing cancels the machine's drift between repeats that medians of each
  setting alone keep."""
  r = sorted(x / y for x, y in zip(num, den))
  n, k, cdf = len(r), 0, 0.0
  while n >= 6 and cdf + math.comb(n, k) / 2 ** n <= 0.025:
    cdf += math.comb(n, k) / 2 ** n
    k += 1
  return dict(median=statistics.median(r), ci95=[r[k - 1], r[n - k]] if k else None, ratios=r)


def loop_engine(model, draft, tree, *, batch: int, context: int, max_new: int, numerics: str | None = None,
                fixed_shapes=None, simulated_acceptance=None) -> engine.Engine:
  """The Engine `generate` builds for a fixed draft and tree (None: plain decoding) at batch x context: its
  plan's XLA options (the engine's, then the draft's), attention choice and 1 x 1 mesh (fixed_shapes:
  invariant numerics' shapes, None: the backend's; simulated_acceptance: DecodeSettings').
  `engine.decode(state)` is then the compiled loop users run."""
  st = DecodeSettings(max_new_tokens=max_new, draft=draft, tree=None if draft is None else tree, numerics=numerics,
                      fixed_shapes=fixed_shapes if numerics == "invariant" else None,
                      simulated_acceptance=None if draft is None else simulated_acceptance)
  return engine.Engine(model, plan.make_plan(model, st, batch=batch, shortest=context, longest=context))


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


# ---- text --------------------------------------------------------------------------------------------------

def text_prompts(model, n_prompts: int, n_tokens: int, vocab: int, seed: int = 0,
                 held_out: bool = False) -> tuple[list, str]:
  """(n_prompts windows of exactly n_tokens ids, source): Shakespeare through the model's tokenizer
  (`textdata.shakespeare_prompts`; held_out: the plays read from the end of the list), random ids when the
  model has no tokenizer (the tiny random model of --smoke)."""
  tok = getattr(model, "tokenizer", None)
  if tok is None:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n_tokens).tolist() for _ in range(n_prompts)], "random-ids"
  return (textdata.shakespeare_prompts(tok, n_prompts, n_tokens, held_out=held_out),
          "shakespeare held-out plays" if held_out else "shakespeare(textdata)")


# ---- a quantized copy in another form ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QuantFormDraft(drafts.StreamingDraft):
  """A StreamingDraft whose quantized weight copy is made in `form` (layers/quant.QuantForm; None: the
  backend's): how a benchmark varies an int4 copy's group, offsets, int8 matrices or kernel. The copy is
  made once per (params, weights, form) and kept like the drafts' own (drafts/weights.cached_copy); the
  form is part of the draft, so the compiled loop is specialised on it."""
  form: quant.QuantForm | None = None

  def params(self, target):
    if self.weights is None or self.form is None:
      return super().params(target)
    return draft_weights.cached_copy((target.params,), (self.weights, self.form),
                                     lambda: weight_copy(target.params, self.weights, self.form))

  def xla_options(self) -> dict:
    return quant.xla_options(self.weights, self.form)


def int4_form(group: int | None = None, keep_int8=None, symmetric: bool = False) -> quant.QuantForm:
  """The backend's QuantForm with a benchmark's int4 flags applied (None: the backend's value)."""
  form = quant.backend_form()
  changes = {"group": group, "keep_int8": keep_int8, "offsets": False if symmetric else None}
  return form.replace(**{k: v for k, v in changes.items() if v is not None})


# ---- output ------------------------------------------------------------------------------------------------

def read_json(path):
  """The JSON document at `path`."""
  return json.loads(pathlib.Path(path).read_text())


def write_json(doc: dict, path, stamp: bool = True) -> str:
  """Write `doc` (numpy values made plain) to `path`; stamp: first set env.loadavg_end to the load now."""
  if stamp:
    doc.setdefault("env", {})["loadavg_end"] = list(os.getloadavg())
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
  return str(path)


def finish(doc: dict, output: str | None, default_name: str | None = None) -> str:
  """Stamp the end load average, write JSON (to `output` or results/<default_name>) and print it."""
  path = write_json(doc, output or RESULTS_DIR / default_name)
  print(json.dumps(doc, indent=1, default=_jsonable), flush=True)
  return path


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def png_path(json_path: str) -> str:
  """The figure beside a JSON: same path, .png."""
  return os.path.splitext(str(json_path))[0] + ".png"


def save_figure(fig, path) -> str:
  """tight_layout, write `path` at 110 dpi, close the figure."""
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  pyplot().close(fig)
  return str(path)


def _jsonable(x):
  return x.tolist() if isinstance(x, (np.integer, np.floating, np.ndarray)) else str(x)


def flags(ap: argparse.ArgumentParser, **defaults) -> None:
  """A plain --NAME flag (underscores written as dashes) of each default's type, for the scripts' sizes."""
  for name, default in defaults.items():
    ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)


def log(*msg) -> None:
  """A progress line, on stderr."""
  print(*msg, file=sys.stderr, flush=True)


def xla_option(text: str) -> tuple[str, object]:
  """'OPTION:VALUE' -> (OPTION, VALUE as a bool or int where it reads as one)."""
  key, sep, value = text.partition(":")
  if not key or not sep or not value:
    raise ValueError(f"an XLA option is OPTION:VALUE, got {text!r}")
  return key, {"true": True, "false": False}.get(value.lower(), int(value) if value.isdigit() else value)


def int_list(text: str) -> list[int]:
  """argparse type: "512,1024" -> [512, 1024]."""
  return [int(x) for x in text.split(",") if x]


def shape_list(text: str) -> list[tuple[int, ...]]:
  """argparse type: "8x2048,1x512" -> [(8, 2048), (1, 512)]."""
  return [tuple(int(y) for y in x.split("x")) for x in text.split(",") if x]
