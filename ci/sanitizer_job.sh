#!/usr/bin/env bash
# Sanitizer job: every selected test re-run under compute-sanitizer (memcheck, racecheck,
# initcheck, synccheck by default), several tests at a time on the runner's GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TOOLS=${FLA_SANITIZER_TOOLS:-memcheck,racecheck,initcheck,synccheck}
source ci/selection.sh
exec "$PY" -m pytest -q -p no:randomly --fla-sanitizer="$TOOLS" -n "${FLA_SANITIZER_WORKERS:-8}" \
  --fla-report=fla-report-sanitizer.json "${OPS[@]}" tests/test_conformance.py tests/repro "$@"
