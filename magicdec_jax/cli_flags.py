"""run.py's flags, their validation, and the objects they describe (model, draft, tree, sampling kwargs).

Flags are defined into any `absl.flags.FlagValues` (run.py uses the global FLAGS, tests a fresh one).
Single-value ranges are absl bounds/enums (a bad value fails at parse time with the flag and its range);
`validate(fv)` does the cross-flag and file checks and raises `app.UsageError` naming the flag, all
before any model is loaded.
"""
from __future__ import annotations

import importlib.util
import json
import os

from absl import app, flags

from magicdec_jax import shapes, trees

MODES = ("demo", "generate", "bench", "datagen", "convert", "plan", "profile_acceptance")
DRAFTS = ("none", "streaming", "snapkv", "model")
HARDWARE = ("cpu", "a100", "h100", "h200")
IMPLS = ("auto", "xla", "pallas_interpret", "pallas_triton")
RANDOM_PREFIX = "random-tiny"   # test/debug model names: random-tiny or random-tiny:SEED


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> flags.FlagValues:
  d = dict(flag_values=fv)
  flags.DEFINE_enum("mode", "demo", MODES, "What to run (default: the demo).", **d)
  # Model and draft.
  flags.DEFINE_string("model", "smollm2-135m", "Target: 'smollm2-135m', an orbax dir, an HF dir or a .gguf "
                      f"file ('{RANDOM_PREFIX}[:SEED]': a tiny random model with a byte tokenizer, for tests).", **d)
  flags.DEFINE_enum("draft", "streaming", DRAFTS, "none = autoregressive; streaming = self-speculation "
                    "with a StreamingLLM cache (MagicDec); snapkv = self-speculation with a SnapKV cache; "
                    "model = a separate draft model (--draft_model and/or --draft_layers).", **d)
  flags.DEFINE_string("draft_model", None, "Draft model (same naming as --model) for --draft=model.", **d)
  flags.DEFINE_integer("draft_layers", None, "--draft=model: keep only the first N layers of the draft "
                       "model (of the target when --draft_model is unset).", lower_bound=1, **d)
  flags.DEFINE_integer("sink", 4, "Draft StreamingLLM sink tokens.", lower_bound=0, upper_bound=4096, **d)
  flags.DEFINE_integer("window", 256, "Draft window: most recent tokens the draft attends to.",
                       lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("budget", 256, "--draft=snapkv: prompt positions kept per KV head.",
                       lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("gamma", 3, "Speculated tokens per round (chain length).", lower_bound=1,
                       upper_bound=64, **d)
  flags.DEFINE_string("tree", None, "Speculate a tree instead of a chain: 'auto' (cost model), a shipped "
                      f"tree name ({', '.join(trees.DEFAULT_TREE_NAMES)}) or a tree JSON file.", **d)
  flags.DEFINE_enum("attention_impl", "auto", IMPLS, "Attention kernel.", **d)
  flags.DEFINE_string("mesh", None, "Device mesh over this process's devices, e.g. 'data:2,model:4' "
                      "(tensor parallel over model, batch split over data; see magicdec_jax.sharding).", **d)
  flags.DEFINE_float("device_memory_gb", None, "Memory per device for the planner's fit check (default: "
                     "what the device reports; CPU reports nothing, so no check).", lower_bound=0.0, **d)
  # Multi-host (jax.distributed): each process runs its own mesh on its own share of the data.
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for jax.distributed.", **d)
  flags.DEFINE_integer("num_processes", 1, "Processes in a jax.distributed run.", lower_bound=1, **d)
  flags.DEFINE_integer("process_id", 0, "This process's index in a jax.distributed run.", lower_bound=0, **d)
  # Sampling.
  flags.DEFINE_float("temperature", 0.0, "0 = greedy.", lower_bound=0.0, upper_bound=100.0, **d)
  flags.DEFINE_integer("top_k", 0, "0 = off.", lower_bound=0, **d)
  flags.DEFINE_float("top_p", 1.0, "1 = off.", lower_bound=1e-6, upper_bound=1.0, **d)
  flags.DEFINE_integer("seed", 0, "Random seed.", lower_bound=0, upper_bound=2**31 - 1, **d)
  flags.DEFINE_integer("max_new_tokens", 64, "New tokens per prompt.", lower_bound=1, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("batch_size", 4, "Rows per generate call (demo, datagen).", lower_bound=1,
                       upper_bound=4096, **d)
  flags.DEFINE_integer("prompt_tokens", 1000, "Demo prompt length in tokens (Shakespeare).", lower_bound=16,
                       upper_bound=1 << 20, **d)
  # generate.
  flags.DEFINE_multi_string("prompt", [], "A prompt (repeatable).", **d)
  flags.DEFINE_string("prompts_file", None, "Prompts: one per line, or JSONL with a 'prompt' field.", **d)
  flags.DEFINE_boolean("chat", False, "Render prompts with the model's chat template.", **d)
  # bench.
  flags.DEFINE_list("batches", ["1", "4"], "bench: batch sizes.", **d)
  flags.DEFINE_list("contexts", ["256", "1024"], "bench: prompt lengths in tokens.", **d)
  flags.DEFINE_list("gammas", ["2", "4"], "bench: speculation lengths.", **d)
  flags.DEFINE_string("output_dir", "bench_out", "bench: where the JSON and PNGs go.", **d)
  flags.DEFINE_boolean("warmup", True, "bench: run each configuration once untimed first (compilation).", **d)
  # datagen.
  flags.DEFINE_string("input", None, "datagen: input JSONL ({'id', 'prompt'} or {'id', 'messages'}).", **d)
  flags.DEFINE_string("output", None, "datagen: output JSONL; profile_acceptance: output JSON.", **d)
  flags.DEFINE_integer("num_samples_per_prompt", 1, "datagen: samples per prompt.", lower_bound=1,
                       upper_bound=1 << 16, **d)
  flags.DEFINE_enum("on_error", "fail", ["fail", "skip"], "datagen: bad input lines abort the run (fail, "
                    "checked before generating) or go to OUT.errors.jsonl (skip).", **d)
  flags.DEFINE_enum("truncate", "none", ["none", "left"], "datagen: prompts longer than the context are an "
                    "error (none) or lose their oldest tokens (left).", **d)
  flags.DEFINE_boolean("progress", True, "Show progress (tqdm / log lines).", **d)
  # convert.
  flags.DEFINE_string("src", None, "convert: source checkpoint (HF dir, .gguf, name).", **d)
  flags.DEFINE_string("dst", None, "convert: destination orbax dir.", **d)
  # plan.
  flags.DEFINE_enum("model_shape", "llama31_8b", sorted(shapes.MODEL_SHAPES), "plan: model shape.", **d)
  flags.DEFINE_enum("hardware", "h100", HARDWARE, "plan: accelerator.", **d)
  flags.DEFINE_float("alpha", 0.8, "plan: per-token acceptance rate.", lower_bound=0.0, upper_bound=1.0, **d)
  flags.DEFINE_string("acceptance_file", None, "plan: an acceptance-vector JSON from profile_acceptance "
                      "(trees are planned from it).", **d)
  # profile_acceptance.
  flags.DEFINE_integer("width", 8, "profile_acceptance: draft children ranked per position (W).",
                       lower_bound=1, upper_bound=64, **d)
  flags.DEFINE_integer("profile_tokens", 1024, "profile_acceptance: held-out text window in tokens.",
                       lower_bound=32, upper_bound=1 << 20, **d)
  flags.DEFINE_integer("profile_windows", 2, "profile_acceptance: number of text windows.",
                       lower_bound=1, upper_bound=1024, **d)
  return fv


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


def _need(fv, mode: str, *names: str):
  for n in names:
    if not getattr(fv, n):
      raise app.UsageError(f"--mode={mode} needs --{n}")


def _readable_file(flag: str, path: str):
  if not os.path.isfile(path):
    raise app.UsageError(f"--{flag}={path}: no such file")
  if not os.access(path, os.R_OK):
    raise app.UsageError(f"--{flag}={path}: not readable")


def _writable_target(flag: str, path: str):
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise app.UsageError(f"--{flag}={path}: is a directory, expected a file path")
  if not os.path.isdir(parent):
    raise app.UsageError(f"--{flag}={path}: directory {parent} does not exist")
  if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise app.UsageError(f"--{flag}={path}: not writable")


def validate(fv) -> None:
  """Cross-flag checks (mode requirements, files, lists); raises app.UsageError naming the flag."""
  mode = fv.mode
  if fv.draft == "model" and not (fv.draft_model or fv.draft_layers):
    raise app.UsageError("--draft=model needs --draft_model and/or --draft_layers")
  if fv.draft != "model" and (fv.draft_model or fv.draft_layers):
    raise app.UsageError(f"--draft_model/--draft_layers only apply to --draft=model (got --draft={fv.draft})")
  if fv.tree:
    parse_tree(fv.tree)
    if fv.draft == "none":
      raise app.UsageError("--tree needs a draft (--draft=streaming|snapkv|model)")
  if fv.mesh:
    try:
      from magicdec_jax import sharding
    except ImportError as e:
      raise app.UsageError(f"--mesh: cannot import magicdec_jax.sharding ({e})") from None
    if not hasattr(sharding, "make_mesh"):
      raise app.UsageError("--mesh: magicdec_jax.sharding has no make_mesh(spec) in this installation")
  if fv.num_processes > 1 and not fv.coordinator_address:
    raise app.UsageError(f"--num_processes={fv.num_processes} needs --coordinator_address=HOST:PORT")
  if fv.process_id >= fv.num_processes:
    raise app.UsageError(f"--process_id={fv.process_id} must be < --num_processes={fv.num_processes}")
  if mode == "demo" and fv.draft == "none":
    raise app.UsageError("--mode=demo compares against a draft; --draft=none is not allowed")
  if mode == "generate":
    if bool(fv.prompt) == bool(fv.prompts_file):
      raise app.UsageError("--mode=generate needs exactly one of --prompt (repeatable) or --prompts_file")
    if fv.prompts_file:
      _readable_file("prompts_file", fv.prompts_file)
    if any(not p.strip() for p in fv.prompt):
      raise app.UsageError("--prompt: empty prompt")
  elif mode == "bench":
    int_list(fv, "batches", 1)
    int_list(fv, "contexts", 16)
    int_list(fv, "gammas", 1)
    if fv.draft == "none":
      raise app.UsageError("--mode=bench compares against a draft; --draft=none is not allowed")
  elif mode == "datagen":
    _need(fv, mode, "input", "output")
    _readable_file("input", fv.input)
    _writable_target("output", fv.output)
    if os.path.abspath(fv.input) == os.path.abspath(fv.output):
      raise app.UsageError("--input and --output are the same file")
  elif mode == "convert":
    _need(fv, mode, "src", "dst")
  elif mode == "plan":
    int_list(fv, "batches", 1)
    int_list(fv, "contexts", 1)
    if fv.draft == "none":
      raise app.UsageError("--mode=plan plans a draft; --draft=none is not allowed")
    if fv.draft == "model" and not fv.draft_layers:
      raise app.UsageError("--mode=plan with --draft=model needs --draft_layers (the draft's depth)")
    if fv.acceptance_file:
      _readable_file("acceptance_file", fv.acceptance_file)
      load_acceptance_vector(fv.acceptance_file)
  elif mode == "profile_acceptance":
    _need(fv, mode, "output")
    _writable_target("output", fv.output)
    if fv.draft not in ("streaming", "model"):
      raise app.UsageError("--mode=profile_acceptance needs --draft=streaming or --draft=model")


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


# ---- objects the flags describe ---------------------------------------------------------------------------

def byte_tokenizer():
  """A byte-level `tokenizers.Tokenizer` (256 byte tokens + '<|eos|>' = 256) for random test models."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(["<|eos|>"])
  return tok


TINY_CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}")


def random_tiny_model(seed: int = 0, max_pos: int = 4096):
  """A 2-layer random LLaMA over the byte tokenizer (vocab 264, eos 256): fast, for tests and debugging.

  Params are numpy normals in init_params' layout (shapes from jax.eval_shape, no flax init compile).
  """
  import functools
  import jax
  import numpy as np
  from magicdec_jax.config import ModelConfig
  from magicdec_jax.model import Model, init_params
  cfg = ModelConfig(vocab_size=264, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_pos, eos_token_ids=(256,))
  shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def leaf(path, x):
    if "scale" in jax.tree_util.keystr(path):
      return jax.numpy.ones(x.shape, x.dtype)
    std = 0.5 if "embed" in jax.tree_util.keystr(path) else cfg.hidden_size ** -0.5
    return jax.numpy.asarray(rng.normal(size=x.shape) * std, x.dtype)

  params = jax.tree_util.tree_map_with_path(leaf, shapes)
  return Model(cfg, params, tokenizer=byte_tokenizer(), chat_template=TINY_CHAT_TEMPLATE,
               name=f"{RANDOM_PREFIX}:{seed}")


def load(name: str, mesh=None):
  """--model / --draft_model value -> Model (random-tiny[:SEED] or checkpoints.load_model); with a mesh
  the params end up in their shards (orbax dirs are restored straight into them)."""
  if mesh is not None:
    from magicdec_jax import sharding
    if os.path.isfile(os.path.join(name, "magicdec_config.json")):
      from magicdec_jax import checkpoints
      return checkpoints.load_orbax_sharded(name, mesh)
    return sharding.shard_model(load(name), mesh)
  if name == RANDOM_PREFIX or name.startswith(RANDOM_PREFIX + ":"):
    seed = name.partition(":")[2] or "0"
    if not seed.isdigit():
      raise app.UsageError(f"--model={name}: expected {RANDOM_PREFIX}:SEED with an integer seed")
    return random_tiny_model(int(seed))
  if importlib.util.find_spec("magicdec_jax.checkpoints") is None:
    raise app.UsageError(f"cannot load {name!r}: this installation has no magicdec_jax.checkpoints module")
  from magicdec_jax import checkpoints
  return checkpoints.load_model(name)


def build_draft(fv, target):
  """The draft object the flags describe (None for --draft=none)."""
  from magicdec_jax import drafts
  if fv.draft == "none":
    return None
  if fv.draft == "streaming":
    return drafts.StreamingDraft(sink=fv.sink, window=fv.window)
  if fv.draft == "snapkv":
    return drafts.SnapKVDraft(budget=fv.budget, window=fv.window)
  dm = load(fv.draft_model) if fv.draft_model else target
  if fv.draft_layers:
    if fv.draft_layers > dm.config.num_layers:
      raise app.UsageError(f"--draft_layers={fv.draft_layers}: the draft model has only "
                           f"{dm.config.num_layers} layers (allowed: 1..{dm.config.num_layers})")
    dm = drafts.truncate_layers(dm, fv.draft_layers)
  return drafts.ModelDraft(dm, sink=fv.sink, window=fv.window)


def gen_kwargs(fv, target) -> dict:
  """generate() keyword arguments shared by every mode that generates."""
  kw = dict(max_new_tokens=fv.max_new_tokens, temperature=fv.temperature, top_k=fv.top_k, top_p=fv.top_p,
            seed=fv.seed, draft=build_draft(fv, target), gamma=fv.gamma,
            tree=parse_tree(fv.tree) if fv.tree else None, attention_impl=fv.attention_impl)
  if fv.mesh:
    kw["mesh"] = setup_mesh(fv)
  if fv.device_memory_gb is not None:
    kw["device_memory"] = int(fv.device_memory_gb * (1 << 30))
  return kw


def render_chat(model, messages) -> str:
  """messages -> prompt text with the model's chat template (magicdec_jax.tokenizer if present)."""
  if not model.chat_template:
    raise ValueError(f"model {model.name!r} has no chat template")
  if importlib.util.find_spec("magicdec_jax.tokenizer") is not None:
    from magicdec_jax import tokenizer as tok_lib
    if hasattr(tok_lib, "render_chat"):
      return tok_lib.render_chat(model.chat_template, messages, add_generation_prompt=True)
  import jinja2
  env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
  return env.from_string(model.chat_template).render(messages=messages, add_generation_prompt=True)


def setup_mesh(fv):
  """--mesh -> magicdec_jax.sharding.make_mesh(spec) (validate() checked it exists), or None."""
  if not fv.mesh:
    return None
  from magicdec_jax import sharding
  try:
    return sharding.make_mesh(fv.mesh)
  except ValueError as e:
    raise app.UsageError(f"--mesh={fv.mesh}: {e}") from None
