#!/usr/bin/env bash
# One GPU session's work, in parts that each fit one 10-minute device command:
#   bash benchmarks/gpu_run.sh bench [--ops a,b]  # every op timed against the peer library (idle GPU, interleaved
#                                         # rounds; FLA_BENCH_RESUME=1 finishes a cut run on the same machine;
#                                         # FLA_BENCH_GPUS=2: the ops dealt to two GPUs, timed at once); the run's
#                                         # rows merged into the GPU's one bench file (bench_h200.*: bench.py --merge)
#   bash benchmarks/gpu_run.sh sweep      # the slow kernels per config, and against a carried baseline tree
#                                         # (config_sweep.py; FLA_SWEEP_OPS=a,b, FLA_SWEEP_MATCH=<label regex> narrow it; FLA_SWEEP_ROUNDS;
#                                         # FLA_SWEEP_GRAPHS=1: CUDA-graph replays, the kernels without host time)
#   bash benchmarks/gpu_run.sh accuracy [--ops a,b]  # each op's bf16 errors beside the peer's (peer_accuracy.py,
#                                         # its kernels warmed first; --max-ratio 1.2)
#   bash benchmarks/gpu_run.sh ncu        # hardware counters (occupancy, stall reasons) of the chunk-parallel level
#                                         # kernels, one launch each (FLA_NCU_OPS=a,b; FLA_NCU_KERNELS: a name regex)
#   bash benchmarks/gpu_run.sh faults     # the plugin's own tests, planted faults included
#   bash benchmarks/gpu_run.sh multigpu   # -n auto on a several-GPU machine: one pinned worker per GPU
#   bash benchmarks/gpu_run.sh fleet      # --fla-arch=fleet on two GPUs: a popen gateway pinned to each, as two hosts
#   bash benchmarks/gpu_run.sh tests      # conformance suite on the GPU (fp32 + bf16, realistic sizes), errors
#                                         # recorded; the simple_gla checks emulated as sm80 beside it
#   bash benchmarks/gpu_run.sh torchcompile  # the torch.compile checks (tests/test_torch_compile.py) on the GPU
#   bash benchmarks/gpu_run.sh sanitizer  # simple_gla suite timed plain and under memcheck; repros under memcheck
#                                         # (FLA_STEP_LIMITS="plain:120 memcheck:330 memcheck_module:200 repro:80": steps, limits)
#   bash benchmarks/gpu_run.sh history [--ops a,b --checks c,d]  # the suite over every fla-core release in
#                                         # .whl/fla-core (peer_history.py): a release x op matrix of defects;
#                                         # resumable: a second call on the warm machine finishes the releases left
#   bash benchmarks/gpu_run.sh peer [--fla-ops=a,b]  # the conformance suite over fla-core's ops (--fla-impl=fla), a
#                                         # report (a markdown summary: which checks each op fails, and why), never a gate;
#                                         # FLA_PEER_TAG names the run's files, FLA_PEER_MARKERS its -m filter;
#                                         # FLA_PEER_PER_OP=1 FLA_PEER_OPS=a,b: one process per op (no -n)
# Expects the peer library's wheel (fla-core 0.6.0, pure Python) in .whl/. Each part leaves its
# logs in $OUT/<part>/ and one archive $OUT/<part>.tgz (a device returns few files); unpack it
# into benchmarks/results/. The summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-tests}; shift || true
OUT=${OUT:-/tmp/fla-out}
LOGS=$OUT/logs/$part/$part; mkdir -p "$LOGS"  # three levels down: only the archive travels back
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
# once a machine: a second install would replace the peer under a part still running beside this one
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/fla ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site/fla ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import importlib.metadata as m; m.distribution("pytest-fla")' 2>/dev/null ||  # once a machine, as above
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed"
# Isolated test children (each in a session of its own under a stall limit) and the tool
# can outlive a call cut at its limit on a machine that stays warm, loading the next call's
# CPU (host-bound bench lines, the sanitizer's start-ups). Each call says what it found and
# kills those left, at its start and its end (so run one part at a time in a call).
LEFTOVER='^[^ ]*(python[^ ]* -m pytest --fla-child=|compute-sanitizer )'
leftovers() { pgrep -af -- "$LEFTOVER" || true; }
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  compute-sanitizer --version 2>/dev/null | tail -n 1
  echo "load average (1, 5, 15 min): $(cut -d ' ' -f 1-3 /proc/loadavg)"
  left=$(leftovers); [ -n "$left" ] && printf 'still running from an earlier call (killed now):\n%s\n' "$left"
  pkill -KILL -f -- "$LEFTOVER"; } | tee "$LOGS/machine.txt"
