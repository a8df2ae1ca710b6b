# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_huge_grid[causal_conv1d] and test_no_host_sync[causal_conv1d] on 0.3.2 to 0.4.1 (H200): "CompilationError ... initial value for `b_x` is of type bf16 ..., but the then block redefines it as fp32"
# seen-on: sm90
# expect: pass
# op: causal_conv1d
# needs: compiler
# requires: fla-core
# found-in: 0.3.2 to 0.4.1 (this file compiled offline for sm90 on the CPU, each release, 2026-12-04)
# fixed-in: 0.4.2
"""fla-core's causal_conv1d with bf16 inputs, an fp32 initial state (a cache kept in fp32)
and the final state asked for: the kernel that writes the final state does not compile.
Under ``if USE_INITIAL_STATE: if T < BW:`` (T a runtime value) it adds the fp32 cache to
the bf16 window, so the window changes type in one branch of a runtime ``if``, which
Triton refuses. The call is valid; the kernel is compiled here offline for the session's
arch (``--fla-arch``), with the argument types that call passes, as its launch would."""

import importlib

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pytest_fla.repro_helpers import target_arch

for module in ("fla.modules.convolution", "fla.modules.conv.triton.kernels", "fla.modules.causal_conv1d.ops"):
    try:
        kernel = importlib.import_module(module).causal_conv1d_states_fwd_kernel
        break
    except (ImportError, AttributeError):
        continue
fn = kernel.fn  # under its @triton.heuristics
# x [B, T, D] bf16, initial_state [N, D, W] fp32, final_state like x, no cu_seqlens; W = 4, D = 64
pointers = {"x": "*bf16", "initial_state": "*fp32", "final_state": "*bf16", "cu_seqlens": "*i32"}
constants = {"BD": 64, "BW": 4, "USE_INITIAL_STATE": True, "IS_VARLEN": False}
signature = {name: pointers.get(name, "constexpr" if name in constants else "i32") for name in fn.arg_names}
triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", target_arch(), 32))
