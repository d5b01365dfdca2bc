#!/usr/bin/env bash
# The main job: sets up .venv and runs the MagicDec demo on the embedded SmolLM2-135M (extra flags pass through).
set -euo pipefail
source "$(dirname "$0")/setup_env.sh" models
python run.py "$@"
