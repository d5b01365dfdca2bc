"""`run.py --mode=plan`: the cost model's table (gamma, speedup, T_AR over batch x context) for a model shape
(--model_shape) and the draft the flags describe, on a datasheet or a measured hardware profile
(--hardware), with S_inflection; a model with sliding-window layers is priced with them (their KV reads
are min(context, window)) and compared with the same shape priced all global; no weights are loaded."""
from __future__ import annotations

from absl import app

from magicdec_jax.cli import draft_flags, flags as cli_flags
from magicdec_jax.tuning import costmodel, profiles, shapes
from magicdec_jax.tuning.autotune import detect_hardware

OWN_FLAGS = ("batches", "contexts", "model_shape", "datasheet", "alpha")
SETTINGS_FLAGS = ("acceptance_file", "hardware")

DEFAULT_HARDWARE = "h100"           # --hardware's default here
PLAN_BATCHES = (1, 4, 8, 16, 32, 64)
PLAN_CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)


def validate(fv) -> None:
  cli_flags.refuse_flags(fv, ("model",), "it plans for --model_shape")
  cli_flags.validate_draft(fv, head=False)
  cli_flags.validate_acceptance_file(fv)
  cli_flags.int_list(fv, "batches", 1)
  cli_flags.int_list(fv, "contexts", 1)
  cli_flags.refuse_no_draft(fv, "plans a draft")
  if fv["datasheet"].present and not profiles.is_profile_path(hardware := fv.hardware or DEFAULT_HARDWARE):
    raise app.UsageError(f"--datasheet={fv.datasheet} is shown beside a measured profile: it needs "
                         f"--hardware=PROFILE.json, not --hardware={hardware} (a datasheet itself)")
  if fv["alpha"].present and fv.acceptance_file:
    raise app.UsageError(f"--alpha={fv.alpha} and --acceptance_file={fv.acceptance_file}: give one acceptance "
                         f"(a per-token rate or a measured vector)")
  draft_flags.cost(fv, shapes.model_shape(fv.model_shape))     # the flags price it from the shape alone


def run(fv, log) -> None:
  cfg = shapes.model_shape(fv.model_shape)
  hw_name = fv.hardware or DEFAULT_HARDWARE
  profile, datasheet = None, None
  if profiles.is_profile_path(hw_name):
    profile = profiles.load_profile(hw_name)[1]
    cfg = shapes.model_shape(fv.model_shape, dtype=profile.get("dtype", cfg.dtype))   # as it was measured
    guess = next((k for k in ("h200", "h100", "a100") if k in profile.get("device", "").lower()), "h100")
    datasheet = detect_hardware(fv.datasheet or guess)
  draft = draft_flags.cost(fv, cfg)
  vec = cli_flags.load_acceptance_vector(fv.acceptance_file) if fv.acceptance_file else None
  if vec is None and profile is not None and profile.get("acceptance_vector") and not fv["alpha"].present:
    vec = profile["acceptance_vector"]
  # the plan's own grid (long contexts, serving batches), not the bench grid, unless given on the command line
  batches = cli_flags.int_list(fv, "batches", 1) if fv["batches"].present else list(PLAN_BATCHES)
  contexts = cli_flags.int_list(fv, "contexts", 1) if fv["contexts"].present else list(PLAN_CONTEXTS)
  hw = detect_hardware(hw_name)
  alpha = None if vec else fv.alpha
  rows = costmodel.plan_table(cfg, hw, batches, contexts, draft, alpha=alpha, acceptance_vector=vec)
  print(f"plan: {fv.model_shape} on {hw_name if profile is None else 'profile ' + hw_name + ' (' + profile.get('device', '?') + ')'}, "
        f"draft {draft_flags.describe(fv, draft)}, "
        f"{'acceptance vector ' + (fv.acceptance_file or 'from the profile') if vec else 'alpha %.2f' % fv.alpha}")
  if datasheet is not None:
    ds = costmodel.plan_table(cfg, datasheet, batches, contexts, draft, alpha=alpha, acceptance_vector=vec)
    print(f"(gamma / speedup / T_AR from the fitted profile; ds_* columns: the {datasheet.name} datasheet roofline)")
    print(costmodel.format_plan(rows, compare=ds))
  else:
    print(costmodel.format_plan(rows))
  a = vec[0] if vec else fv.alpha
  print(f"\nS_inflection (smallest context where a gamma chain's speedup grows from batch 64 to 128; "
        f"alpha {a:.2f}):")
  for name, h in [(hw.name, hw)] + ([(datasheet.name + " datasheet", datasheet)] if datasheet else []):
    cells = []
    for g in range(1, 7):
      n = costmodel.s_inflection(cfg, h, draft, g, a)
      cells.append(f"gamma={g}: {n if n is not None else 'none <= 1M'}")
    print(f"  {name}: " + ", ".join(cells))
  windows = [w for w in cfg.layer_windows if w]
  if windows:
    print(f"\nwindowed layers: {len(windows)} of {cfg.num_layers} slide (window {min(windows)}"
          f"{'-%d' % max(windows) if max(windows) != min(windows) else ''}): their KV reads and memory are "
          f"min(context, window) (the target keeps them as rings), so the draft saves only on the "
          f"{cfg.num_layers - len(windows)} global layers and where its window is narrower than theirs")
    glob = cfg.replace(layer_windows=())
    same = [costmodel.s_inflection(glob, hw, draft, g, a) for g in range(1, 7)]
    equal = same == [costmodel.s_inflection(cfg, hw, draft, g, a) for g in range(1, 7)]
    print(f"  S_inflection with every layer global ({hw.name}): " + ", ".join(
        f"gamma={g}: {n if n is not None else 'none <= 1M'}" for g, n in enumerate(same, 1))
          + (" (the same: it falls below the window, where windows change nothing)" if equal else ""))
    for n in [c for c in contexts if c > min(windows)][:3]:
      b = max(batches)
      g, sp = costmodel.choose_gamma(cfg, hw, draft, b, n, a)
      g0, sp0 = costmodel.choose_gamma(glob, hw, draft, b, n, a)
      print(f"  batch {b}, context {n}: speedup {sp:.2f} (gamma {g}); the same shape with every layer global "
            f"{sp0:.2f} (gamma {g0})")
