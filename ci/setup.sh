#!/usr/bin/env bash
# Creates .venv with the pinned CPU toolchain and installs the project in editable mode.
# Pins: torch 2.13.0 is the CPU build on local disk; triton 3.6.0 matches the GPU machines;
# triton 3.6's interpreter needs numpy < 2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 triton==3.6.0 'numpy<2.4'
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
