# source: user report: varlen flash attention with cu_seqlens running past the packed tokens hit "device-side assert triggered"
# seen-on: sm90
# expect: raises ValueError: `cu_seqlens` must end at T = 48
# op: parallel_attn
# needs: device
"""Offsets built for a batch of 64 tokens were passed with a packed tensor of 48: the last
sequence's keys lay past the end of k and v. It must be a clear error before any launch."""

import torch

from kernels import parallel_attn
from pytest_fla.repro_helpers import session_device

device = session_device()
T, H, HKV, D = 48, 4, 2, 64
q = torch.randn(1, T, H, D, device=device, dtype=torch.float32)
k, v = (torch.randn(1, T, HKV, D, device=device, dtype=torch.float32) for _ in range(2))
cu_seqlens = torch.tensor([0, 16, 40, 64], dtype=torch.int32, device=device)
parallel_attn(q, k, v, causal=True, cu_seqlens=cu_seqlens)
