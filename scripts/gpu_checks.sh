#!/usr/bin/env bash
# The prepared device checks for issue 46, as one call of the device tool (`run`, command
# "bash scripts/gpu_checks.sh", timeout_s 600; about 9 minutes): the int4 matmul forms alone
# (benchmarks/gpu_int4_matmul.py), then asymmetric against symmetric int4 through the engine
# (benchmarks/gpu_engine.py --parts offsets). Each is cut by its own deadline so both report; JSON and logs go
# to $OUT (the device tool's folder; /tmp/gpu_checks elsewhere). Commit them under benchmarks/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.92
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
timeout 250 python3 -m benchmarks.gpu_int4_matmul --deadline-s 200 --output "$out/gpu_int4_matmul.json" 2>&1 \
  | grep -v -i warning | tee "$out/gpu_int4_matmul.log" | tail -70
timeout 290 python3 -m benchmarks.gpu_engine --parts offsets --deadline-s 250 \
  --output "$out/gpu_engine_offsets.json" 2>&1 | grep -v -i warning | tee "$out/gpu_engine_offsets.log" | tail -40
