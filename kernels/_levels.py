"""In-chunk pairs by levels: per-channel-gated score matrices with only exponents <= 0.

For a chunk of BT rows with per-channel log gates ``g`` (cumulative ``G_i = sum_{t<=i}
g_t``), a score ``sum_c x_ic y_jc e^{G_ic - G_jc}`` over pairs ``i > j`` is not a plain
product, and the factorisation ``(x e^{G}) (y e^{-G})^T`` overflows under strong decay.
At *level* ``l = 0 .. log2(BT) - 1`` the rows form aligned blocks of ``s = 2**l``; level
``l`` owns the pairs with ``i`` in the right and ``j`` in the left block of one aligned
``2 s`` block (:func:`level_pairs`), and a reference row ``e`` between them (the left
block's last row) splits ``e^{G_i - G_j} = e^{G_i - G_e} e^{G_e - G_j}`` into two factors
``<= 1``, so the level's pairs are one tensor-core product of gate-scaled operands. Every
pair ``i > j`` belongs to exactly one level.

The factors are in-block sums of ``g`` built level by level without subtraction
(:func:`next_level_sums`): ``L_i`` (``i``'s block up to ``i``) and ``R_j`` (``j``'s block
after ``j``); after the last level ``L = G`` and ``R = G_last - G``. A row that reads the
state *before* its own step (``G_{i-1}``) keeps an exclusive ``Lx`` that starts at 0 and
takes the same sibling totals (:func:`sibling_totals`).

``level`` may be a compile-time constant (``tl.static_range``: unrolled) or a loop
variable (``range``: the body compiles once, which keeps the compile time of kernels
with many products per level down).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def right_half(level, BT: tl.constexpr):
    """``[BT, 1]``: the rows in the second (right) block of ``2**level`` rows of their pair."""
    return (tl.arange(0, BT)[:, None] >> level) % 2 == 1


@triton.jit
def sibling_totals(L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    """``[BT, BD]``: for each row, the total of ``g`` over its sibling block at ``level``
    (``L`` at the sibling's last row)."""
    s = 1 << level
    rows = tl.arange(0, BT)[:, None]
    sibling_last = (rows // (2 * s)) * (2 * s) + (s - 1) + tl.where(right, 0, s)
    return tl.gather(L, tl.broadcast_to(sibling_last, (BT, BD)), axis=0)


@triton.jit
def next_level_sums(L, R, right, level, BT: tl.constexpr, BD: tl.constexpr):
    """In-block gate sums at ``level + 1`` from those at ``level``.

    At level ``l`` the rows fall in aligned blocks of ``2**l``; ``L_i`` is the sum of
    ``g`` over i's block up to and including ``i``, ``R_j`` the sum over j's block after
    ``j``. Merging each block with its sibling adds the sibling's total (``L`` at the
    sibling's last row) to ``L`` of a right block and to ``R`` of a left block. Every
    value stays a sum of same-sign terms: no cancellation, however large the decay.
    """
    total = sibling_totals(L, right, level, BT, BD)
    return L + tl.where(right, total, 0.0), R + tl.where(right, 0.0, total)


@triton.jit
def level_pairs(level, BT: tl.constexpr):
    """``[BT, BT]`` mask of the pairs (i, j) that ``level`` owns: i in the second half,
    j in the first half of the same block of ``2 * 2**level`` rows."""
    s = 1 << level
    bi = tl.arange(0, BT)[:, None] // s
    bj = tl.arange(0, BT)[None, :] // s
    return (bi - bj == 1) & (bj % 2 == 0)
