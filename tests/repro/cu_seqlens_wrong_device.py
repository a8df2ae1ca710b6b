# source: user report: cu_seqlens left on the CPU while q was on the GPU gave an illegal memory access
# seen-on: sm90
# expect: raises ValueError: `cu_seqlens` is on \S+ but
# op: chunk_simple_gla
# needs: device
"""Offsets on the host were read as device pointers; it must be a clear error instead."""

import torch

from kernels import chunk_simple_gla
from pytest_fla.repro_helpers import other_device, session_device

device = session_device()
T, H, K = 24, 2, 16
q, k, v = (torch.randn(1, T, H, K, device=device) for _ in range(3))
cu_seqlens = torch.tensor([0, 10, T], dtype=torch.int32, device=other_device(device))
chunk_simple_gla(q, k, v, cu_seqlens=cu_seqlens)
