#!/usr/bin/env bash
# The project's tests on a CPU machine: kernels under Triton's interpreter, references,
# the plugin's own tests; then the example kernel package through the installed plugin
# (ci/example.sh). Two workers: CI machines have 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}
TRITON_INTERPRET=1 "$PY" -m pytest -n "${FLA_WORKERS:-2}" -q -p no:randomly "$@"
PYTHON=$PY bash ci/example.sh
