#!/usr/bin/env bash
# A quick run on the newest tested Triton, beside the full suite on the pinned toolchain
# (ci/test.sh): sets up its own environment (.venv-triton<version>), then runs the plugin's
# tests that reach Triton's own code, a conformance sample of every op under the
# interpreter, and the compile-only checks (the full suite on each Triton is
# ci/workflow.yml's matrix).
#
# The plugin's tests: those of its code that patches or calls into Triton, whose shape
# changes between versions: the interpreter's patches (targets/interpreter*.py,
# sanitizer/interpreter.py), the offline compiles (checks/capture.py), the emulated targets
# (targets/emulation.py), the mutation sites (mutation/sites.py reads Triton's code
# generator), the guard bands on interpreted kernels, the tested range and the fleet's
# version probe. Left to ci/test.sh's run on the pinned Triton: the sanitizer flows,
# isolation, stalls, the fleet's gateways, the CI jobs, the nested projects and the other
# pure-Python parts (no Triton code of theirs differs between versions), 560 of the
# plugin tests' 700 seconds on one core.
#
# The conformance sample: each op's first forward, backward and varlen test
# (--fla-quick's choice: its first case in fp32), every op of the registry: 87 tests, which
# launch the same 48 kernels as every forward, backward and varlen case of the 17 ops below
# did (618 tests), in a fifth of the time (on one core, Triton 3.9: 55 s against 258 s).
#
# Compile-only: one op per kernel module, so that every kernel file is compiled on the
# newest Triton:
#   chunk_gated_delta_rule            delta_rule/chunk_fwd.py, chunk_bwd.py, _chunk_common.py
#   fused_recurrent_gated_delta_rule  delta_rule/fused_recurrent.py
#   chunk_kda                         delta_rule/chunk_kda.py, chunk_kda_kernels.py
#   chunk_gla                         gla/chunk.py, _gate_levels.py
#   chunk_rwkv6, fused_recurrent_rwkv6  rwkv6/ops.py (the bonus branches of gla/chunk.py and
#                                     gated_recurrent/fused_recurrent.py)
#   chunk_simple_gla                  simple_gla/chunk.py
#   fused_recurrent_gla               gated_recurrent/fused_recurrent.py (per-channel gates)
#   chunk_dplr_delta_rule             dplr/chunk.py, chunk_fwd.py, chunk_bwd.py
#   fused_recurrent_dplr_delta_rule   dplr/fused_recurrent.py
#   chunk_hgrn, fused_recurrent_hgrn  hgrn/chunk.py, fused_recurrent.py, scan.py
#   parallel_attn                     attention/parallel.py
#   gated_delta_net                   layers/gated_deltanet.py
#   causal_conv1d                     conv.py
#   rms_norm_gated                    norm.py, _partials.py
#   apply_rotary                      rotary.py
# for sm80 (Ampere's mma, which sm86, sm89 and sm120 share), sm90 (Hopper's wgmma) and
# sm100 (Blackwell's tcgen05): the code generators that differ most between Triton
# versions, each kernel once in bf16 (--fla-compile-scope=kernels --fla-compile-dtypes=bf16).
# On two cores with a cold Triton cache, every distinct launch (head dims up to 256, bf16
# and fp32) took 575 s for these three archs without chunk_kda and chunk_dplr_delta_rule;
# with them, each kernel once per dtype took 385 s, once in bf16 130 s. The matrix
# (ci/workflow.yml) compiles every launch in both dtypes for every arch on every Triton.
#
# One run on two cores (a shared machine, Triton 3.9.0): setup 31 s, the plugin's tests 48 s
# (81 passed), the conformance sample 28 s (87), the compile-only checks 151 s (102); 258 s.
set -euo pipefail
cd "$(dirname "$0")/.."
TRITON=${FLA_NEWEST_TRITON:-3.9.0}
VENV=.venv-triton$TRITON
OPS=chunk_gated_delta_rule,fused_recurrent_gated_delta_rule,chunk_kda,chunk_gla,chunk_rwkv6,fused_recurrent_rwkv6,chunk_simple_gla,fused_recurrent_gla,chunk_dplr_delta_rule,fused_recurrent_dplr_delta_rule,chunk_hgrn,fused_recurrent_hgrn,parallel_attn,gated_delta_net,causal_conv1d,rms_norm_gated,apply_rotary

# torch hard-linked from the pinned environment where it exists (ci/share_torch.py: one run,
# setup 25 s against 53 s with its own pip install, the machine shared)
[ -x .venv/bin/python ] && export FLA_TORCH_FROM=${FLA_TORCH_FROM-$PWD/.venv/bin/python}
FLA_VENV=$VENV FLA_TRITON=$TRITON bash ci/setup.sh

run() {  # pytest, where exit 5 (no test selected) fails too: the subset must name real tests
  local rc=0 start=$SECONDS
  "$VENV/bin/python" -m pytest -q -p no:randomly "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "newest_triton.sh: no test selected by: $*" >&2
  fi
  echo "(exit $rc after $((SECONDS - start)) s)"
  return "$rc"
}

echo "== Triton $TRITON: the plugin's tests of its code that reaches into Triton"
TRITON_INTERPRET=1 run -n "${FLA_WORKERS:-2}" --dist worksteal tests/plugin/test_interpreter.py \
  tests/plugin/test_interpreter_bf16.py tests/plugin/test_interpreter_exp.py tests/plugin/test_interpreter_memcheck.py \
  tests/plugin/test_interpreter_versions.py tests/plugin/test_compile_only.py tests/plugin/test_targets.py \
  tests/plugin/test_mutation.py tests/plugin/test_bounds.py tests/plugin/test_toolchain.py \
  tests/plugin/test_fleet.py::test_version_disagreement_names_each_version_and_its_hosts \
  tests/plugin/test_fleet.py::test_the_host_probe_answers_on_this_machine \
  tests/plugin/test_fleet.py::test_hosts_on_other_versions_stop_the_run_before_any_test
echo "== Triton $TRITON: a conformance sample of every op under the interpreter"
TRITON_INTERPRET=1 run -n "${FLA_WORKERS:-2}" tests/test_conformance.py --fla-quick \
  -k "test_forward or test_backward or test_varlen"
echo "== Triton $TRITON: compile-only checks, each kernel once in bf16"
run -n "${FLA_WORKERS:-2}" tests/test_compile.py --fla-arch=sm80,sm90,sm100 --fla-compile-scope=kernels \
  --fla-compile-dtypes=bf16 --fla-ops="$OPS"
