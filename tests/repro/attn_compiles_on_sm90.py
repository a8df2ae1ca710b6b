# source: user report: a flash-attention kernel compiled on A100 but failed to compile on H100 only (sm90), with a type error in the kernel
# seen-on: sm90
# expect: pass
# expect-sm75: raises NotImplementedError: needs sm80 or newer
# op: parallel_attn
# needs: compiler
"""Hopper takes its own code path in the compiler (wgmma dot operands, other layouts), so a
kernel that compiles for sm80 says nothing about sm90. parallel_attn's forward and
backward launches (head dims 64, 128 and 256, causal, sliding window, grouped heads, bf16
and fp32) are compiled offline for the session's arch, sm90 included, and checked against
its shared-memory limit."""

import torch

from kernels import parallel_attn
from pytest_fla.checks.capture import assert_compiles, capture_launches
from pytest_fla.repro_helpers import target_arch

arch = target_arch()
with capture_launches(arch) as recorder:
    for dtype in (torch.bfloat16, torch.float32):
        for D, window in ((64, 100), (128, None), (256, None)):
            q = torch.randn(1, 256, 4, D, dtype=dtype, requires_grad=True)
            k, v = (torch.randn(1, 256, 2, D, dtype=dtype, requires_grad=True) for _ in range(2))
            o = parallel_attn(q, k, v, window_size=window)
            o.backward(torch.randn_like(o))
print(assert_compiles(recorder.launches, arch).summary())
