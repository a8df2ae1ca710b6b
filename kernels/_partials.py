"""Deterministic reductions of per-program partial sums (parameter gradients).

A backward that needs a sum over every row (the gradient of a weight shared by all
rows) launches a fixed number of programs ``P``; program ``p`` adds up its own rows in
registers and writes one row of a float32 ``[P, C]`` buffer. ``column_sum`` then adds
the ``P`` rows in a fixed order. No atomics: the result is the same bit for bit on every
run on the same device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _utils
from ._arch import COMPILE_OPTIONS

# Used when the kernels are captured or interpreted without a CUDA device: the
# multiprocessor count of an H100 / H200.
DEFAULT_MULTIPROCESSORS = 132


def multiprocessor_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_MULTIPROCESSORS


def partial_programs(device: torch.device, work_items: int, num_warps: int) -> int:
    """How many programs ``P`` share ``work_items`` blocks of rows: enough for every
    multiprocessor to hold about 32 resident warps, and few enough that the ``[P, C]``
    partial buffer stays small next to the data (at most one row per 16 blocks beyond that)."""
    per_sm = max(1, 32 // num_warps)
    wanted = per_sm * multiprocessor_count(device)
    # at most 16 items a program: the last wave of programs is then a small share of the
    # time even when fewer programs than planned fit on a multiprocessor at once
    wanted = max(wanted, _utils.cdiv(work_items, 16))
    return max(1, min(work_items, wanted))


@triton.jit
def _column_sum_kernel(partials, out, P, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = pid * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows[:, None] < P) & col_mask[None, :]
        acc += tl.load(partials + rows[:, None].to(tl.int64) * C + cols[None, :], mask=mask, other=0.0)
    tl.store(out + cols, tl.sum(acc, axis=0).to(out.dtype.element_ty), mask=col_mask)


def column_sum(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``partials.sum(0)`` for a float32 ``[P, C]`` buffer, as ``dtype``, in a fixed order."""
    P, C = partials.shape
    out = _utils.empty((C,), dtype, partials.device)
    # narrow column blocks, tall row blocks: each program's loop over P is a chain of
    # dependent loads, so it must be short; with [16, 128] blocks the [1024, 128] partials
    # of rms_norm's dweight took 0.22 ms on the H100 (64 steps in one program), as long
    # as the norm's whole backward pass over 64 MiB; with [256, 32] blocks, 10 us on 4
    # programs. Columns of 8 (a 32-byte sector of fp32 per row) give [1024, 8]: one step,
    # and 16 programs for those partials. A short P (a few slabs of a whole tensor) takes
    # wide column blocks instead: the same 8192 values a program.
    BLOCK_P = min(1024, triton.next_power_of_2(max(P, 1)))
    BLOCK_C = 8192 // BLOCK_P
    _column_sum_kernel[(_utils.cdiv(C, BLOCK_C),)](
        partials, out, P, C, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=4, **COMPILE_OPTIONS
    )
    return out
