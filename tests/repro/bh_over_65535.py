# source: user report against flash-linear-attention: GatedDeltaNet at batch 10923 fails with "invalid argument" (docs/ops.md, Layers)
# seen-on: sm90
# expect: pass
# op: chunk_simple_gla
# needs: gpu
"""B * H = 10923 * 6 = 65538 put the batch-head product on grid axis 1, which CUDA caps
at 65535: the launch failed with "invalid argument" instead of running."""

import torch

from kernels import chunk_simple_gla
from pytest_fla.repro_helpers import session_device

device = session_device()
B, T, H, K = 10923, 32, 6, 16
q, k, v = (torch.randn(B, T, H, K, device=device, dtype=torch.bfloat16) for _ in range(3))
g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=device))
o, _ = chunk_simple_gla(q, k, v, g=g)
torch.cuda.synchronize()
# Spot-check the last batch row, whose program ids lie past 65535, against a batch of one.
o_last, _ = chunk_simple_gla(q[-1:], k[-1:], v[-1:], g=g[-1:])
assert torch.allclose(o[-1:].float(), o_last.float(), atol=1e-2), "the last rows differ from a batch of one"
