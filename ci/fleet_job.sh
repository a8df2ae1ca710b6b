#!/usr/bin/env bash
# One run over several GPU hosts (--fla-arch=fleet): every host runs its own GPUs' arch
# natively, one xdist worker per GPU; archs no host has run emulated or compile-only; one
# report (fla-report-fleet.json) names the host of every cell.
#   FLA_FLEET_HOSTS="a100-box h100-box"  ssh names of the GPU hosts; each has this commit
#                                        checked out at $FLA_FLEET_DIR, installed in its .venv
#   FLA_FLEET_TX="popen//env:... ..."    or the xdist gateways themselves, one per host
#   FLA_FLEET_ARCH=fleet,all             the archs (default: the hosts' own, and every other
#                                        one emulated or compile-only)
# This machine (the controller) needs pytest, pytest-xdist and this package; not torch or Triton.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TX=()
if [ -n "${FLA_FLEET_TX:-}" ]; then
  for spec in $FLA_FLEET_TX; do TX+=(--tx "$spec"); done
else
  DIR=${FLA_FLEET_DIR:?set FLA_FLEET_DIR (the checkout on each host) or FLA_FLEET_TX}
  for host in ${FLA_FLEET_HOSTS:?set FLA_FLEET_HOSTS (ssh names) or FLA_FLEET_TX}; do
    TX+=(--tx "ssh=$host//python=$DIR/.venv/bin/python//chdir=$DIR")
  done
fi
source ci/selection.sh
exec "$PY" -m pytest -q -p no:randomly --fla-arch="${FLA_FLEET_ARCH:-fleet,all}" "${TX[@]}" --fla-blocking \
  --fla-isolate=module --fla-report=fla-report-fleet.json --junitxml=junit-fleet.xml "${OPS[@]}" "$@"
