#!/usr/bin/env bash
# The example kernel package (examples/token_cumsum) through the installed plugin, as
# another repository runs it: its numeric checks under the interpreter, its kernels
# compiled for every arch (--fla-arch=all, one worker per target) and its repro. Nothing
# puts the package on the path: its pyproject's `pythonpath` does, as the README says.
set -euo pipefail
cd "$(dirname "$0")/../examples/token_cumsum"
PY=${PYTHON:-$(cd ../.. && pwd)/.venv/bin/python}
TRITON_INTERPRET= exec "$PY" -m pytest -q -p no:randomly --fla-arch=all "$@"
