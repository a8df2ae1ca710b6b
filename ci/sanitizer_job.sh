#!/usr/bin/env bash
# Sanitizer job: every selected test re-run under compute-sanitizer (memcheck, racecheck,
# initcheck, synccheck by default), several tests at a time on the runner's GPU, after a
# check of the tools on planted faults.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TOOLS=${FLA_SANITIZER_TOOLS:-memcheck,racecheck,initcheck,synccheck}
source ci/selection.sh
# First the tools themselves on this runner: each must report its planted fault and pass the
# clean kernels through the plugin, and its output must read as recorded (a new
# compute-sanitizer that prints otherwise fails here, not as false verdicts below).
"$PY" -m pytest -q -p no:randomly tests/plugin/test_gpu_faults.py tests/plugin/test_sanitizer_output.py \
  -k "each_tool or verdict or racecheck or print_limit or cuda_call"
exec "$PY" -m pytest -q -p no:randomly --fla-sanitizer="$TOOLS" -n "${FLA_SANITIZER_WORKERS:-8}" \
  --fla-report=fla-report-sanitizer.json "${OPS[@]}" tests/test_conformance.py tests/repro "$@"
