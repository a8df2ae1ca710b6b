#!/usr/bin/env bash
# The example kernel package (examples/token_cumsum) through the installed plugin, as
# another repository runs it: its numeric checks under the interpreter, its kernels
# compiled for every arch (--fla-arch=all, one worker per target) and its repro.
set -euo pipefail
cd "$(dirname "$0")/../examples/token_cumsum"
PY=${PYTHON:-$(cd ../.. && pwd)/.venv/bin/python}
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TRITON_INTERPRET= exec "$PY" -m pytest -q -p no:randomly --fla-arch=all "$@"
