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
def short_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # The planted bug: the mask stops one short (offs < n - 1), so the last element is never written.
    mask = offs < n - 1
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def unwritten_last(x: torch.Tensor) -> torch.Tensor:
    """Copies every element of ``x`` but the last: its output's last element is never
    written, and no access leaves a tensor."""
    y = torch.empty_like(x)
    short_copy_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


@triton.jit
def discarded_read_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    cur = tl.load(x_ptr + offs, mask=mask)
    # The planted bug: the neighbour's load takes the row mask, not its own (offs + 1 < n),
    # so the last lane reads one past the end; the where drops that value from the result.
    nxt = tl.load(x_ptr + offs + 1, mask=mask)
    tl.store(y_ptr + offs, cur + tl.where(offs + 1 < n, nxt * 0.0, 0.0), mask=mask)


def discarded_read(x: torch.Tensor) -> torch.Tensor:
    """Reads one element past the end of ``x`` into a value no output keeps: right results,
    no guard band or NaN shows it; memcheck (and the interpreter's check) does."""
    y = torch.empty_like(x)
    discarded_read_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


@triton.jit
def overlapping_stores_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    head = offs < n - 1
    # The planted bug: the head's store takes one lane too many (offs <= n - 1), writing the
    # last element, which the tail's store then writes again with its right value.
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=head) * 0.0, mask=offs <= n - 1)
    last = n - 1 + tl.arange(0, 1)
    tl.store(y_ptr + last, tl.load(x_ptr + last), mask=tl.program_id(0) == (n - 1) // BLOCK)


def overlapping_stores(x: torch.Tensor) -> torch.Tensor:
    """y = 0 * x, but for the last element, which two stores of one program write with no
    barrier between: the interpreter keeps their order (the right value lands); a GPU need not."""
    y = torch.empty_like(x)
    overlapping_stores_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


@triton.jit
def _store_row(y_ptr, values):
    tl.store(y_ptr + tl.arange(0, 8), values)


@triton.jit
def helper_stores_twice_kernel(y_ptr):
    _store_row(y_ptr, tl.zeros([8], tl.float32))
    # The planted bug: the same helper's store, called again for the same row, no barrier between
    _store_row(y_ptr, tl.full([8], 1.0, tl.float32))


def helper_stores_twice(y: torch.Tensor) -> torch.Tensor:
    """Two calls of one helper store one row: two stores, though one line of source."""
    helper_stores_twice_kernel[(1,)](y)
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


@triton.jit
def shifted_store_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # The planted bug: element i is stored to y[i + 1], so the last lane writes one past the end.
    tl.store(y_ptr + offs + 1, tl.load(x_ptr + offs, mask=mask), mask=mask)


def off_by_one_store(x: torch.Tensor) -> torch.Tensor:
    """Writes one element past the end of its output: memcheck's out-of-bounds store."""
    y = torch.empty_like(x)
    shifted_store_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y


def uninitialised_read(n: int, device) -> torch.Tensor:
    """Copies memory nothing wrote (``torch.empty``): initcheck's read of uninitialised device
    memory. Seen only with the caching allocator off: a cached block may have been written before."""
    return copy(torch.empty(n, device=device))


# Triton hands out shared memory itself and puts a barrier wherever its own layouts need
# one, so a race has to be written past it: inline PTX with a block-scoped .shared array.
# Each thread stores its value to its own word, then loads the word of the thread 32 places
# on (a thread of another warp) with no barrier between: a read-after-write hazard between
# warps, which racecheck reports. The result is whatever that thread had stored by then.
RACY_SHARED_ASM = tl.constexpr("""
{
.shared .align 4 .b32 racy_words[128];
.reg .u32 t, a, b, base;
mov.u32 t, %tid.x;
mov.u32 base, racy_words;
shl.b32 a, t, 2;
add.u32 a, a, base;
st.shared.u32 [a], $1;
add.u32 b, t, 32;
and.b32 b, b, 127;
shl.b32 b, b, 2;
add.u32 b, b, base;
ld.shared.u32 $0, [b];
}
""")


@triton.jit
def racy_shared_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(RACY_SHARED_ASM, "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(y_ptr + offs, y)


def shared_memory_race(x: torch.Tensor) -> torch.Tensor:
    """128 int32 values through a shared array that 4 warps write and read with no barrier."""
    assert x.dtype == torch.int32 and x.numel() == 128
    y = torch.empty_like(x)
    racy_shared_kernel[(1,)](x, y, BLOCK=128, num_warps=4)
    return y


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # a reduction across warps: Triton stages the partial sums through shared memory with
    # barriers of its own (what every op's kernels do), the clean case beside the race
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))


def row_sums(x: torch.Tensor) -> torch.Tensor:
    rows, n = x.shape
    y = torch.empty(rows, device=x.device, dtype=x.dtype)
    row_sum_kernel[(rows,)](x, y, n, BLOCK=triton.next_power_of_2(n), num_warps=4)
    return y


# Every thread stores the same value to one shared word and loads it back, no barrier:
# hazards between warps whose values cannot differ (how racecheck grades those: the
# transcripts show it).
SAME_VALUE_SHARED_ASM = tl.constexpr("""
{
.shared .align 4 .b32 same_word[1];
.reg .u32 base;
mov.u32 base, same_word;
st.shared.u32 [base], 7;
ld.shared.u32 $0, [base];
}
""")


@triton.jit
def same_value_shared_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(SAME_VALUE_SHARED_ASM, "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(y_ptr + offs, y + x * 0)


def same_value_shared_race(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype == torch.int32 and x.numel() == 128
    y = torch.empty_like(x)
    same_value_shared_kernel[(1,)](x, y, BLOCK=128, num_warps=4)
    return y


# A block-wide barrier that only the even lanes of each warp reach: synccheck's divergent
# barrier (undefined behaviour since Volta, where a warp's lanes are scheduled apart).
DIVERGENT_BARRIER_ASM = tl.constexpr("""
{
.reg .pred odd;
.reg .u32 t;
mov.u32 t, %tid.x;
and.b32 t, t, 1;
setp.ne.u32 odd, t, 0;
@!odd bar.sync 1;
mov.b32 $0, $1;
}
""")


@triton.jit
def divergent_barrier_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise(DIVERGENT_BARRIER_ASM, "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(y_ptr + offs, y)


def divergent_barrier(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype == torch.int32 and x.numel() == 32
    y = torch.empty_like(x)
    divergent_barrier_kernel[(1,)](x, y, BLOCK=32, num_warps=1)
    return y
