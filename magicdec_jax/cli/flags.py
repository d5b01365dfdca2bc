"""run.py's flags and their validation (the objects they describe: cli/build.py).

Flags are defined into any `absl.flags.FlagValues` (run.py uses the global FLAGS, tests a fresh one), the
`--mode` names given by the registry (cli/modes.py). Single-value ranges are absl bounds/enums (a bad value
fails at parse time with the flag and its range); `validate(fv)` does the cross-flag checks common to every
mode, the helpers below (`validate_draft`, `need`, `readable_file`, ...) serve each mode's own `validate`;
all raise `app.UsageError` naming the flag, before any model is loaded.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from absl import app, flags

from magicdec_jax import backend, config, drafts, pallas, sampling, settings, testing, trees
from magicdec_jax.cli import draft_flags
from magicdec_jax.config import ModelConfig
from magicdec_jax.options import SEED_LIMIT
from magicdec_jax.tuning import profiles, shapes

DRAFTS = ("none",) + tuple(drafts.REGISTRY)
HARDWARE = ("cpu", "a100", "h100", "h200")
IMPLS = pallas.IMPLS       # every attention implementation the dispatch knows (pallas_mosaic included)
RANDOM_PREFIX = testing.RANDOM_PREFIX   # test/debug model names: random-tiny or random-tiny:SEED


def define_flags(fv: flags.FlagValues, modes: Sequence[str]) -> flags.FlagValues:
  """Every flag, into `fv`; `modes`: the --mode names (cli/modes.py defines them with its registry)."""
  d = dict(flag_values=fv)
  flags.DEFINE_enum("mode", "demo", list(modes), "What to run (default: the demo).", **d)
  for define in (define_model_flags, define_multi_host_flags, define_sampling_flags, define_generate_flags,
                 define_bench_flags, define_datagen_flags, define_convert_flags, define_plan_flags,
                 define_calibrate_flags, define_profile_acceptance_flags, define_distill_flags):
    define(d)
  return fv


def define_model_flags(d: dict) -> None:
  """Model and draft (d: DEFINE_* keywords, the FlagValues to define into)."""
  flags.DEFINE_string("model", "smollm2-135m", "Target: 'smollm2-135m', an orbax dir, an HF dir, a .gguf "
                      f"file or a Hub id 'org/name' ('{RANDOM_PREFIX}[:SEED]': a tiny random model with a byte "
                      "tokenizer, for tests).", **d)
  flags.DEFINE_enum("draft", "streaming", DRAFTS, "none = autoregressive; streaming = self-speculation "
                    "with a StreamingLLM cache (MagicDec); snapkv = self-speculation with a SnapKV cache; "
                    "model = a separate draft model (--draft_model and/or --draft_layers); feature = a trained feature "
                    "head (EAGLE-style, --draft_model=DIR from --mode=distill --draft=feature); lookup = no model: "
                    "the continuation of the row's last n-gram earlier in its prompt + output (--lookup_ngram).", **d)
  flags.DEFINE_string("draft_model", None, "Draft model (same naming as --model) for --draft=model; the "
                      "head's directory for --draft=feature.", **d)
  flags.DEFINE_integer("draft_layers", None, "--draft=model: keep only the first N layers of the draft "
                       "model (of the target when --draft_model is unset).", lower_bound=1, **d)
  flags.DEFINE_integer("sink", drafts.DEFAULT_SINK, "Draft StreamingLLM sink tokens.", lower_bound=0,
                       upper_bound=4096, **d)
  flags.DEFINE_integer("window", drafts.DEFAULT_WINDOW, "Draft window: most recent tokens the draft attends to "
                       f"(--draft=snapkv: default {drafts.SnapKVDraft.window}, SnapKVDraft's own).",
                       lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("lookup_ngram", drafts.lookup.DEFAULT_MAX_NGRAM, "--draft=lookup: the longest n-gram "
                       "looked up (then shorter ones, down to 1).", lower_bound=1,
                       upper_bound=drafts.lookup.MAX_NGRAM, **d)
  flags.DEFINE_integer("budget", drafts.SnapKVDraft.budget, "--draft=snapkv: prompt positions kept per KV head.",
                       lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_string("gamma", str(settings.DEFAULT_GAMMA), "Speculated tokens per round (chain length, "
                      f"1..{settings.MAX_GAMMA}), or 'auto': the cost model's choice for the batch and context "
                      "(--hardware, --acceptance_file).", **d)
  flags.DEFINE_boolean("learn_acceptance", True, "--gamma=auto: re-plan a call at rounds 32, 64, 128, ... from "
                       "the acceptance its own chain rounds have had, measuring the settings the cost model "
                       "cannot separate (off: the profiled or default acceptance and the model's choice).", **d)
  flags.register_validator("gamma", gamma_ok, f"is not an integer in the range [1, {settings.MAX_GAMMA}] or "
                           "'auto'", **d)
  flags.DEFINE_string("tree", None, "Speculate a tree instead of a chain: 'auto' (cost model), a shipped "
                      f"tree name ({', '.join(trees.DEFAULT_TREE_NAMES)}) or a tree JSON file.", **d)
  flags.DEFINE_enum("attention_impl", "auto", IMPLS, "Attention kernel.", **d)
  flags.DEFINE_string("mesh", None, "Device mesh over this process's devices, e.g. 'data:2,model:4' "
                      "(tensor parallel over model, batch split over data; see magicdec_jax.sharding).", **d)
  flags.DEFINE_string("compilation_cache_dir", None, "JAX persistent compilation cache directory (default: "
                      "$MAGICDEC_COMPILATION_CACHE, else ~/.cache/magicdec_jax/xla; empty = off). A directory "
                      "set through jax's own config is left alone.", **d)
  flags.DEFINE_float("device_memory_gb", None, "Memory per device for the planner's fit check (default: "
                     "what the device reports; CPU reports nothing, so no check).", lower_bound=1e-9, **d)


def define_multi_host_flags(d: dict) -> None:
  """Multi-host (jax.distributed): each process runs its own mesh on its own share of the data."""
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for jax.distributed.", **d)
  flags.DEFINE_integer("num_processes", 1, "Processes in a jax.distributed run.", lower_bound=1, **d)
  flags.DEFINE_integer("process_id", 0, "This process's index in a jax.distributed run.", lower_bound=0, **d)


def define_sampling_flags(d: dict) -> None:
  """Sampling."""
  flags.DEFINE_float("temperature", 0.0, "0 = greedy.", lower_bound=0.0, upper_bound=100.0, **d)
  flags.DEFINE_integer("top_k", 0, "0 = off.", lower_bound=0, **d)
  flags.DEFINE_float("top_p", 1.0, "1 = off.", lower_bound=1e-6, upper_bound=1.0, **d)
  flags.DEFINE_float("min_p", 0.0, "Drop tokens below min_p x the most likely token's probability (after top-k / "
                     "top-p); 0 = off.", lower_bound=0.0, upper_bound=1.0, **d)
  flags.DEFINE_enum("sampling", "rejection", list(sampling.MODES), "With temperature > 0: rejection = "
                    "speculative rejection sampling (highest acceptance; the samples depend on the draft); "
                    "invariant = drafter-invariant sampling (the samples are plain decoding's whatever the draft, "
                    "gamma, tree or batch: Gumbel-max with noise per seed, stream and position).", **d)
  flags.DEFINE_enum("numerics", None, list(config.NUMERICS), "invariant = every dot of the target one "
                    "fixed shape, so greedy and invariant sampling give plain decoding's tokens bit for bit "
                    "(bfloat16 too) whatever the draft, gamma, tree, batch or slot; fast = the "
                    "backend's own shapes (equal to rounding). Default: invariant on CPU, fast on a GPU (where "
                    "fixed shapes measured 2.07x slower).", **d)
  flags.DEFINE_integer("seed", 0, "Random seed.", lower_bound=0, upper_bound=SEED_LIMIT - 1, **d)
  flags.DEFINE_integer("max_new_tokens", 64, "New tokens per prompt.", lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("batch_size", 4, "demo: rows (default 8 on a CPU, 32 on a GPU); datagen: decode slots "
                       "(default 4).", lower_bound=1, upper_bound=4096, **d)
  flags.DEFINE_integer("refill_at", 1, "datagen: the decode loop returns to refill its slots once this many "
                       "rows have finished (--batch_size: static batching).", lower_bound=1, upper_bound=4096, **d)
  flags.DEFINE_integer("prompt_tokens", 7900, "Demo prompt length in tokens (Shakespeare); unless given, the "
                       "demo picks where MagicDec wins on this backend (cli/demo.py default_shape).", lower_bound=16,
                       upper_bound=1 << 20, **d)
  flags.DEFINE_integer("shared_tokens", None, "Demo: tokens of the document every prompt starts with (prefilled "
                       "once); each prompt then has its own passage. Default: all but the last 256 tokens; 0: "
                       "distinct prompts.", lower_bound=0, **d)
  flags.DEFINE_enum("draft_weights", "none", ["none", "bfloat16", "int8", "int4"], "--draft=streaming, snapkv, "
                    "model or feature: the draft's weights: 'none', its own; 'bfloat16', a copy of float32 "
                    "matrices in bfloat16 (half the bytes per draft step); 'int8' (per-channel scales) or "
                    "'int4' quantized copies (docs/drafts.md#draft-weights: the forms per backend). The target "
                    "still verifies with its own weights. The demo uses bfloat16 unless this is given.", **d)
  flags.DEFINE_boolean("shrink_batch", False, "generate / demo: once half the rows are done, go on with the "
                       "rest in a batch half as large, and so on (same tokens; each smaller batch compiles once "
                       "more, and on a CPU the first copy into fresh memory can cost more than it saves: docs/shrink-batch.md).",
                       **d)
  flags.DEFINE_integer("demo_repeats", 2, "Demo: AR and MagicDec decode alternately this many times each (the "
                       "speedup is of their summed times, robust to a machine whose speed drifts).", lower_bound=1,
                       upper_bound=100, **d)
  flags.DEFINE_boolean("demo_structured", True, "Demo: a second part, questions about the document answered as "
                       "JSON under a schema (structured output), plainly and with the draft.", **d)


def define_generate_flags(d: dict) -> None:
  """generate."""
  flags.DEFINE_multi_string("prompt", [], "A prompt (repeatable).", **d)
  flags.DEFINE_string("prompts_file", None, "Prompts: one per line, or JSONL records with 'prompt' (text) or "
                      "'messages' (chat) and perhaps an 'id'.", **d)
  flags.DEFINE_boolean("chat", False, "Render prompts with the model's chat template.", **d)
  flags.DEFINE_string("json_schema", None, "generate: structured output, every prompt's output valid JSON under "
                      "this JSON schema: its JSON text or @PATH of a file holding it (docs/structured-output.md).",
                      **d)


def define_bench_flags(d: dict) -> None:
  """bench."""
  flags.DEFINE_list("batches", ["1", "4"], "Batch sizes (bench; calibrate and plan have their own defaults: "
                    "docs/tuning.md).", **d)
  flags.DEFINE_list("contexts", ["256", "1024"], "Prompt lengths in tokens (bench; calibrate and plan have their "
                    "own defaults: docs/tuning.md).", **d)
  flags.DEFINE_list("gammas", ["2", "4"], "bench: speculation lengths.", **d)
  flags.DEFINE_string("output_dir", "bench_out", "bench: where the JSON and PNGs go.", **d)
  flags.DEFINE_enum("bench_preset", "none", ["none", "long_context"], "bench: long_context = a long-context "
                    "sweep (batches 8,4,1 x contexts 1024..8000, gammas 2,3, window 256, 64 new tokens, points "
                    "up to 33000 batch tokens; ~25 min on a 2-core CPU; the README's figure took 128 new "
                    "tokens); flags given explicitly override it.", **d)


def define_datagen_flags(d: dict) -> None:
  """datagen."""
  flags.DEFINE_string("input", None, "datagen: input JSONL ({'id', 'prompt'} or {'id', 'messages'}, or "
                      "OpenAI batch request lines); "
                      "profile_acceptance: prompts to profile on (JSONL or one per line; default Shakespeare).", **d)
  flags.DEFINE_string("output", None, "datagen: output JSONL; profile_acceptance / calibrate: output JSON.", **d)
  flags.DEFINE_integer("num_samples_per_prompt", 1, "datagen: samples per prompt.", lower_bound=1,
                       upper_bound=1 << 16, **d)
  flags.DEFINE_enum("on_error", "fail", ["fail", "skip"], "datagen: bad input lines abort the run (fail, "
                    "checked before generating) or go to OUT.errors.jsonl (skip); an OpenAI batch file's bad "
                    "requests are always error lines in the output.", **d)
  flags.DEFINE_enum("input_format", "auto", ["auto", "native", "openai"], "datagen: input lines are "
                    "{'id', 'prompt' | 'messages'} (native) or OpenAI batch requests {'custom_id', 'method', "
                    "'url', 'body'} (openai); auto: by the first line.", **d)
  flags.DEFINE_enum("truncate", "none", ["none", "left"], "datagen: prompts longer than the context are an "
                    "error (none) or lose their oldest tokens (left).", **d)
  flags.DEFINE_boolean("progress", True, "Show progress (tqdm / log lines).", **d)


def define_convert_flags(d: dict) -> None:
  """convert."""
  flags.DEFINE_string("src", None, "convert: source checkpoint (HF dir, .gguf, name).", **d)
  flags.DEFINE_string("dst", None, "convert: destination orbax dir.", **d)


def define_plan_flags(d: dict) -> None:
  """plan."""
  flags.DEFINE_enum("model_shape", "llama31_8b", sorted(shapes.MODEL_SHAPES), "plan: model shape.", **d)
  flags.DEFINE_string("hardware", None, f"Cost model's device: a datasheet ({', '.join(HARDWARE)}) or a hardware "
                      "profile JSON from --mode=calibrate (measured here). plan: default h100; generate / "
                      "gamma=auto / tree=auto: default detected from the device.", **d)
  flags.DEFINE_enum("datasheet", None, HARDWARE, "plan with --hardware=PROFILE: the datasheet to show beside the "
                    "profile's prediction (default: the profile's GPU if it is one of them, else h100).", **d)


def define_calibrate_flags(d: dict) -> None:
  """calibrate."""
  flags.DEFINE_integer("calibrate_repeats", 3, "calibrate: timed calls per shape per pass.", lower_bound=1,
                       upper_bound=100, **d)
  flags.DEFINE_list("calibrate_tokens", ["1", "4", "16"], "calibrate: target tokens per row timed (1 = the AR "
                    "step; more = verify of a chain or tree of that many nodes).", **d)
  flags.DEFINE_list("calibrate_draft_tokens", ["1", "4"], "calibrate: draft tokens per row timed (1 = a chain "
                    "step; more = a tree level).", **d)
  flags.DEFINE_integer("calibrate_passes", 2, "calibrate: sweeps over the grid (min over all samples).",
                       lower_bound=1, upper_bound=20, **d)
  flags.DEFINE_float("alpha", 0.8, "plan: per-token acceptance rate (given, it replaces a profile's "
                     "acceptance vector; not with --acceptance_file).", lower_bound=0.0, upper_bound=1.0, **d)
  flags.DEFINE_string("acceptance_file", None, "An acceptance-vector JSON from profile_acceptance: plan, "
                      "calibrate (stored in the profile) and gamma=auto / tree=auto use it.", **d)


def define_profile_acceptance_flags(d: dict) -> None:
  """profile_acceptance."""
  flags.DEFINE_integer("width", 8, "profile_acceptance: draft children ranked per position (W).",
                       lower_bound=1, upper_bound=64, **d)
  flags.DEFINE_integer("profile_tokens", 1024, "profile_acceptance: held-out text window in tokens.",
                       lower_bound=32, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("profile_windows", 2, "profile_acceptance: number of text windows.",
                       lower_bound=1, upper_bound=1024, **d)


def define_distill_flags(d: dict) -> None:
  """distill."""
  flags.DEFINE_list("distill_data", [], "distill: training data, comma-separated: datagen JSONL files "
                    "(*.jsonl) and/or plain text files.", **d)
  flags.DEFINE_string("distill_out", None, "distill: output dir (the trained draft, loadable with "
                      "load_model / --draft_model; checkpoints under OUT/checkpoints; a rerun resumes).", **d)
  flags.DEFINE_string("draft_config", None, "distill: a magicdec_config.json for a randomly initialised "
                      "draft (instead of --draft_layers, the target's first N layers).", **d)
  flags.DEFINE_integer("distill_steps", 1000, "distill: training steps.", lower_bound=1, upper_bound=1 << 30, **d)
  flags.DEFINE_float("lr", 3e-4, "distill: peak learning rate (AdamW, warm-up + cosine).", lower_bound=1e-9,
                     upper_bound=1.0, **d)
  flags.DEFINE_integer("warmup_steps", 50, "distill: linear warm-up steps.", lower_bound=0, **d)
  flags.DEFINE_integer("batch", 8, "distill: token windows per training step.", lower_bound=1,
                       upper_bound=1 << 16, **d)
  flags.DEFINE_integer("seq_len", 256, "distill: tokens per training window.", lower_bound=2,
                       upper_bound=1 << 20, **d)
  flags.DEFINE_integer("checkpoint_every", 100, "distill: steps between orbax checkpoints.", lower_bound=1, **d)
  flags.DEFINE_integer("draft_vocab", 0, "distill --draft=feature: the head's own vocabulary, the N most "
                       "frequent token ids of the training data plus EOS (0: the target's whole vocabulary).",
                       lower_bound=0, **d)
  flags.DEFINE_enum("distill_compute", "float32", ["float32", "bfloat16"], "distill --draft=feature: "
                    "precision of the frozen target's pass and the head's matmuls (bfloat16: bfloat16 copies, "
                    "float32 accumulation and float32 master weights; held-out acceptance is measured in "
                    "float32 either way).", **d)
  flags.DEFINE_integer("eval_every", 0, "distill: steps between held-out acceptance measurements (0: start "
                       "and end only).", lower_bound=0, **d)
  flags.DEFINE_enum("distill_loss", "ce", ["ce", "kl"], "distill: ce = cross-entropy on the target's greedy "
                    "tokens (best greedy acceptance); kl = forward KL from the target's logits (best for "
                    "sampling).", **d)
  flags.DEFINE_string("distill_heldout", None, "distill: held-out text file for the acceptance measurement "
                      "(default: held-out Shakespeare when the model has a tokenizer).", **d)


def int_list(fv, name: str, minimum: int) -> list[int]:
  """A DEFINE_list flag as positive ints, or UsageError naming the flag."""
  raw = getattr(fv, name)
  try:
    vals = [int(x) for x in raw]
  except ValueError:
    raise app.UsageError(f"--{name}={','.join(raw)}: expected comma-separated integers") from None
  if not vals or any(v < minimum for v in vals):
    raise app.UsageError(f"--{name}={','.join(raw)}: each value must be an integer >= {minimum}")
  return vals


def need(fv, *names: str):
  """UsageError unless every named flag is set."""
  for n in names:
    if not getattr(fv, n):
      raise app.UsageError(f"--mode={fv.mode} needs --{n}")


def readable_file(flag: str, path: str):
  if not os.path.isfile(path):
    raise app.UsageError(f"--{flag}={path}: no such file")
  if not os.access(path, os.R_OK):
    raise app.UsageError(f"--{flag}={path}: not readable")


def writable_target(flag: str, path: str):
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise app.UsageError(f"--{flag}={path}: is a directory, expected a file path")
  if not os.path.isdir(parent):
    raise app.UsageError(f"--{flag}={path}: directory {parent} does not exist")
  if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise app.UsageError(f"--{flag}={path}: not writable")


def check_fixed_depth(fv, label: str, depth: int, numerics: str | None, hint: str = "") -> None:
  """UsageError `label: ...` where fixed-shape numerics (`numerics`, else the backend's default) cannot verify
  `depth` tokens a round. Single-process runs only: asking the backend initializes it, which jax.distributed
  must precede (the plan checks the depth there)."""
  if fv.num_processes == 1 and (numerics or backend.default_numerics()) == "invariant" and \
      depth > (deepest := backend.fixed_shapes().max_depth):
    raise app.UsageError(f"{label}: fixed-shape numerics verify at most {deepest} tokens a round on this "
                         f"backend{hint}")


def writable_dir(flag: str, path: str) -> None:
  """UsageError unless `path` is a directory, or can be made one, that this process may write into."""
  out = os.path.abspath(path)
  if os.path.exists(out) and not os.path.isdir(out):
    raise app.UsageError(f"--{flag}={path}: exists and is not a directory")
  while not os.path.exists(out):
    out = os.path.dirname(out)
  if not os.path.isdir(out) or not os.access(out, os.W_OK):
    raise app.UsageError(f"--{flag}={path}: {out} is not a writable directory")


def gamma_ok(value: str) -> bool:
  return value == "auto" or (value.lstrip("-").isdigit() and 1 <= int(value) <= settings.MAX_GAMMA)


def parse_gamma(value: str):
  """--gamma: an integer in [1, MAX_GAMMA] or 'auto' (UsageError otherwise)."""
  if not gamma_ok(value):
    raise app.UsageError(f"--gamma={value}: expected an integer in [1, {settings.MAX_GAMMA}] or 'auto'")
  return "auto" if value == "auto" else int(value)


def validate(fv) -> None:
  """The cross-flag checks common to every mode (each mode's module checks its own after these); raises
  app.UsageError naming the flag."""
  mode = fv.mode
  gamma = parse_gamma(fv.gamma)
  # only a --gamma given can be that deep; asking the backend initializes it, which jax.distributed must
  # precede (the plan checks the depth there)
  if fv["gamma"].present and fv.draft != "none" and not fv.tree and gamma != "auto":
    check_fixed_depth(fv, f"--gamma={gamma}", gamma, fv.numerics, "; use a smaller --gamma or --numerics=fast")
  draft_flags.check(fv)
  if fv["gamma"].present and fv.draft == "none":
    raise app.UsageError(f"--gamma={fv.gamma} needs a draft (--draft=none decodes plainly, speculating nothing)")
  if fv.tree:
    parse_tree(fv.tree)
    if fv.draft == "none":
      takes = "|".join(n for n, c in drafts.REGISTRY.items() if getattr(c, "proposes_trees", True))
      raise app.UsageError(f"--tree needs a draft that proposes trees (--draft={takes})")
    if fv["gamma"].present:
      raise app.UsageError(f"--gamma={fv.gamma} and --tree={fv.tree}: the tree is what is speculated; give one")
  if fv.num_processes > 1 and not fv.coordinator_address:
    raise app.UsageError(f"--num_processes={fv.num_processes} needs --coordinator_address=HOST:PORT")
  if fv.process_id >= fv.num_processes:
    raise app.UsageError(f"--process_id={fv.process_id} must be < --num_processes={fv.num_processes}")
  if fv.hardware is not None:
    check_hardware(fv.hardware)
  if fv["distill_compute"].present and (mode != "distill" or not draft_flags.trains_head(fv)):
    heads = "|".join(draft_flags.names(lambda e: e.trains_head))
    raise app.UsageError(f"--distill_compute={fv.distill_compute} is for --mode=distill --draft={heads} "
                         f"(got --mode={mode} --draft={fv.draft})")
  if fv["draft_weights"].present and fv.draft_weights != "none" and \
      not getattr(drafts.REGISTRY.get(fv.draft), "weight_copies", False):
    takes = ", ".join(n for n, c in drafts.REGISTRY.items() if c.weight_copies)
    raise app.UsageError(f"--draft_weights={fv.draft_weights} is for --draft={takes} (got --draft={fv.draft})")
  if fv.shrink_batch and (mode not in ("generate", "demo") or fv.mesh):
    raise app.UsageError(f"--shrink_batch is for --mode=generate or demo without --mesh (got --mode={mode}"
                         + (f" --mesh={fv.mesh})" if fv.mesh else ")"))


def validate_draft(fv, head: bool = True) -> None:
  """The draft flags of a mode that uses the draft they describe (every mode but distill, which trains one):
  --draft_model / --draft_layers only where the draft takes them; --draft=feature a finished head
  (`head=False`: none needed, plan prices the default head's shape)."""
  draft_flags.check_draft(fv, head)


def validate_acceptance_file(fv) -> None:
  """--acceptance_file, where the mode reads it: a readable acceptance vector."""
  if fv.acceptance_file:
    readable_file("acceptance_file", fv.acceptance_file)
    load_acceptance_vector(fv.acceptance_file)


DRAFT_FLAGS = ("draft", "draft_model", "draft_layers", "draft_config", "draft_weights",
               "draft_vocab") + draft_flags.SHAPE_FLAGS


def refuse_flags(fv, names, why: str) -> None:
  """UsageError naming the first of `names` given on the command line: --mode=M does not read it ({why})."""
  if given := [n for n in names if fv[n].present]:
    raise app.UsageError(f"--{given[0]}={fv[given[0]].value} is not read by --mode={fv.mode} ({why}), which would "
                         "ignore it")


def refuse_no_draft(fv, what: str) -> None:
  """UsageError for --draft=none in a mode that needs a draft: '--mode=M {what}; --draft=none ...'."""
  if fv.draft == "none":
    raise app.UsageError(f"--mode={fv.mode} {what}; --draft=none is not allowed")


def draft_config_from_flag(path: str):
  try:
    with open(path) as f:
      return ModelConfig.from_json(f.read())
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise app.UsageError(f"--draft_config={path}: not a valid model config JSON ({e})") from None


def check_hardware(value: str):
  """--hardware: a datasheet name or a readable hardware profile JSON (UsageError otherwise)."""
  if value in HARDWARE:
    return value
  if not value.endswith(".json"):
    raise app.UsageError(f"--hardware={value}: expected one of {', '.join(HARDWARE)} or a profile .json file "
                         "(run.py --mode=calibrate --output=PROFILE.json)")
  readable_file("hardware", value)
  try:
    profiles.load_profile(value)
  except ValueError as e:
    raise app.UsageError(f"--hardware={value}: {e}") from None
  return value


def parse_tree(value: str):
  """'auto', a shipped tree name or a JSON file -> 'auto' or trees.Tree (UsageError if neither)."""
  if value == "auto":
    return "auto"
  if value in trees.DEFAULT_TREE_NAMES:
    return trees.default_tree(value)
  if not os.path.isfile(value):
    raise app.UsageError(f"--tree={value}: not 'auto', a shipped tree ({', '.join(trees.DEFAULT_TREE_NAMES)}) "
                         "or an existing JSON file")
  try:
    with open(value) as f:
      return trees.Tree.from_json(f.read())
  except (ValueError, KeyError, TypeError) as e:
    raise app.UsageError(f"--tree={value}: not a valid tree JSON file ({e})") from None


def load_acceptance_vector(path: str) -> list[float]:
  try:
    with open(path) as f:
      d = json.load(f)
    vec = [float(x) for x in (d["acceptance_vector"] if isinstance(d, dict) else d)]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise app.UsageError(f"--acceptance_file={path}: expected JSON with an 'acceptance_vector' list ({e})") from None
  if not vec or any(not 0 <= x <= 1 for x in vec) or sum(vec) > 1 + 1e-6:
    raise app.UsageError(f"--acceptance_file={path}: entries must be in [0, 1] and sum to <= 1")
  return vec


# the flags of DecodeSettings (decode_settings reads them all); a mode module lists in SETTINGS_FLAGS those it
# reads (cli/modes.validate refuses the others), all of them where it runs decode_settings
DECODE_FLAGS = ("temperature", "top_k", "top_p", "min_p", "sampling", "numerics", "seed", "max_new_tokens", "gamma",
                "tree", "hardware", "acceptance_file", "learn_acceptance", "attention_impl")
