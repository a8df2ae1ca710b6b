# source: user report: packed batch whose cu_seqlens stopped short of T gave garbage in the last tokens
# seen-on: sm90
# expect: raises ValueError: `cu_seqlens` must end at T = 24
# op: chunk_simple_gla
# needs: device
"""The offsets covered 20 of 24 packed tokens; the tail was silently left unwritten."""

import torch

from kernels import chunk_simple_gla
from pytest_fla.repro_helpers import session_device

device = session_device()
T, H, K = 24, 2, 16
q, k, v = (torch.randn(1, T, H, K, device=device) for _ in range(3))
cu_seqlens = torch.tensor([0, 10, 20], dtype=torch.int64, device=device)
chunk_simple_gla(q, k, v, cu_seqlens=cu_seqlens)
