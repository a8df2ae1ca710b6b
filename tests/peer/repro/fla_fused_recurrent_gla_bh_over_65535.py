# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_huge_grid[fused_recurrent_gla], "invalid argument" on 0.5.2
# seen-on: sm90
# expect: pass
# op: fused_recurrent_gla
# needs: gpu
# requires: fla-core
# found-in: 0.3.2 to 0.5.2 (this file on an H200, each release)
# fixed-in: 0.6.0
"""fla-core's fused_recurrent_gla with B * H = 4100 * 16 = 65600 programs' worth of batch
and heads: CUDA caps grid axes 1 and 2 at 65535, so a kernel that puts B * H there fails to
launch ("invalid argument"). The last batch row is checked against a batch of one."""

import torch
import torch.nn.functional as F
from fla.ops.gla import fused_recurrent_gla

torch.manual_seed(0)
B, T, H, K = 4100, 4, 16, 16
q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
gk = F.logsigmoid(torch.randn(B, T, H, K, device="cuda"))
o, _ = fused_recurrent_gla(q, k, v, gk=gk)
torch.cuda.synchronize()
o_last, _ = fused_recurrent_gla(q[-1:], k[-1:], v[-1:], gk=gk[-1:])
assert torch.allclose(o[-1:].float(), o_last.float(), atol=1e-2), "the last batch row differs from a batch of one"
