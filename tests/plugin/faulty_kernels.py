"""Deliberately broken Triton kernels that prove the plugin catches each kind of fault.

Test code only: these must never move into ``kernels/``. Each launcher launches through
``kernel[grid](...)`` only, so launch capture (compile-only mode) sees it like any op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def copy(x: torch.Tensor) -> torch.Tensor:
    """A correct kernel: the control beside each fault."""
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


@triton.jit
def shifted_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # The planted bug: element i reads x[i + 1], so the last lane reads one past the end.
    tl.store(y_ptr + offs, tl.load(x_ptr + offs + 1, mask=mask), mask=mask)


def off_by_one_read(x: torch.Tensor) -> torch.Tensor:
    """Reads one element past the end of ``x``: silent unless memcheck sees the allocation's edge."""
    y = torch.empty_like(x)
    shifted_copy_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


@triton.jit
def wild_store_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # The planted bug: an offset of 2**40 elements lands far outside any allocation.
    tl.store(y_ptr + offs.to(tl.int64) + (1 << 40), tl.zeros([BLOCK], tl.float32), mask=offs < n)


def illegal_address(y: torch.Tensor) -> torch.Tensor:
    """Stores far outside ``y``: an illegal memory access that poisons the CUDA context."""
    wild_store_kernel[(triton.cdiv(y.numel(), 128),)](y, y.numel(), BLOCK=128)
    return y


@triton.jit
def tiled_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K))
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N))
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


# Tiles that need about 128 KiB of shared memory when pipelined over 5 stages: more
# than sm86 / sm89 / sm120 have (101376 bytes), well within sm80 and sm90.
HUNGRY_CONFIG = dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=5)


def shared_hungry_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A matmul whose one config overflows the shared memory of the 100 KiB archs."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    cfg = HUNGRY_CONFIG
    grid = (triton.cdiv(M, cfg["BM"]), triton.cdiv(N, cfg["BN"]))
    tiled_matmul_kernel[grid](a, b, c, M, N, K, **cfg)
    return c


# Stages per target arch, as a kernel author tunes them. The planted bug: sm86's entry
# was copied from sm80's, and sm86 has 100 KiB of shared memory, not sm80's 163 KiB.
STAGES_BY_ARCH = {75: 2, 80: 5, 86: 5, 89: 3, 90: 5, 100: 5, 120: 3}


def arch_tuned_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A matmul whose config comes from the target arch: it fits every arch but sm86."""
    from kernels._arch import target_arch

    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, 128), triton.cdiv(N, 128))
    tiled_matmul_kernel[grid](a, b, c, M, N, K, BM=128, BN=128, BK=64, num_warps=8, num_stages=STAGES_BY_ARCH[target_arch()])
    return c