case "$part" in
  bench)
    # The peer autotunes tens of configs per kernel on first call: compile everything in
    # parallel first (--warm), then time one op at a time on the idle GPU, in interleaved
    # rounds. The results live outside $OUT so that a call cut by its limit can be finished
    # by a second call on the same (still warm) machine: FLA_BENCH_RESUME=1 times only the
    # ops missing from them.
    keep=/tmp/fla-bench; mkdir -p "$keep"
    [ "${FLA_BENCH_RESUME:-0}" = 1 ] && resume=--resume || { resume=; rm -f "$keep"/bench.*; }
    timeout -s INT -k 20 "${FLA_BENCH_TIMEOUT:-560}" python3 benchmarks/bench.py --warm "${FLA_WARM_JOBS:-16}" \
      --rounds "${FLA_BENCH_ROUNDS:-5}" --gpus "${FLA_BENCH_GPUS:-1}" $resume --out "$keep/bench" "$@" > "$LOGS/bench.log" 2>&1
    echo "bench exit $?" >> "$LOGS/bench.log"
    cp "$keep"/bench.json "$keep"/bench.md "$LOGS/" 2>/dev/null
    # one file per measurement: this run's rows in place of the same ops' rows of the GPU's bench
    # (benchmarks/results/bench/bench_<gpu>.*, FLA_BENCH_INTO names another), into $LOGS to copy back
    gpus=${FLA_BENCH_GPUS:-1}; [ "$gpus" -gt 1 ] && several=_gpus$gpus || several=
    into=${FLA_BENCH_INTO:-bench${several}_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | awk '{print tolower($2)}')}
    cp "benchmarks/results/bench/$into.json.gz" "$LOGS/" 2>/dev/null
    [ -s "$keep/bench.json" ] && python3 benchmarks/bench.py --merge "$keep/bench.json" --into "$LOGS/$into" > /dev/null
    echo "== bench:"; grep -E "^warm-up|^copy bandwidth|Error" "$LOGS/bench.log" | sort | uniq -c | head; tail -n 1 "$LOGS/bench.log"
    cat "$LOGS/bench.md" 2>/dev/null
    ;;
  sweep)
    # The slow kernels' config variants (config_sweep.py), and the kernels as they were where
    # a baseline tree was carried along (.carry/baseline/kernels: see config_sweep.py): all
    # compiled in parallel first, then timed op by op on the idle GPU; per-kernel times last.
    timeout 330 python3 benchmarks/config_sweep.py --phase compile --jobs "${FLA_SWEEP_JOBS:-16}" --baseline .carry/baseline \
      ${FLA_SWEEP_OPS:+--ops $FLA_SWEEP_OPS} ${FLA_SWEEP_MATCH:+--match "$FLA_SWEEP_MATCH"} > "$LOGS/sweep_compile.log" 2>&1
    timeout -s INT "${FLA_SWEEP_TIMEOUT:-230}" python3 benchmarks/config_sweep.py --phase time --baseline .carry/baseline --profile \
      --rounds "${FLA_SWEEP_ROUNDS:-3}" ${FLA_SWEEP_GRAPHS:+--graphs} \
      ${FLA_SWEEP_OPS:+--ops $FLA_SWEEP_OPS} ${FLA_SWEEP_MATCH:+--match "$FLA_SWEEP_MATCH"} --out "$LOGS/sweep.json" > "$LOGS/sweep.log" 2>&1
    echo "== compile:"; tail -n 5 "$LOGS/sweep_compile.log"
    echo "== sweep:"; grep -v '^{' "$LOGS/sweep.log"
    ;;
  accuracy)
    # Each op's bf16 errors beside the peer's (docs/tolerances.md): the peer's kernels compiled
    # and autotuned first, an op per process, then every op measured in one process.
    timeout -s INT -k 20 "${FLA_ACCURACY_TIMEOUT:-560}" python3 benchmarks/peer_accuracy.py --warm "${FLA_WARM_JOBS:-16}" \
      --warm-limit 300 --max-ratio 1.2 --json "$LOGS/peer_accuracy.json" "$@" > "$LOGS/peer_accuracy.log" 2>&1
    echo "accuracy exit $?" >> "$LOGS/peer_accuracy.log"
    echo "== accuracy:"; grep -E "^\| |^over|failed|not measured|exit" "$LOGS/peer_accuracy.log" | tail -n 60
    ;;
  ncu)
    # One launch of each slow chunk-parallel kernel at the bench size, under Nsight Compute
    # (clocks left alone, as the timed runs have them). Occupancy, issue slots and stalls say whether
    # a kernel waits on registers, shared-memory round trips or its own dependency chain.
    for op in $(echo "${FLA_NCU_OPS:-chunk_gla,chunk_kda,chunk_dplr_delta_rule}" | tr , ' '); do
      timeout "${FLA_NCU_TIMEOUT:-150}" ncu --clock-control none --launch-count 4 \
        --kernel-name "regex:${FLA_NCU_KERNELS:-_intra_fwd|_qkg_bwd|kda_intra|kda_grad_keys|intra_fwd_kernel|qkabg_grad}" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
        python3 -c "import sys; sys.path[:0] = ['.', 'benchmarks']; import config_sweep as s; s._side('$op').forward_backward()" \
        > "$LOGS/ncu_$op.txt" 2>&1
      echo "== $op: exit $?"
      grep -E "^  [a-z_]+kernel|^  _[a-z_]+|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Stall|Issued Ipc|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|Memory Throughput|Compute \(SM\)" \
        "$LOGS/ncu_$op.txt" | head -n 60
    done
    ;;
  multigpu)
    # -n auto on a machine with several GPUs: one worker per GPU, each pinned to its own
    timeout 240 python3 -m pytest tests/plugin/test_gpu_faults.py -k auto_runs -v -p no:cacheprovider -rs > "$LOGS/pinning.log" 2>&1
    timeout 300 python3 -m pytest tests/test_conformance.py --fla-ops=chunk_simple_gla -n auto -v -p no:cacheprovider > "$LOGS/auto.log" 2>&1
    nvidia-smi -L >> "$LOGS/machine.txt"
    echo "== pinning:"; grep -E "PASSED|FAILED|SKIPPED|passed|failed|Error" "$LOGS/pinning.log" | tail -n 8
    echo "== -n auto:"; head -n 12 "$LOGS/auto.log" | grep -E "fla|created|platform"; tail -n 2 "$LOGS/auto.log"
    ;;
  fleet)
    # Two gateways pinned one GPU each stand for two hosts of one arch: they share its tests (each
    # once), sm80 runs emulated on the first; the matrix names each cell's hosts.
    timeout 200 python3 -m pytest tests/plugin/test_fleet.py -k two_gpus -v -s -p no:cacheprovider -p no:randomly -rs \
      > "$LOGS/two_gpus.log" 2>&1
    timeout 330 python3 -m pytest tests/test_conformance.py --fla-ops=l2norm,chunk_simple_gla -n 4 -p no:cacheprovider \
      -p no:randomly --fla-arch=fleet,sm80 --tx popen//env:CUDA_VISIBLE_DEVICES=0 --tx popen//env:CUDA_VISIBLE_DEVICES=1 \
      --fla-report="$LOGS/fleet-report.json" > "$LOGS/fleet.log" 2>&1
    echo "== two gateways (test_fleet.py):"; grep -E "PASSED|FAILED|SKIPPED|passed|failed" "$LOGS/two_gpus.log" | tail -n 4
    echo "== suite:"; grep -E "^fla (fleet|targets)|^  [a-z0-9#.-]+: |^  sm" "$LOGS/fleet.log" | head -n 12
    sed -n '/ops x checks per arch/,/^slowest/p' "$LOGS/fleet.log"; tail -n 1 "$LOGS/fleet.log"
    python3 - "$LOGS/fleet-report.json" <<'PY'
