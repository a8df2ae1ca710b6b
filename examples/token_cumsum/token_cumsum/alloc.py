"""Buffers the op's kernels write. The test suite sets ``POISON_ALLOCATIONS`` (the
``fla_poison`` ini option) so that an element a kernel never wrote stays NaN."""

import torch

POISON_ALLOCATIONS = False


def empty(shape, dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if POISON_ALLOCATIONS and t.device.type != "meta":
        t.fill_(float("nan"))
    return t
