#!/usr/bin/env bash
# The prepared device call (the device tool's `run`, command "bash scripts/gpu_checks.sh", timeout_s 600): the GPU
# harness (benchmarks/gpu/harness.py) in one process, by default its parts for MagicDec's own table on one GPU
# (paper, stream, tree: each within its own budget, no configuration starting after 480 s, ~8 minutes on an
# H100), the JSON and its log rewritten as each configuration ends, to $OUT (the device tool's folder;
# /tmp/gpu_checks elsewhere). Commit them under benchmarks/results/ and list them in results/INDEX.md; how each
# part is reported: docs/gpu.md#the-papers-table-on-one-gpu. Extra arguments go to the harness (e.g.
# `--parts headline,batch1 --deadline-s 400`). GPU_CHECKS_SMOKE=1 runs it at --smoke sizes (CPU, minutes:
# checks the chaining, measures nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
# the device image lacks some of the package's needs (outlines-core, gguf): carried as wheels in .whl/
# (docs/gpu.md#harness says how to fetch them), installed outside the image's site-packages
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
out=${OUT:-/tmp/gpu_checks}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$out/device.txt"
timeout 570 python3 -m benchmarks.gpu.harness ${GPU_CHECKS_SMOKE:+--smoke} --parts paper,stream,tree \
  --deadline-s 480 --output "$out/gpu_harness.json" "$@" 2>&1 | grep -v -i warning | tail -80
