#!/usr/bin/env bash
# The project's tests on a CPU machine: kernels under Triton's interpreter, references,
# the plugin's own tests. Two workers: CI machines have 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITON_INTERPRET=1
exec .venv/bin/python -m pytest -n "${FLA_WORKERS:-2}" -q -p no:randomly "$@"
