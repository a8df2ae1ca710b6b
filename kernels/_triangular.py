"""Triangular pieces of the WY (UT-transform) form that chunked delta rules share.

A chunked delta rule turns the in-chunk recurrence of its pseudo-values into a unit
lower-triangular system ``(I + A) U = ...`` per chunk; :func:`unit_lower_inverse` inverts
its matrix with tensor-core products (``kernels/delta_rule/chunk.py`` for the scalar-gated
rule, ``kernels/delta_rule/chunk_kda.py`` for the per-channel one).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._chunk import mm


@triton.jit
def unit_lower_inverse(A, AT, BT: tl.constexpr, DT: tl.constexpr):
    """(I + A)^{-1} for a strictly lower-triangular fp32 [BT, BT] tile A (BT a multiple of 16).

    ``AT`` is A transposed (callers form both from the same symmetric K K^T), so that a row
    of A can be read as a column of AT without a layout conversion.

    The 16 x 16 diagonal blocks are inverted together, by forward substitution on a
    [BT/16, 16, 16] view. With D that block-diagonal inverse and A_o the part of A below
    the diagonal blocks, I + A = (I + A_d)(I + D A_o), and N = D A_o is strictly
    block-lower over at most four blocks (BT = 64), so N^4 = 0 and
    (I + A)^{-1} = (I - N)(I + N^2) D: four tensor-core products, with operands in ``DT``
    (the input dtype: L is rounded to it for every later product anyway).
    """
    NB: tl.constexpr = BT // 16
    blk = tl.arange(0, NB)
    r16 = tl.arange(0, 16)
    same_block = blk[:, None, None, None] == blk[None, None, :, None]
    # AdT[b, c, r] = A[16 b + r, 16 b + c]
    AdT = tl.sum(tl.where(same_block, tl.reshape(AT, (NB, 16, NB, 16)), 0.0), axis=2)
    X = tl.where(r16[None, :, None] == r16[None, None, :], 1.0, 0.0) + tl.zeros((NB, 16, 16), tl.float32)
    for i in tl.static_range(1, 16):
        # row i of each block: e_i - sum_{c < i} A_d[i, c] X[c, :], rows c < i already final
        a_i = tl.sum(tl.where(r16[None, None, :] == i, AdT, 0.0), axis=2)
        x_i = tl.where(r16[None, :] == i, 1.0, 0.0) - tl.sum(a_i[:, :, None] * X, axis=1)
        X = tl.where(r16[None, :, None] == i, x_i[:, None, :], X)
    D = tl.reshape(tl.where(same_block, X[:, :, None, :], 0.0), (BT, BT))
    rows = tl.arange(0, BT)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    A_o = tl.where(rows[:, None] // 16 > rows[None, :] // 16, A, 0.0)
    # the products take the input dtype (fp32: three-pass tf32), like every product of L later
    D = D.to(DT)
    N = mm(D, A_o.to(DT))
    N2 = mm(N.to(DT), N.to(DT))
    return mm(mm((eye - N).to(DT), (eye + N2).to(DT)).to(DT), D)
