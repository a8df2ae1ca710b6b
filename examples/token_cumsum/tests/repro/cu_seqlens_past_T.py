# source: example report: token_cumsum with cu_seqlens ending past T returned garbage
# seen-on: sm90
# expect: raises ValueError: `cu_seqlens` must end at T = 8
# op: token_cumsum
# needs: device
"""cu_seqlens_past_T: offsets ending at 12 for 8 packed tokens read past the end of x and
gave non-finite sums for the last sequence; now a ValueError before any launch."""

import torch

from pytest_fla.repro_helpers import session_device
from token_cumsum import token_cumsum

device = session_device()
x = torch.randn(1, 8, 64, device=device)
y, _ = token_cumsum(x, cu_seqlens=torch.tensor([0, 3, 12], device=device))
print(y[0, -1])
