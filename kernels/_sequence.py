"""In-kernel lookup of the sequence that owns each token.

Token kernels tile ``[B, T]`` as ``B * cdiv(T, BLOCK)`` tiles that never straddle two
batch rows, so a tile's rows sit at a fixed stride from one base pointer. Without
``cu_seqlens`` batch row ``b`` is sequence ``b``; with it (``B == 1``) a tile may straddle
sequences, and each token finds its own by bisection over the offsets here. No host
table is needed: the launch grid depends on ``B`` and ``T`` alone and the offsets are
never read on the host to launch.
"""

from __future__ import annotations

import triton
import triton.language as tl


def search_steps(num_sequences: int) -> int:
    """Bisection steps that narrow ``[0, N]`` to one sequence: ``ceil(log2(N))``."""
    return max(1, (num_sequences - 1).bit_length())


@triton.jit
def tile_origin(tile, T, BLOCK_T: tl.constexpr):
    """``(b, t0)``: batch row and first token of token tile ``tile`` (``cdiv(T, BLOCK_T)`` a row)."""
    tiles_per_row = tl.cdiv(T, BLOCK_T)
    return tile // tiles_per_row, (tile % tiles_per_row) * BLOCK_T


@triton.jit
def sequence_span(t, b, cu_seqlens, T, N, steps, VARLEN: tl.constexpr, BLOCK: tl.constexpr):
    """``(n, start, end)`` as int64 ``[BLOCK]`` vectors for tokens ``t`` of batch row ``b``.

    Without ``VARLEN`` the row is the sequence: ``(b, 0, T)``. With it, bisection keeps
    ``cu[lo] <= t < cu[hi]`` and stops at the largest ``n`` with ``cu[n] <= t``, which
    skips empty sequences. Tokens past ``T`` (masked by the caller) still index
    ``cu_seqlens`` inside ``[0, N]``.
    """
    if VARLEN:
        lo = tl.zeros([BLOCK], dtype=tl.int32)
        hi = lo + N
        for _ in range(steps):
            mid = (lo + hi) // 2
            right = tl.load(cu_seqlens + mid).to(tl.int64) <= t
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        start = tl.load(cu_seqlens + lo).to(tl.int64)
        end = tl.load(cu_seqlens + lo + 1).to(tl.int64)
        return lo.to(tl.int64), start, end
    else:
        zero = tl.zeros([BLOCK], dtype=tl.int64)
        return zero + b, zero, zero + T
