#!/usr/bin/env bash
# CPU job, on every change: numeric checks under the interpreter plus compile-only checks
# for every arch (one pytest-xdist worker per compile-only target, two sharing the interpreter's
# tests), the plugin's own tests, the repros;
# then the example kernel package (ci/example.sh). Writes the ops x checks report to
# $FLA_REPORT (default fla-report-cpu.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
source ci/selection.sh
"$PY" -m pytest -q -p no:randomly --fla-arch=all -n "${FLA_WORKERS:-2}" --fla-report="${FLA_REPORT:-fla-report-cpu.json}" "${OPS[@]}" "$@"
PYTHON=$PY bash ci/example.sh
