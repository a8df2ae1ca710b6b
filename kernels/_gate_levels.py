"""The gate-level recursion: intra-chunk products under per-channel decay, never
forming ``e^{-G}``.

For a chunk of ``BT = 2**LEVELS`` rows with per-channel log gates ``g`` (``G`` their
in-chunk cumulative sum), a pair ``j < i`` needs ``e^{G_i - G_j}`` per channel, and the
factorisation ``(x ⊙ e^{G}) (y ⊙ e^{-G})^T`` overflows under strong decay. Level
``l = 0 .. LEVELS-1`` owns the pairs with ``i`` in the right and ``j`` in the left block
of an aligned block of ``2 * 2**l`` rows (:func:`level_pairs`); its reference row ``e``,
the left block's last, splits the factor into two that are each ``<= 1``::

    e^{G_i - G_j} = e^{G_i - G_e} e^{G_e - G_j} = e^{L_i} e^{R_j}

with ``L_i`` the sum of ``g`` over i's block up to ``i`` and ``R_j`` the sum over j's block
after ``j``. So each level is one tensor-core product of ``x ⊙ e^{L}`` on right rows and
``y ⊙ e^{R}`` on left rows, masked to the level's pairs. :func:`next_level_sums` builds
the sums of the next level by adding the sibling block's total, never subtracting; after
the last level ``L = G`` and ``R = G_last - G``; :func:`next_level_sums_exclusive` keeps
``X = L - g`` instead of ``L`` (a query reading the state before its own token, rwkv6),
ending at ``X = G - g``. Used by ``kernels/gla/chunk.py`` (whose
docstring derives it), ``kernels/delta_rule/chunk_kda.py`` and ``kernels/dplr/``.

The sibling totals move rows across the tile. :func:`sibling_total` does it with
``tl.gather``; :func:`sibling_total_through` with a store to and a load by row index from
the program's own scratch tile in global memory, which leaves the operands in their load
layout (chunk_gla's forward intra kernel takes it: with the one-product branch below, 0.58
against 0.78 ms by gather on the H100; in chunk_kda's intra kernel, beside that branch,
Triton 3.6 compiled it wrong on sm90, so that kernel gathers:
``kernels/README.md``). Two ``tl.associative_scan`` per level, the
other gather-free form tried, was 3.6x slower (``benchmarks/level_variants.py``).

Where the in-chunk cumulative gates are small, none of this is needed: with every
``|G| <= SPREAD`` the textbook factorisation ``(x ⊙ e^{G}) (y ⊙ e^{-G})^T`` neither
overflows nor loses range, and one tensor-core product covers every pair of the chunk.
The kernels check this per program and key block (:func:`one_product_gates`) and take the
levels only where it fails (strong decay, ``-inf`` gates); chunk_kda's forward intra kernel
decides per program, over all its key blocks, in two launches (one per form, each compiled
without the other's registers: ``kernels/delta_rule/chunk_kda_kernels.py``). What the one product costs in
accuracy: ``e^{G_i} e^{-G_j}`` carries the rounding of ``G`` at its own size, about
``|G| u32`` relative (the levels carry it at the size of ``G_i - G_j``), so :data:`SPREAD_BY_WORK`
is 40 for 16-bit work (``6e-8 * 40`` is nothing next to bf16's ``4e-3``; ``e^{40} |y|``
stays far inside bf16's range) and 16 for fp32 work (``1e-6``, the size of a tf32x3
product's own error).

``level`` may be a compile-time constant (``tl.static_range``: the levels unrolled) or a
loop variable (``range``: the body compiles once, which keeps the compile time of a kernel
with many products per level down).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LEVELS = 6  # log2(BT): the levels of the in-chunk pair decomposition of a 64-row chunk

# The largest in-chunk |G| at which one product replaces the levels, by work dtype (the
# module docstring argues the values); any other work dtype always takes the levels.
SPREAD_BY_WORK = {torch.bfloat16: 40.0, torch.float32: 16.0}


# The input precision of the products of gate-scaled operands (:func:`gated_operand`), by the
# dtype of the kernel's other products: bf16 work takes one-pass tf32 there. A bf16 product
# of two such operands carries both operands' roundings (up to half a bf16 ulp each) into the
# scores the output and every gradient are built from: measured on chunk_rwkv6 (bf16, B=2 T=300
# H=2 K=V=64, realistic gates; docs/tolerances.md), the forward's score product alone took `o` from 2.4e-3 to
# 3.2e-3 relative RMS, the backward's two from 1.8e-3 to 2.6e-3 (`dr`) and 1.1e-3 to 2.6e-3
# (`dw`). tf32 keeps 3 more bits, at half the bf16 rate. chunk_gla and chunk_rwkv6 take it in
# the forward's score product only (kernels/gla/chunk.py, "Precision": the backward's cost more
# time than their accuracy was worth).
GATED_PREC_BY_DOT = {"bf16": "tf32"}


def gated_prec(dot, prec: str) -> str:
    """The ``GATED_PREC`` of a gate-level kernel whose other products take operands of
    ``dot`` (a Triton dtype) at ``prec``."""
    return GATED_PREC_BY_DOT.get(str(dot), prec)


def one_product_spread(work: torch.dtype) -> float:
    """The ``SPREAD`` constexpr of a gate-level kernel for the work dtype ``work``
    (negative: never one product)."""
    return SPREAD_BY_WORK.get(work, -1.0)


@triton.jit
def one_product_gates(g, SPREAD: tl.constexpr):
    """``(G, fits)`` for a ``[BT, BD]`` tile of log gates ``g``: the in-chunk cumulative
    gates and whether every ``|G| <= SPREAD``, in which case ``e^{G}`` and ``e^{-G}`` may
    scale the two sides of one product. A gate of ``-inf`` (a hard reset) never fits."""
    G = tl.cumsum(g, axis=0)
    return G, tl.max(tl.abs(G)) <= SPREAD


@triton.jit
def gated_operand(x, DOT: tl.constexpr, GATED_PREC: tl.constexpr):
    """An fp32 tile of gate-scaled values (``q ⊙ e^{G}``, ``k ⊙ e^{-G}``, a score gradient) as
    the operand of a product with ``input_precision=GATED_PREC``: for ``"tf32"``, ``x``
    rounded to the nearest tf32 (10 fraction bits, ties away from zero; Inf and NaN kept),
    which the tensor cores read exactly (they drop the low 13 bits, a truncation); else
    ``x`` in ``DOT``. Unlike the inputs, these operands are not bf16 values: rounding them
    to bf16 put both operands' rounding errors into every intra-chunk score (:data:`GATED_PREC_BY_DOT`)."""
    if GATED_PREC == "tf32":
        bits = x.to(tl.uint32, bitcast=True)
        rounded = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
        return tl.where((bits & 0x7F800000) == 0x7F800000, x, rounded)
    else:
        return x.to(DOT)


