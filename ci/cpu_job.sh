#!/usr/bin/env bash
# CPU job, on every change: numeric checks under the interpreter plus compile-only checks
# for every arch (one pytest-xdist worker per compile-only target, two sharing the interpreter's
# tests), the plugin's own tests, the repros; bf16 too under the interpreter, with the GPU's
# bf16 arithmetic patched in (--fla-bf16-emulated: the conformance suite's bf16 checks, 561,
# pass on Triton 3.6, 3.7.1, 3.8 and 3.9 in 313-436 s on 2 cores);
# then the example kernel package (ci/example.sh; FLA_EXAMPLE_ARGS, split on spaces, go to its
# pytest after its own --fla-arch=all). Writes the ops x checks report to $FLA_REPORT
# (default fla-report-cpu.json).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$PWD/.venv/bin/python}  # absolute: ci/example.sh runs from the example's folder
source ci/selection.sh
"$PY" -m pytest -q -p no:randomly --fla-arch=all --fla-bf16-emulated -n "${FLA_WORKERS:-2}" --fla-report="${FLA_REPORT:-fla-report-cpu.json}" "${OPS[@]}" "$@"
# shellcheck disable=SC2086 # FLA_EXAMPLE_ARGS: several words
PYTHON=$PY bash ci/example.sh ${FLA_EXAMPLE_ARGS:-}
