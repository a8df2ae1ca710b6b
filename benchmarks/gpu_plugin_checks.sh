#!/usr/bin/env bash
# The plugin's GPU checks, timed: the planted faults (memcheck, isolation, sm86 emulation),
# the simple_gla checks emulated as sm80, and the simple_gla suite with and without
# compute-sanitizer memcheck. Prints a table last and keeps it in benchmarks/.
#
#   bash benchmarks/gpu_plugin_checks.sh            # every step (about 15-25 minutes)
#   bash benchmarks/gpu_plugin_checks.sh faults     # one step: faults | tools | emulated | plain | memcheck | memcheck_module
#                                                   # | every_tool | repro
#   FLA_SANITIZER_OPS=all bash benchmarks/gpu_plugin_checks.sh every_tool  # all four tools over a selection of every op
#                                                   # (FLA_SANITIZER_SELECT: a -k expression, default "test_backward and bf16")
#   FLA_SANITIZER_OPS=all bash benchmarks/gpu_plugin_checks.sh memcheck   # every op's checks under memcheck
#   FLA_SANITIZER_OPS=part_a bash benchmarks/gpu_plugin_checks.sh memcheck  # half of them (then part_b): one device call each
#
# Each step is one pytest run, so a device whose commands are capped at 10 minutes can
# run the steps one call at a time; timings accumulate in gpu_plugin_checks.tsv in the log folder.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${FLA_LOG_DIR:-benchmarks}  # where the logs and the timing table go
mkdir -p "$LOGS"
TSV=$LOGS/gpu_plugin_checks.tsv
OPS=${FLA_SANITIZER_OPS:-chunk_simple_gla,fused_recurrent_simple_gla}  # "all": every op's checks
# Every op's checks in two halves of about equal time under memcheck (by recorded seconds),
# one 10-minute device call each: FLA_SANITIZER_OPS=part_a, then part_b
case "$OPS" in
  part_a) OPS=chunk_kda,chunk_rwkv7,chunk_dplr_delta_rule,chunk_delta_rule,parallel_attn,chunk_hgrn,fused_recurrent_kda,fused_recurrent_gated_delta_rule,fused_recurrent_rwkv6,fused_recurrent_dplr_delta_rule,fused_recurrent_gla,fused_recurrent_retention,fused_recurrent_rwkv7,rms_norm ;;
  part_b) OPS=chunk_gated_delta_rule,fused_recurrent_delta_rule,chunk_gla,fused_recurrent_hgrn,gated_delta_net,apply_rotary,rotary_embedding,l2norm,rms_norm_gated,causal_conv1d,chunk_rwkv6,chunk_simple_gla,fused_recurrent_simple_gla,chunk_retention,chunk_linear_attn,fused_recurrent_linear_attn ;;
esac
[ "$OPS" = all ] && OPS_ARG=() || OPS_ARG=("--fla-ops=$OPS")
WORKERS=${FLA_SANITIZER_WORKERS:-8}
TOOLS=${FLA_SANITIZER_TOOLS:-memcheck,racecheck,initcheck,synccheck}
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || echo "note: editable install failed; the pytest11 entry point must already be registered"
[ -f "$TSV" ] || printf 'step\tcommand\tseconds\texit\tsummary\n' > "$TSV"

step() {  # name, then the pytest arguments
  local name=$1; shift
  local log=$LOGS/gpu_plugin_checks.$name.log start end rc
  echo "== $name: pytest $*"
  start=$(date +%s.%N)
  "$PY" -m pytest -p no:cacheprovider "$@" >>"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  tail -n 25 "$log"
  printf '%s\tpytest %s\t%.1f\t%s\t%s\n' "$name" "$*" "$(awk "BEGIN{print $end - $start}")" "$rc" \
    "$(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed|skipped).* in ' "$log" | tail -n 1)" >> "$TSV"
}

# A caller's time limit arrives as SIGINT (timeout -s INT): pytest stops and writes its summary
# and --fla-report; this script records the step and starts no other. A trap, not an ignored
# INT, so that pytest keeps Python's own handler.
interrupted=
trap 'interrupted=1; echo "== interrupted: time limit"' INT

want() { [ -z "$interrupted" ] && { [ "${1}" = all ] || [ "${1}" = "$2" ]; }; }
WHAT=${1:-all}
# Warm the per-target Triton caches first, so 'plain' and 'memcheck' time the checks, not compilation.
want "$WHAT" plain && "$PY" -m pytest -p no:cacheprovider -q tests/test_conformance.py "${OPS_ARG[@]}" -n "$WORKERS" >/dev/null 2>&1
want "$WHAT" faults && step faults tests/plugin -v -rs
# each tool's planted fault and the clean kernels through the plugin, and the output reading
want "$WHAT" tools && step tools tests/plugin/test_gpu_faults.py tests/plugin/test_sanitizer_output.py -k "each_tool or verdict" -v -n 4
want "$WHAT" emulated && step emulated tests/test_conformance.py --fla-arch=sm80 "${OPS_ARG[@]}"
# -v and a JSON report: every test's outcome and duration, even from a run cut short
want "$WHAT" plain && step plain tests/test_conformance.py "${OPS_ARG[@]}" -n "$WORKERS" -v --fla-report="$LOGS/report.plain.json"
# FLA_DURATIONS: an earlier run's report (--fla-durations), so the longest batches start first
want "$WHAT" memcheck && step memcheck tests/test_conformance.py "${OPS_ARG[@]}" --fla-sanitizer=memcheck -n "$WORKERS" -v \
  --fla-report="$LOGS/report.memcheck.json" ${FLA_DURATIONS:+"--fla-durations=$FLA_DURATIONS"} \
  ${FLA_SANITIZER_STALL:+"--fla-sanitizer-stall=$FLA_SANITIZER_STALL"}
# the same under module batches: one sanitizer process per batch of a worker's tests
want "$WHAT" memcheck_module && step memcheck_module tests/test_conformance.py "${OPS_ARG[@]}" --fla-sanitizer=memcheck \
  --fla-isolate=module -n "$WORKERS" -v --fla-report="$LOGS/report.memcheck_module.json"
# every tool over a selection of every op's checks: no report may fail a correct kernel
want "$WHAT" every_tool && step every_tool tests/test_conformance.py "${OPS_ARG[@]}" -k "${FLA_SANITIZER_SELECT:-test_backward and bf16}" \
  --fla-sanitizer="$TOOLS" -n "$WORKERS" -v --fla-report="$LOGS/report.every_tool.json"
want "$WHAT" repro && step repro tests/repro -p no:randomly --fla-sanitizer="$TOOLS" -v -n 4

echo
echo "GPU: $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -n 1)"
cat "$TSV"
