# source: user report: offsets built from unsorted lengths made a kernel read a negative-length sequence
# seen-on: sm90
# expect: raises ValueError: `cu_seqlens` must be non-decreasing
# op: chunk_simple_gla
# needs: device
"""cu_seqlens = [0, 15, 9, 24]: the second sequence has length -6."""

import torch

from kernels import chunk_simple_gla
from pytest_fla.repro_helpers import session_device

device = session_device()
T, H, K = 24, 2, 16
q, k, v = (torch.randn(1, T, H, K, device=device) for _ in range(3))
cu_seqlens = torch.tensor([0, 15, 9, T], dtype=torch.int32, device=device)
chunk_simple_gla(q, k, v, cu_seqlens=cu_seqlens)
