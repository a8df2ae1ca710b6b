# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_error_inputs[parallel_attn-q_3d], an illegal memory access on 0.6.0 (H200, the suite's shapes); at T = 8 on the CPU interpreter's bounds check: "read of 96 element(s) of 4 bytes outside every tensor argument; the lowest, 0 bytes past the end of `q`"
# seen-on: interpreter
# expect: pass
# op: parallel_attn
# needs: device
# requires: fla-core
# found-in: 0.3.2 to 0.6.0 (each release under the CPU interpreter's bounds check, Triton 3.6)
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's parallel_attn takes a 3-D `q` ([T, HQ, K], the batch dim left out) beside
4-D `k` and `v` without a word, and its kernel then reads past q's end (it takes q's
missing batch stride from k's layout). A call that refuses q (any Python error before a
launch) passes. On an H200 at this size the read lands inside the caching allocator's
block and nothing faults, and ``--fla-sanitizer=memcheck`` (the caching allocator off)
reports nothing either (0.3.2 and 0.6.0, 2026-12-04, q allocated after k and v: the reads stay inside memory the
process holds); the interpreter's bounds check, which knows each tensor's extent (every
run of this suite on the CPU), sees it."""

import contextlib

import torch
from fla.ops.attn import parallel_attn

from pytest_fla.repro_helpers import session_device

if not hasattr(torch.cpu, "device"):  # the CPU has none; fla-core <= 0.5.0 enters one around each call
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
device = session_device()
torch.manual_seed(0)
T, HQ, HKV, K = 8, 4, 2, 16
k, v = (torch.randn(1, T, HKV, K, device=device) for _ in range(2))
q = torch.randn(T, HQ, K, device=device)
try:
    parallel_attn(q, k, v)
except (ValueError, TypeError, AssertionError) as refused:
    print(f"refused: {type(refused).__name__}: {refused}")
