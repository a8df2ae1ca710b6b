#!/usr/bin/env bash
# Creates a virtual environment with the CPU toolchain and installs the project in editable mode.
# Default: .venv with the pinned toolchain: torch 2.13.0 is the CPU build on local disk;
# triton 3.6.0 matches the GPU machines; triton 3.6's interpreter needs numpy < 2.4 (later
# ones take the newest numpy, as a user's install would).
# No pip cache: the wheels are installed once per environment, and a cached copy of torch
# and triton (about 1 GB) only fills the disk (a CI run once failed in setup on a full disk).
# FLA_VENV and FLA_TRITON pick another environment, e.g. the newest tested Triton:
#   FLA_VENV=.venv-triton3.9 FLA_TRITON=3.9.0 bash ci/setup.sh
# FLA_TORCH_FROM names the Python of an environment whose torch to hard-link in first
# (ci/share_torch.py: the same wheel's files, 1 s in place of pip's 30 s), e.g. .venv's for
# the newest-Triton one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FLA_VENV:-.venv}
TRITON=${FLA_TRITON:-3.6.0}
case "$TRITON" in 3.6.*) NUMPY='numpy<2.4' ;; *) NUMPY=numpy ;; esac
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if [ -n "${FLA_TORCH_FROM:-}" ]; then
  "$FLA_TORCH_FROM" ci/share_torch.py "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir torch==2.13.0 "triton==$TRITON" "$NUMPY"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -e '.[test]'
