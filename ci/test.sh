#!/usr/bin/env bash
# The project's tests on a CPU machine: kernels under Triton's interpreter, references,
# the plugin's own tests; then the example kernel package through the installed plugin
# (ci/example.sh). Two workers: CI machines have 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}
# worksteal: the long plugin tests (real child processes, 10-36 s each) land wherever a
# worker is free; with xdist's default split one worker was left finishing them alone
# (526 s against 568 s for the suite, one run each, on 2 cores)
TRITON_INTERPRET=1 "$PY" -m pytest -n "${FLA_WORKERS:-2}" --dist worksteal -q -p no:randomly "$@"
PYTHON=$PY bash ci/example.sh
