#!/usr/bin/env bash
# GPU job for one arch (the CI matrix runs one per runner): ci/gpu_job.sh sm90
# On a runner whose GPU is that arch the checks run natively; an sm90 runner can also
# take sm80/sm86/sm89 (emulated) and the compile-only archs.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:?usage: ci/gpu_job.sh ARCH}
PY=${PYTHON:-python3}
source ci/selection.sh
status=0
"$PY" -m pytest -q -p no:randomly --fla-arch="$ARCH" --fla-blocking --fla-isolate=module \
  --fla-report="fla-report-$ARCH.json" --junitxml="junit-$ARCH.xml" "${OPS[@]}" "$@" || status=$?
# The checks once more at the cases' small dims: narrow heads and masked block edges meet
# GPU-only faults that the GPU-sized cases miss (chunk_delta_rule's bf16 gradients at K = 16
# on sm90 went wrong only there). Small shapes make it the shorter run.
"$PY" -m pytest -q -p no:randomly --fla-arch="$ARCH" --fla-blocking --fla-isolate=module --fla-small-shapes \
  --fla-report="fla-report-$ARCH-small.json" --junitxml="junit-$ARCH-small.xml" "${OPS[@]}" tests/test_conformance.py \
  || status=$?
exit "$status"
