"""Chunked gated linear attention (GLA): ``chunk_gla``, forward and backward in Triton,
and with the bonus switch RWKV-6 (``kernels.rwkv6``; section "RWKV-6" below).

The recurrence (per head; ``g`` in log space, one gate per key channel)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T          S: [K, V], S_0 = initial_state
    o_t = S_t^T (scale * q_t)

Notation
--------
Time is cut into chunks of ``BT = 64`` tokens (the last chunk of a sequence may be
shorter: its missing rows are loaded as ``q = k = v = g = 0``). Inside a chunk, with rows
``i, j = 0 .. BT-1``, ``G_i = sum_{t <= i} g_t`` is the inclusive cumulative gate (per
channel, restarting at every chunk), ``L`` the last row (``G_L`` is the gate of the whole
chunk, padded rows add 0) and ``h`` the state entering the chunk. Unrolling the
recurrence over one chunk::

    S_i = diag(e^{G_i}) h + sum_{j <= i} diag(e^{G_i - G_j}) k_j v_j^T

so, with ``A_ij = scale * sum_c q_ic k_jc e^{G_ic - G_jc}`` for ``j <= i`` (0 above)::

    o    = q_in h + A v,                  q_in  = scale q ⊙ e^{G}            (output)
    h'   = diag(e^{G_L}) h + k_out^T v,   k_out = k ⊙ e^{G_L - G}            (next state)

Every exponent is ``<= 0`` (``G`` is non-increasing in time), so no ``exp`` overflows
however strong the decay; what underflows to 0 is below fp32's range anyway.
``G_L - G_j`` is computed as the sum ``sum_{t > j} g_t`` itself, never as a difference of
cumulative sums, which would carry an absolute error of ``|G| 2^-24`` (``4e-4`` at
``|G| ~ 6000``, strong decay) into a factor that may be close to 1.

The intra-chunk scores ``A``: secondary chunking, all the way down
------------------------------------------------------------------
``A`` is not a plain matmul (the gate differs per channel), and the textbook
factorisation ``(q ⊙ e^{G}) (k ⊙ e^{-G})^T`` overflows (``e^{-G}`` reaches ``e^{+6000}``
at ``g = logsigmoid(x) / 0.01``). For ``j`` and ``i`` in different sub-chunks, a reference
row ``e`` between them (``j <= e < i``) splits the factor into two that are each ``<= 1``::

    e^{G_i - G_j} = e^{G_i - G_e} e^{G_e - G_j}

and ``A`` restricted to those pairs is a tensor-core ``tl.dot`` of
``(q ⊙ e^{G - G_e})`` and ``(k ⊙ e^{G_e - G})``. Applied recursively (sub-chunks of 32,
16, ..., 1 rows) this covers every pair with ``i > j``, so the diagonal blocks need no
elementwise loop: at *level* ``l = 0 .. 5`` the rows form aligned blocks of ``s = 2**l``;
level ``l`` owns the pairs with ``i`` in the right and ``j`` in the left block of the same
aligned ``2 s`` block, and its reference row ``e`` is the left block's last row. Every
pair ``i > j`` belongs to exactly one level (the highest bit where ``i`` and ``j``
differ), and the diagonal ``i = j`` is ``q_i . k_i`` (``e^0 = 1``). Per level::

    A += mask_l ⊙ dot(q ⊙ e^{L} ⊙ [i right], (k ⊙ e^{R} ⊙ [j left])^T)

with ``L_i = G_i - G_e = sum of g over i's block up to i`` and ``R_j = G_e - G_j =
sum of g over j's block after j``. These block sums are built level by level without
any subtraction: merging a block with its sibling adds the sibling's total (``L`` at the
sibling's last row, a ``tl.gather``) to ``L`` of a right block and to ``R`` of a left
block. Each factor is then a sum of same-sign terms, accurate to a few ulps at any
decay, and after the last merge ``L = G`` and ``R = G_L - G``: the operands of the state
pass come out of the same recursion. (The brief's two-level form, 16-row sub-chunks with
an elementwise loop over the 16 columns of each diagonal block, is the special case that
stops the recursion at 16; a 16-step loop per chunk is latency-bound on a GPU, while
six levels are six independent tensor-core products.)

Six products and their level sums cost what one does not, and most gates never need them:
where every ``|G|`` of a program's key block is within ``SPREAD`` (40 for bf16 work, 16 for
fp32; ``kernels/_gate_levels.py`` argues both), ``e^{G}`` and ``e^{-G}`` are both
representable and the textbook form is one product over all pairs,
``A = tril(dot(q ⊙ e^{G}, (k ⊙ e^{-G})^T), -1)``, with ``L = G`` and ``R = G_L - G``
directly. The kernels check per program and key block and take the levels only where
the check fails (strong decay, ``-inf`` gates), in the forward and the backward alike.

Backward
--------
With ``dS`` the gradient of the loss w.r.t. a state, define per chunk ``dh`` = the
gradient reaching the chunk's *last* state from the future (later outputs and the final
state): ``dh = dht`` (the final state's gradient, or 0) for the last chunk of a sequence,
and going back one chunk::

    dh_prev = diag(e^{G_L}) dh + q_in^T do

after the first chunk this is the gradient of ``initial_state``. With
``dA = scale * tril(do v^T)`` (the gradient of ``A`` times ``scale``)::

    dv = k_out dh + A^T do
    dq = scale e^{G} ⊙ (do h^T) + [dq_ic = sum_{j <= i} dA_ij k_jc e^{G_ic - G_jc}]
    dk = e^{G_L - G} ⊙ (v dh^T) + [dk_jc = sum_{i >= j} dA_ij q_ic e^{G_ic - G_jc}]

The bracketed intra-chunk terms use the same levels: with ``dA_l = mask_l ⊙ dA``,
``dq += [i right] e^{L} ⊙ dot(dA_l, k ⊙ e^{R} ⊙ [j left])`` and
``dk += [j left] e^{R} ⊙ dot(dA_l^T, q ⊙ e^{L} ⊙ [i right])``, plus the diagonal terms
``dA_ii k_i`` and ``dA_ii q_i``.

Gate gradient (the cumulative-gate identity). The loss depends on ``g`` only through the
sequence-wide cumulative gates ``Γ_t = sum_{s <= t} g_s``, so
``dg_s = sum_{t >= s} ∂L/∂Γ_t`` (a reverse cumsum). ``Γ_t`` enters as ``e^{+Γ_t}`` next to
``q_t`` and as ``e^{-Γ_t}`` next to ``k_t``, and the final state carries ``e^{Γ_T}``, so::

    ∂L/∂Γ_t = q_t ⊙ dq_t - k_t ⊙ dk_t   (+ sum_v S_T ⊙ dht  at t = T)

Inside a chunk the reverse cumsum is local; what the tokens after the chunk add is the
sensitivity to scaling the chunk's last state ``h'`` on its way out, ``sum_v h' ⊙ dh``.
With ``h' = e^{G_L} h + k_out^T v`` that is computable from the chunk alone::

    carry = e^{G_L} ⊙ sum_v (h ⊙ dh) + sum_t k_t ⊙ dk_inter_t,   dk_inter = e^{G_L - G} ⊙ (v dh^T)
    dg_s  = sum_{t >= s in chunk} (q ⊙ dq - k ⊙ dk)_t + carry

(for the last chunk ``dh = dht`` makes ``carry`` the final-state term), so ``dg`` needs no
pass across chunks. Two rearrangements keep it accurate where ``e^{g}`` underflows and
the true ``dg`` is tiny next to ``q ⊙ dq``:

* the diagonal terms ``q_i dA_ii k_i`` appear in both ``q ⊙ dq`` and ``k ⊙ dk`` and
  cancel exactly, so they are left out of ``dg`` (and added to ``dq``, ``dk`` after);
* ``sum_{t >= s} k_t dk_inter_t`` cancels against the same sum in ``carry``, leaving
  ``sum_{t < s} k_t dk_inter_t``, a strict prefix sum computed as a triangular matmul, so
  no large term (the last row's, with factor ``e^0``) is added and taken away::

    dg_s = sum_{t >= s} (q ⊙ dq' - k ⊙ dk_intra')_t + sum_{t < s} (k ⊙ dk_inter)_t
           + e^{G_L} ⊙ sum_v (h ⊙ dh)            (' : without the diagonal terms)

RWKV-6 (BONUS)
--------------
``chunk_rwkv6`` runs these kernels with ``q = r``, ``g = w`` and the bonus ``u [H, K]``.
Its output reads the state *before* the token's update, plus the bonus on the token
itself, ``o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t)``, so with ``X = G - g`` (the
exclusive cumulative gate)::

    o    = q_in h + A v,     q_in = scale q ⊙ e^{X}
    A_ij = scale sum_c q_ic k_jc e^{X_ic - G_jc}  (j < i),    A_ii = scale q_i . (u ⊙ k_i)

and the state pass, ``k_out`` and ``h'`` are unchanged. The levels need only the query's
factor changed: ``X_i - G_e`` is the sum of ``g`` over i's block *before* i, built in the
same recursion (same-sign sums; every exponent still ``<= 0``). Backward: ``dq``
takes ``e^{X}`` for ``e^{G}``; the bonus adds ``dA_ii u ⊙ k_i`` to dq, ``dA_ii u ⊙ q_i``
to dk, and ``du = sum_i dA_ii q_i ⊙ k_i`` over every token (per-chunk partial rows added in
a fixed order, ``kernels._partials.column_sum``). In ``dg``, ``q_t`` carries the
cumulative gate of token ``t - 1``, and what the tokens after the chunk add is the
sensitivity to scaling ``h' - k_L v_L^T`` (the last token's own term does not decay
before the next query reads it); working that through as above::

    dg_s = sum_{t >= s} ((q ⊙ dq')_{t+1} - (k ⊙ dk_intra')_t) + sum_{t < s} (k ⊙ dk_inter)_t
           + e^{G_L} ⊙ sum_v (h ⊙ dh)

(``q ⊙ dq'`` moved up one row). The terms that cancel exactly are now the adjacent pairs
``(t + 1, t)``, whose factor ``e^{X_{t+1} - G_t}`` is 1 at any decay: they are left out of
the levels and added to dq, dk after dg, as the diagonal is for gla.

Precision (bf16)
----------------
The inputs and ``q_in``, ``k_out``, ``h``, ``dh`` meet the tensor cores in bf16. The
gate-scaled operands of the forward's intra-chunk score product, ``q ⊙ e^{L}`` and
``k ⊙ e^{R}``, are not inputs but fp32 values, and rounding them to bf16 put an error of
an ulp into every score ``A_ij``: they go in as tf32
(``kernels._gate_levels.gated_operand``) in the one-product form (realistic gates). The
levels (strong decay) keep bf16: there the decayed pairs weigh little (no error measured
moved), and tf32 operands across six levels took the kernels' spills up to twice (offline
ptxas, sm90). ``A`` itself is stored in bf16 for the output's ``A v``; for the backward's
``A^T do`` (``dv``) its rounding error is stored beside it, ``A_lo = bf16(A - bf16(A))``,
and ``dv`` takes both (one product more in the state pass). Those two changes brought
chunk_rwkv6's ``o`` and ``dv`` errors to the peer library's (``docs/tolerances.md``). The
backward's pair products (``dA`` with the gated ``k``, ``q``) took bf16 operands, and all
three operands' roundings weighed about the same in ``dq``, ``dk`` and the gate gradient
(each kept in fp32 alone took chunk_rwkv6's ``dw`` from 2.64e-3 to 2.25e-3, all three to
1.06e-3): 1.4-2.2 times the peer's error. They go in as fp16, each tile scaled by a power
of two (the ``qkg`` config's ``pairs="fp16"``, ``kernels._gate_levels.scaled_half``): 3
fraction bits more than bf16 at the bf16 rate, at or under the peer's errors on the H200
(chunk_gla ``dq``, ``dk``, ``dg`` 0.99, 0.99, 0.98 of them; chunk_rwkv6 ``dr``, ``dk``, ``dw``
1.00, 1.00, 0.91) for 1.2-1.4% more forward+backward time there (1.814 against 1.793 ms,
2.105 against 2.075, B=4 T=4096 H=16 K=V=128:
``benchmarks/results/sweeps/gated_pairs_fp16_h200.json``). ``pairs="tf32"`` reaches the same
errors 8-10% slower (``_qkg_bwd`` 1.34 -> 1.54 ms, ``sweeps/gated_pairs_fp16_h200.json``);
``pairs="bf16"`` is the previous form.

Kernels and launches
--------------------
Forward, 2 launches (3 with the ``output`` config: the output moves to ``_output_fwd``,
grid ``(chunks * H * cdiv(V, BV),)``, after a state pass that stores every chunk state):

1. ``_intra_fwd``: grid ``(chunks * H,)``; per chunk and head, ``A`` (loop over ``K`` in
   blocks of ``BK``) in ``q``'s dtype (for training in bf16 also ``A_lo``), and ``q_in``,
   ``k_out`` (``q``'s dtype) and
   ``e^{G_L}`` (fp32, per chunk) for the state pass. The level sums' sibling totals go
   through a float32 ``[BT, BK]`` scratch tile per program (``chunks * H * BT * BK``
   floats, freed after the launch) rather than ``tl.gather`` (config ``siblings``).
2. ``_states_fwd``: grid ``(N * H * cdiv(V, BV),)``; one program per sequence, head and
   block of value channels walks its chunks in order, keeping the ``[K, BV]`` fp32 state
   in registers: nothing but tensor-core products and the decay, with the chunk loads
   multi-buffered. Writes the output, the final state and (for training) the
   chunk-entry states ``h`` in ``q``'s dtype.

Backward, 2 launches (``A``, ``A_lo``, ``q_in``, ``k_out``, ``e^{G_L}`` and ``h`` saved from
the forward):

3. ``_states_dv_bwd``: grid ``(N * H * cdiv(V, BV),)``; walks the chunks backwards keeping
   ``dh`` in registers: ``dv``, the per-chunk ``dh`` (``q``'s dtype), and the initial
   state's gradient.
4. ``_qkg_bwd``: grid ``(chunks * H, cdiv(K, BK))``; per chunk and block of key channels:
   ``dA``, ``do h^T``, ``v dh^T`` (loop over ``V``), then the levels: ``dq``, ``dk``, ``dg``.

Grids put the large products on axis 0; offsets are 64-bit (a 64-bit base per tile,
32-bit offsets inside it). Configs come from the target arch (``_configs``).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch, _partials, _utils
from .. import _library as library
from .._arch import COMPILE_OPTIONS, launch_options
from .._gate_levels import (
    LEVELS, gated_operand, gated_prec, level_pairs, next_level_sums, next_level_sums_exclusive, one_product_gates,
    one_product_spread, right_half, scaled_half, sums_after,
)
from .._sequence import state_slots
from ..gated_recurrent.inputs import check_gated_inputs

OP = "chunk_gla"
BT = 64  # chunk length


# --------------------------------------------------------------------------------------
# Indexing helpers
# --------------------------------------------------------------------------------------


@triton.jit
def _chunk_rows(cu_seqlens, chunk_map, i_chunk, T, NT, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """First token (int64) and number of valid rows of chunk ``i_chunk`` (of all sequences)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_map + i_chunk.to(tl.int64) * 2)
        i_c = tl.load(chunk_map + i_chunk.to(tl.int64) * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        i_n = (i_chunk // NT).to(tl.int64)
        i_c = (i_chunk % NT).to(tl.int64)
        bos = i_n * T
        eos = bos + T
    t0 = bos + i_c * BT
    return t0, tl.minimum(eos - t0, BT).to(tl.int32)


@triton.jit
def _sequence(cu_seqlens, chunk_offsets, i_n, T, NT, IS_VARLEN: tl.constexpr):
    """First token, length and first global chunk index of sequence ``i_n`` (all int64)."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        c0 = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
        c0 = i_n.to(tl.int64) * NT
    return bos, eos - bos, c0


# Tiles are addressed as a 64-bit base pointer (first row of the tile) plus 32-bit offsets
# inside the tile: 64-bit safe, and light on registers in the loops.


@triton.jit
def _tile(ptr, nrows, row_stride: tl.constexpr, col0, ncols: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """Pointers and mask of a ``[BR, BD]`` tile: rows ``< nrows``, columns ``col0 .. < ncols``."""
    r = tl.arange(0, BR)[:, None]
    c = col0 + tl.arange(0, BD)[None, :]
    return ptr + r * row_stride + c, (r < nrows) & (c < ncols)


@triton.jit
def _load_rows(ptr, nrows, row_stride: tl.constexpr, col0, ncols: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """``[BR, BD]`` tile as fp32, zero outside."""
    p, m = _tile(ptr, nrows, row_stride, col0, ncols, BR, BD)
    return tl.load(p, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _state_tile(ptr, i_state, K: tl.constexpr, V: tl.constexpr, k0, v0, BK: tl.constexpr, BV: tl.constexpr):
    """Pointers and mask of the ``[BK, BV]`` block at (k0, v0) of state ``i_state`` ([K, V])."""
    return _tile(ptr + i_state.to(tl.int64) * (K * V) + k0 * V, K - k0, V, v0, V, BK, BV)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


@triton.jit
def _query_level_sums(Q, R, g, right, level: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                      BONUS: tl.constexpr, scratch, THROUGH_SCRATCH: tl.constexpr):
    """The level sums with the query side's sum ``Q`` inclusive of its row (``L``), or with
    BONUS exclusive (``X = L - g``: rwkv6's query reads the state before its token); with
    THROUGH_SCRATCH the sibling totals go through the program's ``scratch`` tile instead of
    a gather (``kernels._gate_levels.sibling_totals``)."""
    if BONUS:
        Q, R = next_level_sums_exclusive(Q, R, g, right, level, BT, BD, scratch, THROUGH_SCRATCH)
    else:
        Q, R = next_level_sums(Q, R, right, level, BT, BD, scratch, THROUGH_SCRATCH)
    return Q, R


@triton.jit
def _shift_rows(x, by: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Row ``i`` of the result is row ``i + by`` of ``x`` (``by`` = +-1), zero past the edges."""
    rows = tl.arange(0, BT)[:, None] + by
    inside = (rows >= 0) & (rows < BT)
    source = tl.broadcast_to(tl.minimum(tl.maximum(rows, 0), BT - 1), (BT, BD))
    return tl.where(inside, tl.gather(x, source, axis=0), 0.0)


@triton.jit
def _intra_fwd(
    q, k, g, u, A, A_lo, q_in, k_out, decay, scratch, cu_seqlens, chunk_map, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr, BK: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, GATED_PREC: tl.constexpr, BONUS: tl.constexpr, IS_VARLEN: tl.constexpr,
    THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr, STORE_A_LO: tl.constexpr,
):
    """Per chunk: ``A``, and the gate-scaled operands of the state pass. With BONUS
    (rwkv6, ``u [H, K]``) the query side's gate is exclusive and ``A_ii = scale q_i . (u k_i)``.
    With THROUGH_SCRATCH the level sums' sibling totals go through the program's float32
    ``[BT, BK]`` tile of ``scratch`` instead of a gather."""
    pid = tl.program_id(0)
    if THROUGH_SCRATCH:
        scratch += pid.to(tl.int64) * (BT * BK)
    i_chunk = pid // H
    i_h = pid % H
    t0, nrows = _chunk_rows(cu_seqlens, chunk_map, i_chunk, T, NT, BT, IS_VARLEN)
    row0 = t0 * H + i_h  # flat (token, head) row of the chunk's first token
    q += row0 * K
    k += row0 * K
    g += row0 * K
    q_in += row0 * K
    k_out += row0 * K
    A += row0 * BT
    decay += (i_chunk.to(tl.int64) * H + i_h) * K
    rows = tl.arange(0, BT)[:, None]
    cols = tl.arange(0, BT)[None, :]

    a = tl.zeros([BT, BT], dtype=tl.float32)
    qk_self = tl.zeros([BT], dtype=tl.float32)
    for k0 in range(0, K, BK):
        b_g = _load_rows(g, nrows, H * K, k0, K, BT, BK)
        b_q = _load_rows(q, nrows, H * K, k0, K, BT, BK)
        b_k = _load_rows(k, nrows, H * K, k0, K, BT, BK)
        G, one_product = one_product_gates(b_g, SPREAD)
        if one_product:
            # every |G| <= SPREAD: all pairs i > j in one product of q e^{G} (BONUS: e^{G - g})
            # and k e^{-G} (kernels/_gate_levels.py)
            Q = G - b_g if BONUS else G
            q_s = gated_operand(b_q * tl.exp(Q), DOT, GATED_PREC)
            k_s = gated_operand(b_k * tl.exp(-G), DOT, GATED_PREC)
            a += tl.where(rows > cols, tl.dot(q_s, tl.trans(k_s), input_precision=GATED_PREC), 0.0)
            R = sums_after(b_g, G)
        else:
            # Pairs i > j, level by level: (q_i e^{G_i - G_e}) . (k_j e^{G_e - G_j}), with
            # G_i - G_e = L_i for i in a right block and G_e - G_j = R_j for j in a left one.
            # Q: the query side's in-block sums, inclusive (L), or with BONUS exclusive (X).
            Q = tl.zeros([BT, BK], dtype=tl.float32) if BONUS else b_g
            R = tl.zeros([BT, BK], dtype=tl.float32)
            for level in tl.static_range(LEVELS):
                right = right_half(level, BT)
                factor = tl.exp(tl.where(right, Q, R))
                q_l = tl.where(right, b_q * factor, 0.0).to(DOT)
                k_l = tl.where(right, 0.0, b_k * factor).to(DOT)
                a += tl.where(level_pairs(level, BT), tl.dot(q_l, tl.trans(k_l), input_precision=PREC), 0.0)
                Q, R = _query_level_sums(Q, R, b_g, right, level, BT, BK, BONUS, scratch, THROUGH_SCRATCH)
        # One block per chunk: Q = G (the cumulative gate; with BONUS G - g), R = G_L - G.
        kvec = k0 + tl.arange(0, BK)
        tl.store(decay + kvec, tl.exp(tl.sum(b_g, axis=0)), mask=kvec < K)
        p_q, m_q = _tile(q_in, nrows, H * K, k0, K, BT, BK)
        tl.store(p_q, (b_q * tl.exp(Q) * scale).to(q_in.dtype.element_ty), mask=m_q)
        p_k, m_k = _tile(k_out, nrows, H * K, k0, K, BT, BK)
        tl.store(p_k, (b_k * tl.exp(R)).to(k_out.dtype.element_ty), mask=m_k)
        if BONUS:
            b_u = tl.load(u + i_h * K + kvec, mask=kvec < K, other=0.0).to(tl.float32)
            qk_self += tl.sum(b_q * b_u[None, :] * b_k, axis=1)
        else:
            qk_self += tl.sum(b_q * b_k, axis=1)

    a = tl.where(rows == cols, qk_self[:, None], a) * scale
    p_a, m_a = _tile(A, nrows, H * BT, 0, BT, BT, BT)
    a_hi = a.to(A.dtype.element_ty)
    tl.store(p_a, a_hi, mask=m_a)
    if STORE_A_LO:
        # what A's rounding left out, for dv's A^T do (the output's A v takes A alone)
        p_lo, m_lo = _tile(A_lo + row0 * BT, nrows, H * BT, 0, BT, BT, BT)
        tl.store(p_lo, (a - a_hi.to(tl.float32)).to(A_lo.dtype.element_ty), mask=m_lo)


@triton.jit
def _states_fwd(
    q_in, k_out, v, decay, A, h0, o, h_chunks, ht, cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
    STORE_H_CHUNKS: tl.constexpr, STORE_O: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """Walk one sequence's chunks in order: h <- decay h + k_out^T v, and (STORE_O) the
    output on the way, o = q_in h + A v; without it ``_output_fwd`` computes o afterwards
    from the stored chunk states, all chunks in parallel."""
    pid = tl.program_id(0)
    NV: tl.constexpr = triton.cdiv(V, BV)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, seqlen, c0 = _sequence(cu_seqlens, chunk_offsets, i_n, T, NT, IS_VARLEN)
    v0 = i_v * BV
    kvec = tl.arange(0, BK)

    h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        p_h0, m_h0 = _state_tile(h0, i_nh, K, V, 0, v0, BK, BV)
        h = tl.load(p_h0, mask=m_h0, other=0.0).to(tl.float32)
    for c in range(0, tl.cdiv(seqlen, BT).to(tl.int32)):
        row0 = (bos + c * BT) * H + i_h
        nrows = tl.minimum(seqlen - c * BT, BT).to(tl.int32)
        i_state = (c0 + c) * H + i_h
        p_k, m_k = _tile(k_out + row0 * K, nrows, H * K, 0, K, BT, BK)
        b_k = tl.load(p_k, mask=m_k, other=0.0).to(DOT)
        p_v, m_v = _tile(v + row0 * V, nrows, H * V, v0, V, BT, BV)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(DOT)
        b_decay = tl.load(decay + i_state * K + kvec, mask=kvec < K, other=0.0)
        if STORE_H_CHUNKS:
            p_h, m_h = _state_tile(h_chunks, i_state, K, V, 0, v0, BK, BV)
            tl.store(p_h, h.to(h_chunks.dtype.element_ty), mask=m_h)
        if STORE_O:
            p_q, m_q = _tile(q_in + row0 * K, nrows, H * K, 0, K, BT, BK)
            b_q = tl.load(p_q, mask=m_q, other=0.0).to(DOT)
            p_a, m_a = _tile(A + row0 * BT, nrows, H * BT, 0, BT, BT, BT)
            b_a = tl.load(p_a, mask=m_a, other=0.0).to(DOT)
            b_o = tl.dot(b_q, h.to(DOT), input_precision=PREC)
            b_o = tl.dot(b_a, b_v, b_o, input_precision=PREC)
            p_o, m_o = _tile(o + row0 * V, nrows, H * V, v0, V, BT, BV)
            tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_o)
        h = tl.dot(tl.trans(b_k), b_v, h * b_decay[:, None], input_precision=PREC)
    if STORE_HT:
        p_ht, m_ht = _state_tile(ht, i_nh, K, V, 0, v0, BK, BV)
        tl.store(p_ht, h, mask=m_ht)


@triton.jit
def _output_fwd(
    q_in, v, A, h_chunks, o, cu_seqlens, chunk_map, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """Per chunk, head and block of value channels: o = q_in h + A v, with h the state
    entering the chunk (stored by ``_states_fwd``)."""
    pid = tl.program_id(0)
    NV: tl.constexpr = triton.cdiv(V, BV)
    i_v = pid % NV
    i_chunk = (pid // NV) // H
    i_h = (pid // NV) % H
    v0 = i_v * BV
    t0, nrows = _chunk_rows(cu_seqlens, chunk_map, i_chunk, T, NT, BT, IS_VARLEN)
    row0 = t0 * H + i_h
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for k0 in range(0, K, BK):
        p_q, m_q = _tile(q_in + row0 * K, nrows, H * K, k0, K, BT, BK)
        b_q = tl.load(p_q, mask=m_q, other=0.0).to(DOT)
        p_h, m_h = _state_tile(h_chunks, i_chunk * H + i_h, K, V, k0, v0, BK, BV)
        b_h = tl.load(p_h, mask=m_h, other=0.0).to(DOT)
        b_o = tl.dot(b_q, b_h, b_o, input_precision=PREC)
    p_a, m_a = _tile(A + row0 * BT, nrows, H * BT, 0, BT, BT, BT)
    p_v, m_v = _tile(v + row0 * V, nrows, H * V, v0, V, BT, BV)
    b_o = tl.dot(tl.load(p_a, mask=m_a, other=0.0).to(DOT), tl.load(p_v, mask=m_v, other=0.0).to(DOT), b_o,
                 input_precision=PREC)
    p_o, m_o = _tile(o + row0 * V, nrows, H * V, v0, V, BT, BV)
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_o)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------


@triton.jit
def _states_dv_bwd(
    q_in, k_out, decay, A, A_lo, do, dht, dh0, dh_chunks, dv, cu_seqlens, chunk_offsets, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    USE_A_LO: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """Walk one sequence's chunks backwards: dv = k_out dh + A^T do, dh <- decay dh + q_in^T do.
    With USE_A_LO, ``A^T do`` is ``A^T do + A_lo^T do``: A to about 16 bits, not bf16's 8."""
    pid = tl.program_id(0)
    NV: tl.constexpr = triton.cdiv(V, BV)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, seqlen, c0 = _sequence(cu_seqlens, chunk_offsets, i_n, T, NT, IS_VARLEN)
    v0 = i_v * BV
    kvec = tl.arange(0, BK)

    dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        p_dht, m_dht = _state_tile(dht, i_nh, K, V, 0, v0, BK, BV)
        dh = tl.load(p_dht, mask=m_dht, other=0.0)
    n_chunks = tl.cdiv(seqlen, BT)
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        row0 = (bos + c * BT) * H + i_h
        nrows = tl.minimum(seqlen - c * BT, BT).to(tl.int32)
        i_state = (c0 + c) * H + i_h
        p_q, m_q = _tile(q_in + row0 * K, nrows, H * K, 0, K, BT, BK)
        b_q = tl.load(p_q, mask=m_q, other=0.0).to(DOT)
        p_k, m_k = _tile(k_out + row0 * K, nrows, H * K, 0, K, BT, BK)
        b_k = tl.load(p_k, mask=m_k, other=0.0).to(DOT)
        p_do, m_do = _tile(do + row0 * V, nrows, H * V, v0, V, BT, BV)
        b_do = tl.load(p_do, mask=m_do, other=0.0).to(DOT)
        p_a, m_a = _tile(A + row0 * BT, nrows, H * BT, 0, BT, BT, BT)
        b_a = tl.load(p_a, mask=m_a, other=0.0).to(DOT)
        if USE_A_LO:
            p_a_lo, _ = _tile(A_lo + row0 * BT, nrows, H * BT, 0, BT, BT, BT)
            b_a_lo = tl.load(p_a_lo, mask=m_a, other=0.0).to(DOT)
        b_decay = tl.load(decay + i_state * K + kvec, mask=kvec < K, other=0.0)
        p_dh, m_dh = _state_tile(dh_chunks, i_state, K, V, 0, v0, BK, BV)
        tl.store(p_dh, dh.to(dh_chunks.dtype.element_ty), mask=m_dh)
        b_dv = tl.dot(b_k, dh.to(DOT), input_precision=PREC)
        b_dv = tl.dot(tl.trans(b_a), b_do, b_dv, input_precision=PREC)
        if USE_A_LO:
            b_dv = tl.dot(tl.trans(b_a_lo), b_do, b_dv, input_precision=PREC)
        p_dv, m_dv = _tile(dv + row0 * V, nrows, H * V, v0, V, BT, BV)
        tl.store(p_dv, b_dv.to(dv.dtype.element_ty), mask=m_dv)
        dh = tl.dot(tl.trans(b_q), b_do, dh * b_decay[:, None], input_precision=PREC)
    if STORE_DH0:
        p_dh0, m_dh0 = _state_tile(dh0, i_nh, K, V, 0, v0, BK, BV)
        tl.store(p_dh0, dh.to(dh0.dtype.element_ty), mask=m_dh0)


@triton.jit
def _value_contractions(v, do, h_chunks, dh_chunks, i_state, nrows, k0,
                        H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """A chunk's contractions over V for key block ``k0``: dA = do v^T, do h^T, v dh^T,
    and the row sums of h * dh."""
    d_a = tl.zeros([BT, BT], dtype=tl.float32)
    dq_inter = tl.zeros([BT, BK], dtype=tl.float32)
    dk_inter = tl.zeros([BT, BK], dtype=tl.float32)
    h_dh = tl.zeros([BK], dtype=tl.float32)
    for v0 in range(0, V, BV):
        b_do = _load_rows(do, nrows, H * V, v0, V, BT, BV).to(DOT)
        b_v = _load_rows(v, nrows, H * V, v0, V, BT, BV).to(DOT)
        p_h, m_h = _state_tile(h_chunks, i_state, K, V, k0, v0, BK, BV)
        b_h = tl.load(p_h, mask=m_h, other=0.0)
        p_dh, m_dh = _state_tile(dh_chunks, i_state, K, V, k0, v0, BK, BV)
        b_dh = tl.load(p_dh, mask=m_dh, other=0.0)
        d_a = tl.dot(b_do, tl.trans(b_v), d_a, input_precision=PREC)
        dq_inter = tl.dot(b_do, tl.trans(b_h.to(DOT)), dq_inter, input_precision=PREC)
        dk_inter = tl.dot(b_v, tl.trans(b_dh.to(DOT)), dk_inter, input_precision=PREC)
        h_dh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    return d_a, dq_inter, dk_inter, h_dh


@triton.jit
def _intra_pairs_bwd(d_a, b_q, b_k, b_g, BT: tl.constexpr, BK: tl.constexpr, LEVELS: tl.constexpr,
                     DOT: tl.constexpr, PREC: tl.constexpr, GATED_PREC: tl.constexpr, BONUS: tl.constexpr, scratch,
                     THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr):
    """dq, dk of the pairs i > j within a chunk, in one product where the gates allow it
    and level by level otherwise, as in the forward; also their terms of dg, ``q ⊙ dq`` and
    ``k ⊙ dk``, and the level sums Q = G (with BONUS G - g) and R = G_L - G.

    In the one-product branch the dg terms are formed from the gated operands as rounded
    for the products: a pair (i, j) then enters ``q ⊙ dq`` and ``k ⊙ dk`` as the same
    number, and the pairs on one side of a row cancel exactly in dg's reverse cumsum
    (module docstring, "Gate gradient"). Formed from the unrounded ``q``, ``k``, every pair
    left the difference of two operand roundings in dg, summed over the chunk (bf16 ``dw``
    of rwkv6 twice the error). The levels (strong decay) form them from ``q``, ``k`` after
    the loop: two more accumulators across it doubled the kernel's spills on sm90.

    The one product takes its operands in GATED_PREC (the ``qkg`` config's ``pairs``:
    ``kernels._gate_levels.gated_operand``); the levels keep DOT at PREC: tf32 operands
    there took the kernel's spills on sm90 from 488 to 1124 bytes (offline ptxas, K = V = 128)."""
    G, one_product = one_product_gates(b_g, SPREAD)
    if one_product:
        Q = G - b_g if BONUS else G
        e_q = tl.exp(Q)
        e_k = tl.exp(-G)
        d_a_m = tl.where(tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :], d_a, 0.0)
        if GATED_PREC == "fp16":
            # fp16 operands, each tile scaled by a power of two (scaled_half): 3 bits more
            # than bf16 at the bf16 rate
            d_a_h, d_a_inv = scaled_half(d_a_m)
            k_h, k_inv = scaled_half(b_k * e_k)
            q_h, q_inv = scaled_half(b_q * e_q)
            to_q = tl.dot(d_a_h, k_h) * (d_a_inv * k_inv)
            to_k = tl.dot(tl.trans(d_a_h), q_h) * (d_a_inv * q_inv)
            q_r = q_h.to(tl.float32) * q_inv
            k_r = k_h.to(tl.float32) * k_inv
        else:
            d_a_s = gated_operand(d_a_m, DOT, GATED_PREC)
            k_s = gated_operand(b_k * e_k, DOT, GATED_PREC)
            q_s = gated_operand(b_q * e_q, DOT, GATED_PREC)
            to_q = tl.dot(d_a_s, k_s, input_precision=GATED_PREC)
            to_k = tl.dot(tl.trans(d_a_s), q_s, input_precision=GATED_PREC)
            q_r = q_s.to(tl.float32)
            k_r = k_s.to(tl.float32)
        dq_intra = e_q * to_q
        dk_intra = e_k * to_k
        q_dq_intra = q_r * to_q
        k_dk_intra = k_r * to_k
        R = sums_after(b_g, G)
    else:
        dq_intra = tl.zeros([BT, BK], dtype=tl.float32)
        dk_intra = tl.zeros([BT, BK], dtype=tl.float32)
        Q = tl.zeros([BT, BK], dtype=tl.float32) if BONUS else b_g
        R = tl.zeros([BT, BK], dtype=tl.float32)
        for level in tl.static_range(LEVELS):
            right = right_half(level, BT)
            factor = tl.exp(tl.where(right, Q, R))
            d_a_l = tl.where(level_pairs(level, BT), d_a, 0.0).to(DOT)
            k_l = tl.where(right, 0.0, b_k * factor).to(DOT)
            q_l = tl.where(right, b_q * factor, 0.0).to(DOT)
            to_q = tl.dot(d_a_l, k_l, input_precision=PREC)
            to_k = tl.dot(tl.trans(d_a_l), q_l, input_precision=PREC)
            dq_intra += tl.where(right, factor, 0.0) * to_q
            dk_intra += tl.where(right, 0.0, factor) * to_k
            Q, R = _query_level_sums(Q, R, b_g, right, level, BT, BK, BONUS, scratch, THROUGH_SCRATCH)
        q_dq_intra = b_q * dq_intra
        k_dk_intra = b_k * dk_intra
    return dq_intra, dk_intra, q_dq_intra, k_dk_intra, Q, R


@triton.jit
def _qkg_bwd(
    q, k, v, g, u, do, h_chunks, dh_chunks, dq, dk, dg, du_part, scratch, cu_seqlens, chunk_map, scale, T, NT,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, LEVELS: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, GATED_PREC: tl.constexpr,
    BONUS: tl.constexpr, IS_VARLEN: tl.constexpr, THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr,
):
    """Per chunk and block of key channels: dq, dk, dg; with BONUS (rwkv6) also this
    chunk's share of du, one row of ``du_part [chunk rows, H * K]``. With THROUGH_SCRATCH
    the level sums' sibling totals go through the program's ``[BT, BK]`` scratch tile."""
    pid = tl.program_id(0)
    i_chunk = pid // H
    i_h = pid % H
    k0 = tl.program_id(1) * BK
    if THROUGH_SCRATCH:
        scratch += (pid.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)) * (BT * BK)
    t0, nrows = _chunk_rows(cu_seqlens, chunk_map, i_chunk, T, NT, BT, IS_VARLEN)
    row0 = t0 * H + i_h
    q += row0 * K
    k += row0 * K
    g += row0 * K
    v += row0 * V
    do += row0 * V
    i_state = i_chunk * H + i_h
    rows = tl.arange(0, BT)[:, None]
    cols = tl.arange(0, BT)[None, :]

    d_a, dq_inter, dk_inter, h_dh = _value_contractions(v, do, h_chunks, dh_chunks, i_state, nrows, k0,
                                                        H, K, V, BT, BK, BV, DOT, PREC)
    d_a = d_a * scale
    d_a_self = tl.sum(tl.where(rows == cols, d_a, 0.0), axis=1)
    if BONUS:
        # the pairs (t + 1, t) meet undecayed (e^{G_t - G_t}) and cancel exactly in dg, like
        # the diagonal of gla: left out of the levels and added to dq, dk after dg
        adjacent = rows == cols + 1
        d_a_adjacent = tl.sum(tl.where(adjacent, d_a, 0.0), axis=1)
        d_a = tl.where(adjacent, 0.0, d_a)

    b_q = _load_rows(q, nrows, H * K, k0, K, BT, BK)
    b_k = _load_rows(k, nrows, H * K, k0, K, BT, BK)
    b_g = _load_rows(g, nrows, H * K, k0, K, BT, BK)

    # The i = j terms (dA_ii k_i in dq_i, dA_ii q_i in dk_i) are added last: they cancel
    # exactly in q dq - k dk, and summing them first would leave their rounding error in dg.
    dq_intra, dk_intra, q_dq_intra, k_dk_intra, Q, R = _intra_pairs_bwd(
        d_a, b_q, b_k, b_g, BT, BK, LEVELS, DOT, PREC, GATED_PREC, BONUS, scratch, THROUGH_SCRATCH, SPREAD)
    # Q = G (with BONUS G - g), R = G_L - G (see the forward).
    dq_inter = dq_inter * tl.exp(Q) * scale
    b_dq = dq_inter + dq_intra
    dk_inter = dk_inter * tl.exp(R)
    G_last = tl.sum(b_g, axis=0)

    # dg = revcumsum(q dq - k dk_intra) + sum_{t < s} k_t dk_inter_t + e^{G_L} sum_v h dh: the
    # carry of the module docstring with the k dk_inter terms of rows >= s cancelled out
    # algebraically (at strong decay the last row's term is large and the sum is not).
    # The strict prefix sum is a triangular matmul, so no large term is added and taken away.
    # With BONUS the query of row t + 1 carries the cumulative gate of row t, so its term
    # moves up one row (module docstring, "RWKV-6").
    below = (rows > cols).to(tl.float32)
    q_dq = b_q * dq_inter + q_dq_intra
    if BONUS:
        q_dq = _shift_rows(q_dq, 1, BT, BK)
    b_dg = tl.cumsum(q_dq - k_dk_intra, axis=0, reverse=True)
    b_dg = tl.dot(below, b_k * dk_inter, b_dg, input_precision=PREC)
    b_dg += (tl.exp(G_last) * h_dh)[None, :]
    if BONUS:
        kvec = k0 + tl.arange(0, BK)
        b_u = tl.load(u + i_h * K + kvec, mask=kvec < K, other=0.0).to(tl.float32)
        b_dq += d_a_self[:, None] * (b_u[None, :] * b_k) + d_a_adjacent[:, None] * _shift_rows(b_k, -1, BT, BK)
        b_dk = (dk_inter + dk_intra + d_a_self[:, None] * (b_u[None, :] * b_q)
                + _shift_rows(d_a_adjacent[:, None] * b_q, 1, BT, BK))
        du = tl.sum(d_a_self[:, None] * b_q * b_k, axis=0)
        tl.store(du_part + (i_chunk.to(tl.int64) * H + i_h) * K + kvec, du, mask=kvec < K)
    else:
        b_dq += d_a_self[:, None] * b_k
        b_dk = dk_inter + dk_intra + d_a_self[:, None] * b_q

    p_dq, mask = _tile(dq + row0 * K, nrows, H * K, k0, K, BT, BK)
    tl.store(p_dq, b_dq.to(dq.dtype.element_ty), mask=mask)
    p_dk, mask = _tile(dk + row0 * K, nrows, H * K, k0, K, BT, BK)
    tl.store(p_dk, b_dk.to(dk.dtype.element_ty), mask=mask)
    p_dg, mask = _tile(dg + row0 * K, nrows, H * K, k0, K, BT, BK)
    tl.store(p_dg, b_dg.to(dg.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------
# Configs and launches
# --------------------------------------------------------------------------------------


def _dot_types(work: torch.dtype):
    """(operand dtype, input precision) of ``tl.dot`` for the work dtype (bf16 or fp32).

    bf16 goes to the tensor cores as it is; fp32 uses tf32x3. Triton's CPU interpreter
    multiplies bf16 bit patterns as integers, so there every product runs in fp32 (unless
    ``_arch.interpreter_dots_bf16`` says it was patched to compute bf16 dots as a GPU does).
    """
    if work == torch.float32 or not _arch.interpreter_dots_bf16():
        return tl.float32, ("ieee" if _arch.is_interpreter() else "tf32x3")
    return tl.bfloat16, "tf32x3"


def _state_stages(BK: int, BV: int, elt: int, smem: int) -> int:
    """Most load stages (<= 3) of a state kernel that fit the shared memory ``smem``.

    Per stage the kernel buffers one chunk of q_in, k_out, v (or do) and A (bf16: in the
    backward also A's low part); on top sits a copy of the state for the tensor cores
    (measured by offline compile: 81920 bytes at one stage, +49152 per stage, for K = 128,
    BV = 64, bf16, the forward).
    """
    a_tiles = 2 if elt == 2 else 1
    per_stage = (2 * BT * BK + BT * BV + a_tiles * BT * BT) * elt
    fixed = 2 * BK * BV * elt
    for stages in (3, 2, 1):
        if stages * per_stage + fixed <= smem:
            return stages
    return 1


def _configs(K: int, V: int, dtype: torch.dtype) -> dict:
    """Block sizes, warps and stages per kernel, for the target arch's shared memory.

    ``dtype`` is the work dtype (bf16 or fp32). Offline compiles at K = V = 64, 128, 256,
    bf16 and fp32, fit every target's shared memory (sm80 .. sm120). The chunk-parallel
    kernels take 255 registers at 8 warps on sm90 (one block per SM); the state kernels
    ~150 at K = 128. Timed on an H200 (B=4, T=4096, H=16, K=V=128, bf16), an earlier
    build of the chunk-parallel kernels ran fastest at these block sizes and 8 warps,
    and 4 warps in ``_qkg_bwd`` faulted (illegal address), so it stays at 8, except in
    fp32 at V <= 16, where 8 faulted and 4 did not.
    """
    BK = _utils.block_size(K)
    BV_full = _utils.block_size(V)
    elt = 4 if dtype == torch.float32 else 2
    row_bytes = BK * elt  # one row of a [BT, K] operand tile
    state_bv = min(BV_full, 64 if row_bytes <= 256 else 32 if row_bytes <= 512 else 16)
    return {
        # bf16: one [64, 128] key block per pass ran the forward in 0.83 ms against 0.95 at 64
        # (config_sweep.py, H200); fp32 operands stay at 64 (twice the registers). 8 warps
        # for bf16 on sm90 since its score product takes tf32 operands: chunk_gla's forward
        # 0.556 ms against 0.652 at 16 (H200, config_sweep.py; with bf16 operands 16 had been
        # faster, 0.882 against 0.920 on an H100). The kernel is latency-bound at one block
        # an SM (Nsight Compute: 12.5% occupancy), and register caps or gather-free level
        # sums were slower (kernels/README.md). Elsewhere unmeasured, and ptxas spills
        # 1.1 KB a thread there at 16 (sm80, sm86, sm120).
        # siblings: the level sums' sibling totals through a scratch tile, not tl.gather
        # (kernels/_gate_levels.py). The gather, even in the levels branch alone, holds the
        # operands in its layout across the kernel: with the one-product branch beside it
        # the forward took 0.776 ms against 0.582 through scratch (H100, same bench size).
        # Checked at GPU sizes and under memcheck at CPU sizes, fp32 varlen included; in
        # chunk_kda's kernel the same pairing miscompiled on sm90, so that one gathers.
        "intra": dict(BK=min(BK, 64 if dtype == torch.float32 else 128),
                      num_warps=8, num_stages=1,
                      siblings="scratch"),
        # 8 warps around a [256, 16] fp32 state read shared memory out of bounds on sm90
        # (Triton 3.6, memcheck: the state update's product in _states_fwd); see also
        # _Layout.state_prec
        "state": dict(BV=state_bv, num_warps=8 if BK >= 128 and state_bv >= 32 else 4,
                      num_stages=_state_stages(BK, state_bv, elt, _arch.shared_memory_limit())),
        # fp32 at a 16-wide value block (V <= 16) read shared memory out of bounds at 8 warps
        # on sm90 (Triton 3.6, memcheck: _value_contractions' loads);
        # 4 warps ran clean there
        # pairs: the input precision of the in-chunk pair products' gate-scaled operands under
        # bf16 work: "fp16" scaled a tile, at the peer's errors for 2% more time in this
        # kernel on the H200 (1.107 against 1.085 ms, chunk_gla at the bench size); "tf32"
        # the same errors at 15% more (1.54 against 1.34, chunk_rwkv6); "bf16" 1.4-2.2
        # times the peer's errors (docs/tolerances.md)
        "qkg": dict(BK=min(BK, 64), BV=min(BV_full, 64), num_warps=4 if elt == 4 and BV_full <= 16 else 8,
                    num_stages=1, pairs="fp16"),
        # None: the state pass computes the output on its way (one pass over the chunk
        # operands). A dict: the state pass keeps to the recurrence and stores every chunk
        # state, and _output_fwd computes the output with these block sizes, all chunks in
        # parallel (more bytes moved, less on the sequential path; config_sweep.py times both)
        "output": None,
    }


_chunk_offsets_cache = _utils.device_cache()


def _chunk_offsets(offsets_host: torch.Tensor, device) -> torch.Tensor:
    """int32 ``[N + 1]``: index of each sequence's first chunk among all sequences' chunks."""
    key = (id(offsets_host), str(device))
    hit = _chunk_offsets_cache.get(key)
    if hit is not None and hit[0] is offsets_host:
        return hit[1]
    if _utils.shapes_only():  # no values: see kernels/_library.py
        return torch.empty((offsets_host.numel(),), dtype=torch.int32, device=device)
    n_chunks = (offsets_host[1:] - offsets_host[:-1] + BT - 1) // BT
    table = _utils.host_to_device(torch.cat([n_chunks.new_zeros(1), n_chunks.cumsum(0)]).to(torch.int32), device)
    if len(_chunk_offsets_cache) > 256:
        _chunk_offsets_cache.clear()
    _chunk_offsets_cache[key] = (offsets_host, table)
    return table


def _pair_prec(pairs: str | None, lay) -> str:
    """The ``GATED_PREC`` of ``_qkg_bwd``'s one product from the ``qkg`` config's ``pairs``:
    ``"tf32"`` and ``"fp16"`` (scaled fp16 operands) under bf16 work, the kernel's own
    precision otherwise (bf16 pairs; fp32 work takes its three-pass tf32 everywhere)."""
    bf16_work = lay.gated_prec != lay.prec
    if pairs == "tf32":
        return lay.gated_prec
    if pairs == "fp16" and bf16_work:
        return "fp16"
    return lay.prec


class _Layout:
    """Sizes and chunk tables shared by the launches of one call."""

    def __init__(self, q: torch.Tensor, v: torch.Tensor, cu_seqlens, offsets_host):
        B, T, H, K = q.shape
        self.cu_seqlens = cu_seqlens
        self.T, self.H, self.K, self.V = T, H, K, v.shape[-1]
        self.BK = _utils.block_size(K)
        self.varlen = offsets_host is not None
        if self.varlen:
            self.N = offsets_host.numel() - 1
            self.NT = 0
            self.chunk_map = _utils.chunk_map(offsets_host, BT, q.device)
            self.chunk_offsets = _chunk_offsets(offsets_host, q.device)
            self.n_chunks = self.chunk_map.shape[0]
        else:
            self.N = B
            self.NT = _utils.cdiv(T, BT)
            self.chunk_map = self.chunk_offsets = None
            self.n_chunks = B * self.NT
        # rows of the per-chunk buffers: from T and N alone (no output shape may depend on
        # the offsets' values, kernels/_library.py); packed, up to N rows stay unused
        self.chunk_rows = state_slots(B, T, self.N, BT, self.varlen)
        # Intermediates (A, q_in, k_out, the chunk states) are kept in q's dtype, except
        # for fp16, whose range cannot hold gate-scaled operands (e^{G} < 6e-8 flushes to
        # 0 and takes, e.g., the whole initial-state gradient with it at strong decay).
        self.work = torch.float32 if q.dtype == torch.float16 else q.dtype
        self.cfg = _configs(K, self.V, self.work)
        self.dot, self.prec = _dot_types(self.work)
        self.gated_prec = gated_prec(self.dot, self.prec)  # products of gate-scaled operands
        # bf16 A: its rounding error kept beside it for the backward's A^T do
        self.a_lo = self.work != torch.float32
        self.spread = one_product_spread(self.work)  # the gate-level kernels' one-product limit
        # fp32 state passes at a 16-wide value block (K > 128): on sm90 their three-pass
        # tf32 products read shared memory out of bounds at 8 warps, and at 4 gave outputs
        # that changed between runs under memcheck (Triton 3.6); plain fp32 products did not.
        # Those stage 150-160 KB, more than the 100 KB parts have (compile-only checks),
        # which keep the three-pass products.
        plain_fp32 = self.work == torch.float32 and self.cfg["state"]["BV"] < 32
        self.state_prec = "ieee" if plain_fp32 and _arch.shared_memory_limit() >= 160_000 else self.prec

    def common(self):
        return dict(T=self.T, NT=self.NT, H=self.H, K=self.K, BT=BT, DOT=self.dot, PREC=self.prec,
                    IS_VARLEN=self.varlen)


def _forward(q, k, v, g, scale, initial_state, output_final_state, lay: _Layout, save_states: bool, u=None):
    H, K, V = lay.H, lay.K, lay.V
    A = _utils.empty((*q.shape[:3], BT), lay.work, q.device)
    A_lo = _utils.empty_like(A) if save_states and lay.a_lo else None
    q_in = _utils.empty_like(q, lay.work)
    k_out = _utils.empty_like(k, lay.work)
    decay = _utils.empty((lay.chunk_rows, H, K), torch.float32, q.device)
    if lay.n_chunks > 0:
        cfg = lay.cfg["intra"]
        through = cfg.get("siblings") == "scratch"
        scratch = _utils.empty((lay.n_chunks * H, BT, cfg["BK"]), torch.float32, q.device) if through else None
        _intra_fwd[(lay.n_chunks * H,)](
            q, k, g, u, A, A_lo, q_in, k_out, decay, scratch, lay.cu_seqlens, lay.chunk_map, scale, **lay.common(),
            GATED_PREC=lay.gated_prec, LEVELS=LEVELS, BK=cfg["BK"], BONUS=u is not None, THROUGH_SCRATCH=through,
            SPREAD=lay.spread, STORE_A_LO=A_lo is not None,
            **launch_options(cfg["num_warps"], cfg["num_stages"], cfg.get("maxnreg")),
        )
    o = _utils.empty_like(v)
    split = lay.cfg["output"] is not None
    h_chunks = _utils.empty((lay.chunk_rows, H, K, V), lay.work, q.device) if (save_states or split) else None
    if lay.varlen:
        # packed, up to N rows past the chunks are never written; the op returns these
        # buffers (for its backward), so they hold zeros rather than whatever was there
        decay[lay.n_chunks:].zero_()
        if h_chunks is not None:
            h_chunks[lay.n_chunks:].zero_()
    final_state = _utils.empty((lay.N, H, K, V), torch.float32, q.device) if output_final_state else None
    cfg = lay.cfg["state"]
    _states_fwd[(lay.N * H * _utils.cdiv(V, cfg["BV"]),)](
        q_in, k_out, v, decay, A, initial_state, o, h_chunks, final_state, lay.cu_seqlens, lay.chunk_offsets,
        **{**lay.common(), "PREC": lay.state_prec}, V=V, BK=lay.BK, BV=cfg["BV"], USE_H0=initial_state is not None,
        STORE_HT=output_final_state, STORE_H_CHUNKS=h_chunks is not None, STORE_O=not split,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **COMPILE_OPTIONS,
    )
    if split and lay.n_chunks > 0:
        cfg = lay.cfg["output"]
        _output_fwd[(lay.n_chunks * H * _utils.cdiv(V, cfg["BV"]),)](
            q_in, v, A, h_chunks, o, lay.cu_seqlens, lay.chunk_map, **lay.common(), V=V, BK=cfg["BK"], BV=cfg["BV"],
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **COMPILE_OPTIONS,
        )
    return o, final_state, (A, A_lo, q_in, k_out, decay, h_chunks)


def _backward(q, k, v, g, saved, scale, do, dht, lay: _Layout, dh0_dtype: torch.dtype | None, u=None):
    """``dh0_dtype``: the initial state's dtype, its gradient's; None when it is not wanted."""
    need_dh0 = dh0_dtype is not None
    A, A_lo, q_in, k_out, decay, h_chunks = saved
    H, K, V = lay.H, lay.K, lay.V
    dh_chunks = _utils.empty((lay.chunk_rows, H, K, V), lay.work, q.device)
    dv = _utils.empty_like(v)
    dh0 = _utils.empty((lay.N, H, K, V), dh0_dtype, q.device) if need_dh0 else None
    cfg = lay.cfg["state"]
    _states_dv_bwd[(lay.N * H * _utils.cdiv(V, cfg["BV"]),)](
        q_in, k_out, decay, A, A_lo, do, dht, dh0, dh_chunks, dv, lay.cu_seqlens, lay.chunk_offsets,
        **{**lay.common(), "PREC": lay.state_prec}, V=V, BK=lay.BK, BV=cfg["BV"], USE_DHT=dht is not None, STORE_DH0=need_dh0,
        USE_A_LO=A_lo is not None,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **COMPILE_OPTIONS,
    )
    dq = _utils.empty_like(q)
    dk = _utils.empty_like(k)
    dg = _utils.empty_like(g)
    # u is shared by every token: one row of partial sums per chunk, added in a fixed order;
    # rows past the chunks (chunk_rows counts up to N more when packed) stay zero
    du_part = torch.zeros((lay.chunk_rows, H * K), dtype=torch.float32, device=q.device) if u is not None else None
    if lay.n_chunks > 0:
        cfg = lay.cfg["qkg"]
        NK = _utils.cdiv(K, cfg["BK"])
        through = cfg.get("siblings") == "scratch"
        scratch = _utils.empty((lay.n_chunks * H * NK, BT, cfg["BK"]), torch.float32, q.device) if through else None
        _qkg_bwd[(lay.n_chunks * H, NK)](
            q, k, v, g, u, do, h_chunks, dh_chunks, dq, dk, dg, du_part, scratch, lay.cu_seqlens, lay.chunk_map,
            scale, **lay.common(), V=V, GATED_PREC=_pair_prec(cfg.get("pairs"), lay),
            LEVELS=LEVELS, BK=cfg["BK"], BV=cfg["BV"], BONUS=u is not None,
            THROUGH_SCRATCH=through, SPREAD=lay.spread,
            **launch_options(cfg["num_warps"], cfg["num_stages"], cfg.get("maxnreg")),
        )
    du = _partials.column_sum(du_part, u.dtype).view(u.shape) if u is not None else None
    return dq, dk, dv, dg, dh0, du


def _op_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, u: Optional[torch.Tensor],
                initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, *, keep, offsets):
    q, k, v, g, u, initial_state = _utils.contiguous(q, k, v, g, u, initial_state)
    lay = _Layout(q, v, cu_seqlens, offsets)
    o, final_state, saved = _forward(q, k, v, g, scale, initial_state, output_final_state, lay, keep, u)
    return (o, final_state), saved if keep else ()


def _op_backward(grads, saved, q, k, v, g, u, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state,
                 *, needs_grad, offsets):
    q, k, v, g, u, do, dht = _utils.contiguous(q, k, v, g, u, *grads)
    if do is None:  # only the final state was used
        do = torch.zeros_like(v)
    lay = _Layout(q, v, cu_seqlens, offsets)
    need_dh0 = initial_state is not None and needs_grad["initial_state"]
    dq, dk, dv, dg, dh0, du = _backward(q, k, v, g, saved, scale, do, dht, lay,
                                        initial_state.dtype if need_dh0 else None, u)
    return dict(q=dq, k=dk, v=dv, g=dg, u=du, initial_state=dh0)


# chunk_rwkv6 is these launches with the bonus u (kernels/rwkv6)
OPS = {name: library.register(name, _op_forward, _op_backward) for name in (OP, "chunk_rwkv6")}
CHUNK_GLA = OPS[OP]


def _validate_args(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
    """The checks every gated recurrence shares (g as a per-channel gate); the host offsets."""
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{OP}: `output_final_state` must be a bool, got {type(output_final_state).__name__}")
    inputs = check_gated_inputs(OP, q, k, v, gk=g, scale=scale, initial_state=initial_state,
                                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, gk_name="g")
    return inputs.offsets_host


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
):
    """Gated linear attention, chunked: ``S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T (scale q_t)``.

    q, k, g: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (q, k, v of one dtype; g of any float
    dtype, its gradient in that dtype). ``scale`` defaults to ``K ** -0.5``.
    ``initial_state``: float32 ``[N, H, K, V]``. With ``cu_seqlens`` (``B == 1``), the N
    packed sequences run independently; pass ``cu_seqlens_cpu`` to validate without a
    device-to-host copy. Returns ``(o, final_state)``, ``final_state`` float32
    ``[N, H, K, V]`` or None. K and V up to 256.
    """
    offsets_host = _validate_args(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)
    _arch.require_arch("chunk_gla", 80, _arch.SM75_TILES)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return CHUNK_GLA(q, k, v, g, None, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state,
                     offsets=offsets_host)
