#!/usr/bin/env bash
# The plugin as a user installs it: the package built as a wheel, a fresh environment with
# that wheel, torch, Triton and pytest, and the example kernel package (examples/token_cumsum)
# copied outside this repository and checked there as ci/example.sh checks it in place (its
# numeric checks under the interpreter, its kernels compiled for every arch, its repro).
# The example's `test = ["pytest-fla"]` resolves to the built wheel (--find-links).
# Everything lives in one temporary folder, removed at the end; no pip cache (the
# environment is about 1.5 GB, a cached copy of torch and Triton would double it).
# FLA_WHEEL_KEEP=1 keeps the folder (its path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON_FOR_VENV:-python3}
TRITON=${FLA_TRITON:-3.6.0}
case "$TRITON" in 3.6.*) NUMPY='numpy<2.4' ;; *) NUMPY=numpy ;; esac
PIP=(-m pip install -q --disable-pip-version-check --no-cache-dir)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fla-wheel.XXXXXX")
[ "${FLA_WHEEL_KEEP:-0}" = 1 ] && echo "== wheel: working in $WORK" || trap 'rm -rf "$WORK"' EXIT
start=$SECONDS
lap() { echo "== wheel: $1 at $((SECONDS - start)) s"; }

# Built from a copy of the files git knows (tracked, or untracked and not ignored): an
# in-tree build reuses build/lib, where a module deleted from the source stays and would
# ship in the wheel.
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done |  # not the deleted ones
  xargs -0 cp --parents -t "$WORK/src"
"$PY" -m pip wheel -q --disable-pip-version-check --no-cache-dir --no-deps "$WORK/src" -w "$WORK/wheels"
rm -rf "$WORK/src"
lap "built $(cd "$WORK/wheels" && ls)"

"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
# torch as the same wheel's files hard-linked from this checkout's environment where it has
# that torch (ci/share_torch.py; pip then finds it installed): torch is not what this checks,
# and its unpacking was 30 s of the step. The plugin, pytest and the example still come
# from pip into this environment alone.
SRC_PY=${PYTHON:-$PWD/.venv/bin/python}
if [ -x "$SRC_PY" ] && [ "$("$SRC_PY" -c 'import importlib.metadata as m; print(m.version("torch").split("+")[0])' 2>/dev/null)" = 2.13.0 ]; then
  "$SRC_PY" ci/share_torch.py "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
fi
"$VPY" "${PIP[@]}" torch==2.13.0 "triton==$TRITON" "$NUMPY" pytest pytest-xdist
# the example with its test extra: pytest-fla from the wheel folder, nothing from this checkout
cp -r examples/token_cumsum "$WORK/token_cumsum"
rm -rf "$WORK/token_cumsum/.pytest_cache"
find "$WORK/token_cumsum" -name __pycache__ -prune -exec rm -rf {} +
"$VPY" "${PIP[@]}" --find-links "$WORK/wheels" "$WORK/token_cumsum[test]"
lap "environment ready ($(du -sh "$WORK/venv" | cut -f1))"

# the plugin must come from the environment, not from this repository
where=$(cd "$WORK" && "$VPY" -c "import pytest_fla, os; print(os.path.dirname(pytest_fla.__file__))")
case "$where" in "$WORK/venv/"*) ;; *) echo "== wheel: pytest_fla imported from $where, not the environment" >&2; exit 1 ;; esac

cd "$WORK/token_cumsum"
TRITON_INTERPRET= "$VPY" -m pytest -q -p no:randomly --fla-arch=all "$@"
lap "example checked"