@triton.jit
def scaled_half(x):
    """``(h, inv)``: an fp32 tile as an fp16 product operand ``h = x * 2**k`` and ``inv =
    2**-k``, with ``k`` chosen so the tile's largest magnitude lands in [2**14, 2**15), under
    fp16's largest 65504. fp16 keeps 3 fraction bits more than bf16 at the same tensor-core
    rate; the power-of-two scale is exact both ways, and costs what fp16's range would
    otherwise take: entries below 2**-38 of the tile's largest flush to zero (an absolute
    error far under one bf16 rounding of the largest). A zero tile takes k = 0; Inf and NaN
    stay what they are."""
    m = tl.max(tl.abs(x))
    e = ((m.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    k = tl.minimum(tl.maximum(14 - tl.where(m > 0, e, 14), -126), 126)
    scale = ((k + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 - k) << 23).to(tl.float32, bitcast=True)
    return (x * scale).to(tl.float16), inv


@triton.jit
def right_half(level, BT: tl.constexpr):
    """``[BT, 1]``: the rows in the second (right) block of ``2**level`` rows of their pair."""
    return (tl.arange(0, BT)[:, None] >> level) % 2 == 1


@triton.jit
def next_level_sums(L, R, right, level, BT: tl.constexpr, BD: tl.constexpr, scratch=None,
                    THROUGH_SCRATCH: tl.constexpr = False):
    """In-block gate sums at ``level + 1`` from those at ``level``.

    At level ``l`` the rows fall in aligned blocks of ``2**l``; ``L_i`` is the sum of
    ``g`` over i's block up to and including ``i``, ``R_j`` the sum over j's block after
    ``j``. Merging each block with its sibling adds the sibling's total (``L`` at the
    sibling's last row) to ``L`` of a right block and to ``R`` of a left block. Every
    value stays a sum of same-sign terms: no cancellation, however large the decay.
    THROUGH_SCRATCH takes the totals through ``scratch`` (:func:`sibling_totals`).
    """
    total = sibling_totals(L, right, level, BT, BD, scratch, THROUGH_SCRATCH)
    return L + tl.where(right, total, 0.0), R + tl.where(right, 0.0, total)


@triton.jit
def next_level_sums_with_exclusive(L, Lx, R, right, level, BT: tl.constexpr, BD: tl.constexpr, scratch=None,
                                   THROUGH_SCRATCH: tl.constexpr = False):
    """:func:`next_level_sums` also carrying ``Lx = L - g`` beside ``L`` (dplr: the rows of
    ``a`` read the state before their own step while ``q`` reads it after): a right block's
    sibling total goes to both."""
    total = sibling_totals(L, right, level, BT, BD, scratch, THROUGH_SCRATCH)
    return L + tl.where(right, total, 0.0), Lx + tl.where(right, total, 0.0), R + tl.where(right, 0.0, total)


@triton.jit
def sums_after(g, G):
    """``G_C - G`` for ``G = cumsum(g)`` over the chunk: each row's sum of ``g`` over the rows
    after it, which is ``R`` after the last level (the one-product form's column side)."""
    return tl.sum(g, axis=0)[None, :] - G


@triton.jit
def next_level_sums_exclusive(X, R, g, right, level, BT: tl.constexpr, BD: tl.constexpr, scratch=None,
                              THROUGH_SCRATCH: tl.constexpr = False):
    """:func:`next_level_sums` with the right rows' sums exclusive of their own row:
    ``X_i = L_i - g_i``, the sum of ``g`` over i's block *before* ``i``, for a query that
    reads the state before its token's update (rwkv6). The sibling's total is ``X + g`` at
    its last row (two terms of one sign), so every value is still a same-sign sum."""
    total = sibling_totals(X + g, right, level, BT, BD, scratch, THROUGH_SCRATCH)
    return X + tl.where(right, total, 0.0), R + tl.where(right, 0.0, total)


@triton.jit
def sibling_totals(L, right, level, BT: tl.constexpr, BD: tl.constexpr, scratch, THROUGH_SCRATCH: tl.constexpr):
    """:func:`sibling_total_through` the program's ``scratch`` tile with THROUGH_SCRATCH,
    else :func:`sibling_total` (the gather): a kernel's config picks the form."""
    if THROUGH_SCRATCH:
        total = sibling_total_through(scratch, L, right, level, BT, BD)
    else:
        total = sibling_total(L, right, level, BT, BD)
    return total


@triton.jit
def sibling_total(L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    """``L`` at the last row of each row's sibling block: the sibling's sum of ``g``."""
    s = 1 << level
    rows = tl.arange(0, BT)[:, None]
    sibling_last = (rows // (2 * s)) * (2 * s) + (s - 1) + tl.where(right, 0, s)
    return tl.gather(L, tl.broadcast_to(sibling_last, (BT, BD)), axis=0)


@triton.jit
def sibling_total_through(scratch, L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    """:func:`sibling_total` by a round trip through the program's own float32 ``[BT, BD]``
    scratch tile in global memory (its L1 holds it) instead of ``tl.gather``: the gather
    makes the compiler keep the level operands in a layout of 64-row column strips a warp
    and convert to and from it; a load by row index lands in the operands' own layout.
    The barriers order one level's loads before the next level's stores and each store
    before the loads of other threads (the CTA's global writes are visible to it after
    a barrier)."""
    s = 1 << level
    rows = tl.arange(0, BT)[:, None]
    cols = tl.arange(0, BD)[None, :]
    sibling_last = (rows // (2 * s)) * (2 * s) + (s - 1) + tl.where(right, 0, s)
    tl.debug_barrier()
    tl.store(scratch + rows * BD + cols, L)
    tl.debug_barrier()
    return tl.load(scratch + sibling_last * BD + cols)


@triton.jit
def level_pairs(level, BT: tl.constexpr):
    """``[BT, BT]`` mask of the pairs (i, j) that ``level`` owns: i in the second half,
    j in the first half of the same block of ``2 * 2**level`` rows."""
    s = 1 << level
    bi = tl.arange(0, BT)[:, None] // s
    bj = tl.arange(0, BT)[None, :] // s
    return (bi - bj == 1) & (bj % 2 == 0)
