"""GPU memory accounting for the checks that need a large part of a GPU's memory."""

from __future__ import annotations


def forward_bytes(call, sample, device) -> int:
    """GPU memory a no-grad ``call(sample)`` takes: its inputs plus the call's peak."""
    import torch

    inputs = sum(t.numel() * t.element_size() for t in sample.tensors().values())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        call(sample)
    torch.cuda.synchronize(device)
    return inputs + torch.cuda.max_memory_allocated(device) - before