import collections, json, sys
tests = json.load(open(sys.argv[1]))["tests"]
count = collections.Counter((t["arch"], t["host"], t["gpu"], t["outcome"]) for t in tests)
print("arch   host            GPU  outcome   tests")
for (arch, host, gpu, outcome), n in sorted(count.items(), key=str):
    print(f"{arch:<6} {host or '-':<15} {gpu or '-':<4} {outcome:<9} {n}")
PY
    ;;
  faults)
    FLA_LOG_DIR=$LOGS timeout "${FLA_FAULTS_TIMEOUT:-300}" bash benchmarks/gpu_plugin_checks.sh faults > "$LOGS/faults.out" 2>&1
    echo "== planted faults:"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$LOGS/gpu_plugin_checks.faults.log" | sed 's/ - .*//' | tail -n 20
    ;;
  tests)
    # every worker's compiles (compile_log.py), kept on the machine: a later call compares its
    # own with them (what the Triton cache did not serve, what was new to it)
    compiles=/tmp/fla-compiles; mkdir -p "$compiles"; earlier=$(ls -t "$compiles"/*.jsonl 2>/dev/null | head -n 1)
    export FLA_COMPILE_LOG=$LOGS/compiles.jsonl
    [ "${FLA_EMULATED:-1}" = 1 ] && ( timeout "${FLA_EMULATED_TIMEOUT:-400}" python3 -m pytest tests/test_conformance.py --fla-arch=sm80 -q -p no:cacheprovider \
        --fla-ops=chunk_simple_gla,fused_recurrent_simple_gla,chunk_retention -n 2 > "$LOGS/emulated_sm80.log" 2>&1 ) &
    FLA_RECORD_ERRORS=$LOGS/errors.jsonl timeout -s INT -k 30 "${FLA_TEST_TIMEOUT:-520}" python3 -m pytest tests/test_conformance.py \
      -n "${FLA_WORKERS:-6}" -v -rs -p no:cacheprovider --durations=15 --fla-report="$LOGS/report.json" "$@" > "$LOGS/tests.log" 2>&1
    echo "conformance exit $?" >> "$LOGS/tests.log"
    wait
    python3 benchmarks/summarize_errors.py "$LOGS/errors.jsonl" > "$LOGS/errors.md"
    echo "== emulated sm80:"; grep -E "FAILED" "$LOGS/emulated_sm80.log" | head; tail -n 2 "$LOGS/emulated_sm80.log"
    echo "== conformance failures:"; grep -E " FAILED | ERROR " "$LOGS/tests.log" | sed 's/ - .*//;s/.*:://' | head -40
    echo "== conformance:"; echo "PASSED lines: $(grep -cE " PASSED " "$LOGS/tests.log")"; tail -n 2 "$LOGS/tests.log"
    grep -E "^tests run in their workers:" "$LOGS/tests.log"  # where the tests' seconds went (time_split)
    [ -s "$LOGS/report.json" ] && python3 benchmarks/check_seconds.py "$LOGS/report.json" | head -n 14
    [ -s "$FLA_COMPILE_LOG" ] && { python3 benchmarks/compile_log.py "$FLA_COMPILE_LOG" ${earlier:+--earlier "$earlier"}
      cp "$FLA_COMPILE_LOG" "$compiles/$(date +%s).jsonl"; gzip "$FLA_COMPILE_LOG"; }
    head -n 8 "$LOGS/errors.md"
    ;;
  torchcompile)
    # torch.compile over every spec (opcheck, compiled == eager at two lengths, CUDA graphs)
    timeout -s INT -k 30 "${FLA_COMPILE_TIMEOUT:-300}" python3 -m pytest tests/test_torch_compile.py -n "${FLA_WORKERS:-8}" -q -rf \
      -p no:cacheprovider --fla-report="$LOGS/torch_compile_report.json" "$@" > "$LOGS/torch_compile.log" 2>&1
    echo "torch.compile checks exit $?" >> "$LOGS/torch_compile.log"
    echo "== torch.compile checks:"; grep -E "^FAILED" "$LOGS/torch_compile.log" | sed 's/ - .*//' | head -20; tail -n 2 "$LOGS/torch_compile.log"
    ;;
  history)
    # each release's report kept outside $OUT: a call cut at its limit leaves the finished
    # releases for the next call on the same machine, which runs only the ones left
    keep=/tmp/fla-history-reports; mkdir -p "$keep"
    # and the finished ones an earlier machine sent back, carried in .carry/history
    cp -n .carry/history/report_*.json "$keep"/ 2>/dev/null || true
    timeout -s INT -k 20 "${FLA_HISTORY_TIMEOUT:-560}" python3 benchmarks/peer_history.py run --out "$keep" \
      --workers "${FLA_WORKERS:-16}" --timeout "${FLA_HISTORY_RELEASE_TIMEOUT:-400}" "$@" > "$LOGS/history.log" 2>&1
    echo "history exit $?" >> "$LOGS/history.log"
    python3 benchmarks/peer_history.py matrix "$keep" --markdown "$LOGS/matrix.md" --json "$LOGS/matrix.json" > /dev/null
    cp "$keep"/report_*.json "$keep"/tests_*.log "$LOGS/" 2>/dev/null
    echo "== history:"; grep -E "^== fla-core" "$LOGS/history.log"; cat "$LOGS/matrix.md"
    ;;
  peer)
    # Batch isolation (one subprocess per check and op): a device fault (a mis-shaped gate read out of bounds) fails its own test, and the
    # batch's remaining tests go on in a fresh process instead of failing after it (module isolation reported nothing in
    # 480 s: the suite is one module, so each worker ran one long batch). The 2**31-element
    # checks are left out unless FLA_PEER_MARKERS says otherwise (tens of GiB and minutes per op).
    # FLA_PEER_PER_OP=1 with FLA_PEER_OPS=a,b,...: one pytest process per op, all at once, each
    # running its op's checks in turn. The peer autotunes tens of configs per kernel; spread over
    # xdist workers, every worker compiled the same op's configs at once (16 workers reported
    # 18 tests in 520 s), where one process per op compiles each config once.
    tag=${FLA_PEER_TAG:-all}
    peer_pytest() {  # $1: the report's file suffix; the rest: pytest arguments
      local suffix=$1; shift
      timeout -s INT -k 30 "${FLA_PEER_TIMEOUT:-540}" python3 -m pytest tests/test_conformance.py --fla-impl=fla \
        --fla-isolate="${FLA_PEER_ISOLATE:-batch}" -v -rs -p no:cacheprovider -m "${FLA_PEER_MARKERS:-not large_memory}" \
        --fla-report="$LOGS/report_$suffix.json" "$@" > "$LOGS/tests_$suffix.log" 2>&1
      echo "peer suite exit $? (failures are the peer's: this run is a report)" >> "$LOGS/tests_$suffix.log"
    }
    if [ "${FLA_PEER_PER_OP:-0}" = 1 ]; then
      for op in ${FLA_PEER_OPS//,/ }; do peer_pytest "${tag}_$op" --fla-ops="$op" "$@" & done
      wait
      python3 benchmarks/peer_report.py "$LOGS"/report_"${tag}"_*.json > "$LOGS/peer_$tag.md"
      tail -q -n 1 "$LOGS"/tests_"${tag}"_*.log > "$LOGS/tests_$tag.log"
    else
      peer_pytest "$tag" -n "${FLA_WORKERS:-8}" "$@"
      python3 benchmarks/peer_report.py "$LOGS/report_$tag.json" > "$LOGS/peer_$tag.md"
    fi
    echo "== peer ($tag):"; tail -n 2 "$LOGS/tests_$tag.log"; head -n 80 "$LOGS/peer_$tag.md"
    ;;
  sanitizer)
    # CPU and GPU load every 5 s beside the steps: whether the run waits on the cores
    # (compiles, the tool's instrumenting) or on the device
    vmstat -n 5 > "$LOGS/vmstat.log" 2>&1 & cpu_log=$!
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 > "$LOGS/gpu_load.log" 2>&1 & gpu_log=$!
    # and every 60 s what each isolated child is doing (a batch still running when the run is
    # cut leaves nothing in the report): its age, tests begun, the last one, its output's end
    while sleep 60; do
      echo "== $(date +%T)"
      for d in "${TMPDIR:-/tmp}"/fla-child-*/; do
        [ -f "$d/items.txt" ] || continue
        printf '%s age %ss, %s of %s tests begun, last: %s\n' "$d" $(( $(date +%s) - $(stat -c %Y "$d/items.txt") )) \
          "$(grep -c '"begin"' "$d/results.jsonl" 2>/dev/null || echo 0)" "$(wc -l < "$d/items.txt")" \
          "$(grep -o '"begin": "[^"]*"' "$d/results.jsonl" 2>/dev/null | tail -n 1)"
        grep -q "COMPUTE-SANITIZER" "$d/stdout" 2>/dev/null && echo "    (under compute-sanitizer)"
        tail -c 300 "$d/stderr" 2>/dev/null | tail -n 2 | sed 's/^/    stderr: /'
      done
    done > "$LOGS/children.log" 2>&1 & child_log=$!
    # 40 s before the first step's limit, every isolated child writes its Python stacks to its
    # stderr (SIGUSR1: pytest_fla.running.isolation; a child still importing holds the signal until its
    # handler is registered); the stacks of those still running are kept. Only
    # the Python children: compute-sanitizer, whose command line holds theirs, dies of SIGUSR1
    first_limit=${FLA_STEP_LIMITS:-x:120}; first_limit=${first_limit%% *}; first_limit=${first_limit##*:}
    { sleep $(( first_limit > 60 ? first_limit - 40 : 20 )); pkill -USR1 -f -- "^[^ ]*python[^ ]* -m pytest --fla-child=" ; sleep 5
      for d in "${TMPDIR:-/tmp}"/fla-child-*/; do
        [ -f "$d/stderr" ] && { echo "== $d"; grep -A40 "Thread 0x\|Current thread" "$d/stderr" | tail -n 60; }
      done; } > "$LOGS/children_stacks.log" 2>&1 & stacks_log=$!
    # every child's compiles, one line each: how much compile time went to kernels another
    # process was compiling at the same moment (compile_log.py)
    export FLA_COMPILE_LOG=$LOGS/compiles.jsonl
    for step_limit in ${FLA_STEP_LIMITS:-plain:120 memcheck:330 repro:80}; do
      # SIGINT first: a step cut at its limit still writes its report and timing row
      FLA_LOG_DIR=$LOGS timeout -s INT -k 30 "${step_limit#*:}" bash benchmarks/gpu_plugin_checks.sh "${step_limit%:*}" >> "$LOGS/sanitizer.out" 2>&1
    done
    kill "$cpu_log" "$gpu_log" "$child_log" "$stacks_log" 2>/dev/null
    grep -E "^== |passed|failed|Invalid|=========|^child processes:" "$LOGS/sanitizer.out" | tail -n 24
    cat "$LOGS/gpu_plugin_checks.tsv"
    [ -s "$FLA_COMPILE_LOG" ] && python3 benchmarks/compile_log.py "$FLA_COMPILE_LOG" && gzip "$FLA_COMPILE_LOG"
    echo "CPU busy % (vmstat, every 5 s):"; awk 'NR > 2 { printf "%d ", 100 - $15 } END { print "" }' "$LOGS/vmstat.log" | fold -w 200
    ;;
esac
left=$(leftovers)
[ -n "$left" ] && printf 'left running at the end (killed):\n%s\n' "$left" | tee -a "$LOGS/machine.txt"
pkill -KILL -f -- "$LEFTOVER"
tar czf "$OUT/$part.tgz" -C "$OUT/logs/$part" "$part"
