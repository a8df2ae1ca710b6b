#!/usr/bin/env bash
# The project's tests on a CPU machine: kernels under Triton's interpreter, references,
# the plugin's own tests; then the example kernel package as a user installs it: the plugin
# built as a wheel into a fresh environment, the example checked from a copy outside this
# repository (ci/wheel_example.sh; ci/example.sh runs it in place, through the editable
# install). Two workers: CI machines have 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}
# worksteal: a worker that runs out of tests takes queued ones from the other, so the long
# plugin tests (real child processes, 10-36 s each) do not leave one worker finishing
# alone (the suite 526 s against 568 s with the default split, one run each, 2 cores)
TRITON_INTERPRET=1 "$PY" -m pytest -n "${FLA_WORKERS:-2}" --dist worksteal -q -p no:randomly "$@"
# the conformance suite's bf16 checks, skipped above (the interpreter's bf16 is wrong), with the
# GPU's bf16 arithmetic patched in: what only bf16 work runs is checked without a GPU (436 s)
[ $# -eq 0 ] && TRITON_INTERPRET=1 "$PY" -m pytest tests/test_conformance.py -k bf16 --fla-bf16-emulated \
  -n "${FLA_WORKERS:-2}" -q -p no:randomly
bash ci/wheel_example.sh
