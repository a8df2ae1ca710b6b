#!/usr/bin/env bash
# GPU job for one arch (the CI matrix runs one per runner): ci/gpu_job.sh sm90
# On a runner whose GPU is that arch the checks run natively; an sm90 runner can also
# take sm80/sm86/sm89 (emulated) and the compile-only archs.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${1:?usage: ci/gpu_job.sh ARCH}
PY=${PYTHON:-python3}
source ci/selection.sh
exec "$PY" -m pytest -q -p no:randomly --fla-arch="$ARCH" --fla-blocking --fla-isolate=module \
  --fla-report="fla-report-$ARCH.json" --junitxml="junit-$ARCH.xml" "${OPS[@]}" "$@"
