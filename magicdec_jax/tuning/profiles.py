"""Hardware profiles on disk: the JSON `run.py --mode=calibrate` writes (measure/calibrate.py), read back
as the `stepfit.FittedHardware` every cost-model function accepts. Pure file and host I/O: nothing here
runs a model, so the planner (`autotune`, `--mode=plan`) reads profiles without the measuring code.
Profile format: docs/tuning.md "Hardware profiles"."""
from __future__ import annotations

import json
import os
import platform

from magicdec_jax import datagen_files
from magicdec_jax.tuning import stepfit

PROFILE_FORMAT = "magicdec-hardware-profile/1"


def save_profile(profile: dict, path: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  datagen_files.atomic_write(path, json.dumps(profile, indent=1) + "\n")   # (a kill keeps the last complete one)
  return path


def load_profile(path: str) -> tuple[stepfit.FittedHardware, dict]:
  """(FittedHardware, the whole profile dict) from a profile JSON; ValueError if it is not one."""
  try:
    with open(path) as f:
      prof = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: cannot read a hardware profile ({e})") from None
  if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT or "fit" not in prof:
    raise ValueError(f"{path}: not a hardware profile (expected 'format': {PROFILE_FORMAT!r} and a 'fit' block; "
                     "write one with `run.py --mode=calibrate`)")
  try:
    hw = stepfit.FittedHardware.from_dict(prof["fit"])
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path}: bad 'fit' block ({e})") from None
  return hw, prof


def measured_elsewhere(prof: dict, device) -> str | None:
  """How a profile's device differs from `device` (a jax Device) — its `device`, and on a CPU its
  `cpu_model` — or None: step times measured on one device misprice another's."""
  here = f"{device.platform}:{device.device_kind}"
  if prof.get("device") != here:
    return f"measured on {prof.get('device')!r}, this run is on {here!r}"
  if device.platform == "cpu" and prof.get("cpu_model") not in (None, host_cpu_model()):
    return f"measured on the CPU {prof['cpu_model']!r}, this host's is {host_cpu_model()!r}"
  return None


def is_profile_path(name) -> bool:
  return isinstance(name, (str, os.PathLike)) and str(name).endswith(".json")


def host_cpu_model() -> str:
  """The host CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) ..."): CPU timings, and the crossover they
  give, belong to a CPU model, not to jax's generic "cpu" device kind."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown"
