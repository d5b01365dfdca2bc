#!/usr/bin/env bash
# The prepared device checks for issue 46, as one call of the device tool (`run`, command
# "bash scripts/gpu_checks.sh", timeout_s 600; about 9.5 minutes): the int4 matmul forms alone
# (benchmarks/gpu_int4_matmul.py: bf16, int8, int4 per channel, groups of 64 through XLA, through the draft's
# kernel call, and the kernel at thirteen tilings), then through the engine the draft on the Pallas int4 kernel
# against the per-channel int4 copy (benchmarks/gpu_engine.py --parts kernel, at the tilings the matmul
# check measured fastest where they beat the default) and asymmetric against symmetric int4 (--parts offsets,
# what time is left). Each is cut by its own deadline so both report; JSON
# and logs go to $OUT (the device tool's folder; /tmp/gpu_checks elsewhere). Commit them under
# benchmarks/results/. GPU_CHECKS_SMOKE=1 runs both at their --smoke sizes (CPU, a few minutes: checks the
# chaining, measures nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
out=${OUT:-/tmp/gpu_checks}
smoke=${GPU_CHECKS_SMOKE:+--smoke}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
timeout 190 python3 -m benchmarks.gpu_int4_matmul $smoke --deadline-s 150 --output "$out/gpu_int4_matmul.json" 2>&1 \
  | grep -v -i warning | tee "$out/gpu_int4_matmul.log" | tail -70
timeout 390 python3 -m benchmarks.gpu_engine $smoke --parts kernel,offsets --deadline-s 330 \
  --int4-tilings "$out/gpu_int4_matmul.json" --output "$out/gpu_engine_kernel.json" 2>&1 | grep -v -i warning | tee "$out/gpu_engine_kernel.log" | tail -40
