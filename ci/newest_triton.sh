#!/usr/bin/env bash
# A quick run on the newest tested Triton, beside the full suite on the pinned toolchain
# (ci/test.sh): sets up its own environment (.venv-triton<version>), then runs the kernel
# checks under the interpreter and the compile-only checks for a representative subset.
#
# The subset is one op per kernel module, so that every kernel file is run and compiled
# on the newest Triton (the full suite on each Triton is ci/workflow.yml's matrix):
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
# Numeric checks: forward, backward and varlen (the ones that run every kernel; the
# input-validation checks run no kernel). Compile-only: sm80 (Ampere's mma, which sm86,
# sm89 and sm120 share), sm90 (Hopper's wgmma) and sm100 (Blackwell's tcgen05): the code
# generators that differ most between Triton versions, each kernel once in bf16
# (--fla-compile-scope=kernels --fla-compile-dtypes=bf16). On two cores with a cold Triton
# cache, every distinct launch (head dims up to 256, bf16 and fp32) took 575 s for these three
# archs without chunk_kda and chunk_dplr_delta_rule; with them, each kernel once per dtype took
# 385 s, once in bf16 130 s. The matrix (ci/workflow.yml) compiles every launch in both
# dtypes for every arch on every Triton.
set -euo pipefail
cd "$(dirname "$0")/.."
TRITON=${FLA_NEWEST_TRITON:-3.9.0}
VENV=.venv-triton$TRITON
OPS=chunk_gated_delta_rule,fused_recurrent_gated_delta_rule,chunk_kda,chunk_gla,chunk_rwkv6,fused_recurrent_rwkv6,chunk_simple_gla,fused_recurrent_gla,chunk_dplr_delta_rule,fused_recurrent_dplr_delta_rule,chunk_hgrn,fused_recurrent_hgrn,parallel_attn,gated_delta_net,causal_conv1d,rms_norm_gated,apply_rotary

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

echo "== Triton $TRITON: kernel checks under the interpreter"
TRITON_INTERPRET=1 run -n "${FLA_WORKERS:-2}" tests/test_conformance.py --fla-ops="$OPS" \
  -k "test_forward or test_backward or test_varlen"
echo "== Triton $TRITON: compile-only checks, each kernel once in bf16"
run -n "${FLA_WORKERS:-2}" tests/test_compile.py --fla-arch=sm80,sm90,sm100 --fla-compile-scope=kernels \
  --fla-compile-dtypes=bf16 --fla-ops="$OPS"
