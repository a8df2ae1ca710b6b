# source: the conformance suite over fla-core's releases on the CPU (benchmarks/peer_history.py): test_forward[fused_recurrent_kda-fp32-strong_decay_l2norm], K = 24: "read of 8 element(s) of 4 bytes outside every tensor argument; the lowest, 0 bytes past the end of `g`"
# seen-on: interpreter
# expect: pass
# op: fused_recurrent_kda
# needs: device
# requires: fla-core>=0.4.0
# found-in: 0.4.2 to 0.5.2 (under the CPU interpreter's bounds check; on an H200 under --fla-sanitizer=memcheck, 0.5.2: 8 invalid 4-byte reads past a 96-byte allocation; 0.4.0 and 0.4.1 not measured)
# fixed-in: 0.6.0 (the interpreter, and memcheck on an H200)
"""fla-core's fused_recurrent_kda forward reads `g` past its end when K is not a power of
two: the key block is K rounded up, and the gate's load of the last token's last head takes
the block's padding from past the tensor. The output is right (the padding meets zeros), so
only a bounds check sees it: the interpreter's on the CPU (every run of this suite), or
compute-sanitizer's memcheck on a GPU (`--fla-sanitizer=memcheck`). Smallest case: one
token, one head, K = 24."""

import contextlib

import torch
from fla.ops.kda import fused_recurrent_kda

from pytest_fla.repro_helpers import session_device

if not hasattr(torch.cpu, "device"):  # the CPU has none; fla-core <= 0.5.0 enters one around each call
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
device = session_device()
torch.manual_seed(0)
B, T, H, K, V = 1, 1, 1, 24, 8
q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
g = -torch.rand(B, T, H, K)  # log decay per key channel
beta = torch.rand(B, T, H)
q, k, v, g, beta = (t.to(device) for t in (q, k, v, g, beta))
o, _ = fused_recurrent_kda(q, k, v, g, beta, scale=K ** -0.5)
if torch.device(device).type == "cuda":
    torch.cuda.synchronize()
