#!/usr/bin/env bash
# One GPU session's work, in parts that each fit one 10-minute command:
#   bash benchmarks/gpu_run.sh tests   # conformance suite on the GPU (fp32 + bf16, realistic sizes), errors recorded
#   bash benchmarks/gpu_run.sh bench   # every op timed against the peer library, table last
#   bash benchmarks/gpu_run.sh plugin  # the plugin's GPU checks (planted faults, sanitizer, sm80 emulation)
# Expects the peer library's wheel (fla-core 0.6.0, pure Python) in .whl/. Outputs go to
# $OUT (when set) and are copied into benchmarks/results/ by whoever fetched them.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-tests}; shift || true
OUT=${OUT:-/tmp/fla-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
case "$part" in
  session)
    # Everything one lease allows, in one command: timings first on an idle GPU, then the
    # conformance suite and the plugin's GPU checks side by side (timings no longer matter).
    timeout "${FLA_BENCH_TIMEOUT:-240}" python3 benchmarks/bench.py --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | grep -v '^{' | tail -30
    ( timeout "${FLA_PLUGIN_TIMEOUT:-250}" python3 -m pytest tests/test_conformance.py --fla-arch=sm80 -q -p no:cacheprovider \
        --fla-ops=chunk_simple_gla,fused_recurrent_simple_gla -k "forward or error" > "$OUT/emulated_sm80.log" 2>&1
      FLA_SMALL_SHAPES=1 timeout "${FLA_PLUGIN_TIMEOUT:-250}" python3 -m pytest tests/test_conformance.py -q -p no:cacheprovider \
        --fla-ops=chunk_simple_gla --fla-sanitizer=memcheck -n 4 -k "(forward or backward) and fp32" > "$OUT/memcheck.log" 2>&1 ) &
    FLA_RECORD_ERRORS=$OUT/errors.jsonl timeout "${FLA_TEST_TIMEOUT:-280}" python3 -m pytest tests/test_conformance.py \
      -n "${FLA_WORKERS:-8}" -v -p no:cacheprovider "$@" > "$OUT/tests.log" 2>&1
    wait
    python3 benchmarks/summarize_errors.py "$OUT/errors.jsonl" > "$OUT/errors.md"
    echo "== emulated sm80:"; tail -n 3 "$OUT/emulated_sm80.log"
    echo "== memcheck:"; grep -E "passed|failed|Invalid|error" "$OUT/memcheck.log" | tail -n 5
    echo "== conformance failures:"; grep -E " FAILED | ERROR " "$OUT/tests.log" | sed 's/ - .*//' | head -40
    echo "== conformance:"; grep -cE " PASSED " "$OUT/tests.log"; grep -E "passed|failed" "$OUT/tests.log" | tail -n 2
    cat "$OUT/errors.md"
    grep -A30 '^| op ' "$OUT/bench.md" 2>/dev/null
    ;;
  tests)
    FLA_RECORD_ERRORS=$OUT/errors.jsonl timeout "${FLA_TEST_TIMEOUT:-540}" python3 -m pytest tests/test_conformance.py \
      -n "${FLA_WORKERS:-6}" -q -p no:cacheprovider --junitxml="$OUT/junit.xml" -o junit_family=xunit1 "$@" 2>&1 | tee "$OUT/tests.log" | tail -60
    python3 benchmarks/summarize_errors.py "$OUT/errors.jsonl" | tee "$OUT/errors.md"
    ;;
  bench)
    python3 benchmarks/bench.py --out "$OUT/bench" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v '^{' | tail -40
    ;;
  plugin)
    bash benchmarks/gpu_plugin_checks.sh "$@" 2>&1 | tee "$OUT/plugin.log" | tail -60
    ;;
esac
