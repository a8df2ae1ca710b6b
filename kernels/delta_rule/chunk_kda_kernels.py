"""The kernels of ``chunk_kda`` of its own: the intra-chunk prepare and the chunk gradients.

The derivation is in ``kernels/delta_rule/chunk_kda.py``. The sequential state passes and
the output are the delta rule's kernels (``chunk_fwd.py``, ``chunk_bwd.py``) in their
per-channel form (``CHANNEL_DECAY``, ``GIVEN_P``); the in-chunk products under
per-channel gates are the gate-level recursion of ``kernels/_gate_levels.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._chunk import mm, rows_tile, rows_tile_store, state_piece_load
from .._gate_levels import level_pairs, next_level_sums, one_product_gates, right_half, scaled_half, sums_after
from .._triangular import unit_lower_inverse
from ._chunk_common import L2NORM_EPS, chunk_head_program


@triton.jit
def _unit_rows(x_base, n_valid, H: tl.constexpr, K: tl.constexpr, col0, r, BT: tl.constexpr, BK: tl.constexpr):
    """A [BT, BK] tile of q or k in fp32, rows scaled by their inverse norms ``r``."""
    return rows_tile(x_base, n_valid, H * K, K, col0, BT, BK).to(tl.float32) * r[:, None]


@triton.jit
def kda_intra_kernel(
    q, k, v, g, beta, q_in, k_out, w, u, L, KK, P, decay, rq, rk, scratch, levels_needed,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LEVELS: tl.constexpr,
    L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, STORE_L: tl.constexpr, THROUGH_SCRATCH: tl.constexpr,
    SPREAD: tl.constexpr, ONE_PRODUCT: tl.constexpr,
):
    """One program per (chunk, value head): P, A; L = (I + A)^{-1}; q_in, k_out, e^{G_C};
    W = L diag(beta) (k ⊙ e^G), U~ = L diag(beta) V. With STORE_L also L and KK = A / beta_i
    (the backward's dbeta) for the backward.

    Two launches, one per form of P and A, so that each compiles without the other's
    registers. ONE_PRODUCT: one product per key block (``kernels/_gate_levels.py``); a
    program whose gates exceed SPREAD in any key block marks itself in ``levels_needed``
    (int8, one a program) and stops after the key blocks, its stores to be overwritten.
    Else the gate levels, in the programs marked (in every program where ``levels_needed``
    is None); with THROUGH_SCRATCH the level sums' sibling totals go through the program's
    float32 ``[BT, BK]`` tile of ``scratch`` instead of a gather."""
    program = tl.program_id(0).to(tl.int64)
    if not ONE_PRODUCT:
        if levels_needed is not None:
            if tl.load(levels_needed + program) == 0:
                return
    if THROUGH_SCRATCH:
        scratch += program * (BT * BK)
    i_hv, i_h, t0, slot, n_valid, rows, valid = chunk_head_program(
        program, cu_seqlens, chunk_map, T, H, HV, BT, IS_VARLEN)
    WT = w.dtype.element_ty  # the work dtype of every intermediate
    qk_base = (t0 * H + i_h) * K
    g_base = (t0 * HV + i_hv) * K

    b_beta = tl.load(beta + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    b_rq = tl.where(valid, 1.0, 0.0)
    b_rk = tl.where(valid, 1.0, 0.0)
    if L2NORM:
        ss_q = tl.zeros([BT], dtype=tl.float32)
        ss_k = tl.zeros([BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_q = rows_tile(q + qk_base, n_valid, H * K, K, i_k * BK, BT, BK).to(tl.float32)
            b_k = rows_tile(k + qk_base, n_valid, H * K, K, i_k * BK, BT, BK).to(tl.float32)
            ss_q += tl.sum(b_q * b_q, axis=1)
            ss_k += tl.sum(b_k * b_k, axis=1)
        b_rq = 1.0 / tl.sqrt(ss_q + L2NORM_EPS)
        b_rk = 1.0 / tl.sqrt(ss_k + L2NORM_EPS)
        # every value head of the group computes the same norms; the first one stores them
        first = tl.where(i_hv % (HV // H) == 0, valid, False)
        tl.store(rq + (t0 + rows) * H + i_h, b_rq, mask=first)
        tl.store(rk + (t0 + rows) * H + i_h, b_rk, mask=first)

    b_P = tl.zeros([BT, BT], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    b_self = tl.zeros([BT], dtype=tl.float32)
    fits_all = tl.full([], 1, tl.int32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = _unit_rows(q + qk_base, n_valid, H, K, i_k * BK, b_rq, BT, BK)
        b_k = _unit_rows(k + qk_base, n_valid, H, K, i_k * BK, b_rk, BT, BK)
        b_g = rows_tile(g + g_base, n_valid, HV * K, K, i_k * BK, BT, BK).to(tl.float32)
        g_total = tl.sum(b_g, axis=0)
        if ONE_PRODUCT:
            # all pairs in one product of x e^{G} and k e^{-G}; the pairs i <= j it also
            # forms are masked out below. e^{G} scales q_in, and k e^{-G} e^{G_C} is k_out
            G, fits = one_product_gates(b_g, SPREAD)
            fits_all = tl.minimum(fits_all, fits.to(tl.int32))
            e_row = tl.exp(G)
            q_scaled = b_q * e_row
            k_col = b_k * tl.exp(-G)
            k_left = tl.trans(k_col.to(WT))
            b_P += mm(q_scaled.to(WT), k_left)
            b_A += mm((b_k * e_row).to(WT), k_left)
            k_scaled = k_col * tl.exp(g_total)[None, :]
        else:
            # pairs i > j, level by level: (x_i e^{L_i}) . (k_j e^{R_j}), x = q for P, k for A
            b_L = b_g
            b_R = tl.zeros([BT, BK], dtype=tl.float32)
            for level in tl.static_range(LEVELS):
                right = right_half(level, BT)
                factor = tl.exp(tl.where(right, b_L, b_R))
                k_left = tl.trans(tl.where(right, 0.0, b_k * factor).to(WT))
                pairs = level_pairs(level, BT)
                b_P += tl.where(pairs, mm(tl.where(right, b_q * factor, 0.0).to(WT), k_left), 0.0)
                b_A += tl.where(pairs, mm(tl.where(right, b_k * factor, 0.0).to(WT), k_left), 0.0)
                b_L, b_R = next_level_sums(b_L, b_R, right, level, BT, BK, scratch, THROUGH_SCRATCH)
            # after the last level: L = G, R = G_C - G, each a sum of same-sign gates
            q_scaled = b_q * tl.exp(b_L)
            k_scaled = b_k * tl.exp(b_R)
        b_self += tl.sum(b_q * b_k, axis=1)
        rows_tile_store(q_in + g_base, q_scaled * scale, n_valid, HV * K, K, i_k * BK, BT, BK)
        rows_tile_store(k_out + g_base, k_scaled, n_valid, HV * K, K, i_k * BK, BT, BK)
        cols = i_k * BK + tl.arange(0, BK)
        tl.store(decay + (slot * HV + i_hv) * K + cols, tl.exp(g_total), mask=cols < K)
    if ONE_PRODUCT:
        tl.store(levels_needed + program, (1 - fits_all).to(tl.int8))
        if fits_all == 0:
            return

    causal = (rows[:, None] >= rows[None, :]) & valid[:, None]
    strict = (rows[:, None] > rows[None, :]) & valid[:, None]
    b_P = tl.where(causal, tl.where(rows[:, None] == rows[None, :], b_self[:, None], b_P) * scale, 0.0)
    rows_tile_store(P + (t0 * HV + i_hv) * BT, b_P, n_valid, HV * BT, BT, 0, BT, BT)
    b_A = tl.where(strict, b_A, 0.0)
    if STORE_L:
        rows_tile_store(KK + (t0 * HV + i_hv) * BT, b_A, n_valid, HV * BT, BT, 0, BT, BT)
    b_A = b_A * b_beta[:, None]
    b_Ld = unit_lower_inverse(b_A, tl.trans(b_A), BT, WT).to(WT)
    if STORE_L:
        rows_tile_store(L + (t0 * HV + i_hv) * BT, b_Ld, n_valid, HV * BT, BT, 0, BT, BT)

    # W = L diag(beta) (k ⊙ e^G): e^G alone (exponent <= 0) from the cumulative gates
    for i_k in range(tl.cdiv(K, BK)):
        b_k = _unit_rows(k + qk_base, n_valid, H, K, i_k * BK, b_rk * b_beta, BT, BK)
        b_G = tl.cumsum(rows_tile(g + g_base, n_valid, HV * K, K, i_k * BK, BT, BK).to(tl.float32), axis=0)
        b_w = mm(b_Ld, (b_k * tl.exp(b_G)).to(WT))
        rows_tile_store(w + g_base, b_w, n_valid, HV * K, K, i_k * BK, BT, BK)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = rows_tile(v + (t0 * HV + i_hv) * V, n_valid, HV * V, V, i_v * BV, BT, BV).to(tl.float32)
        b_u = mm(b_Ld, (b_v * b_beta[:, None]).to(WT))
        rows_tile_store(u + (t0 * HV + i_hv) * V, b_u, n_valid, HV * V, V, i_v * BV, BT, BV)


@triton.jit
def kda_grad_matrices_kernel(
    k, v, g, beta, L, KK, h, vn, dvn, do, rk, dPs, dA, dv, dbeta,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """One program per (chunk, value head): dv, dbeta, and the in-chunk matrices the key
    gradients contract, dPs = scale (dO U^T) (causal) and dA (strictly lower)."""
    NK: tl.constexpr = (K + BK - 1) // BK
    NV: tl.constexpr = (V + BV - 1) // BV
    i_hv, i_h, t0, slot, n_valid, rows, valid = chunk_head_program(
        tl.program_id(0).to(tl.int64), cu_seqlens, chunk_map, T, H, HV, BT, IS_VARLEN)
    WT = L.dtype.element_ty
    h_base = h + (slot * HV + i_hv) * K * V
    qk_base = (t0 * H + i_h) * K
    g_base = (t0 * HV + i_hv) * K
    v_row0 = (t0 * HV + i_hv) * V  # first element of this chunk's rows in v, do, vn, dvn, dv
    m_row0 = (t0 * HV + i_hv) * BT  # the same for the [.., BT] matrices

    b_beta = tl.load(beta + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    b_rk = tl.where(valid, 1.0, 0.0)
    if L2NORM:
        b_rk = tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)
    b_Ld = rows_tile(L + m_row0, n_valid, HV * BT, BT, 0, BT, BT)

    # dT = dU Vt^T with Vt = V - (k ⊙ e^G) h, dP = dO U^T, dv = diag(beta) L^T dU
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dP = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(NV):
        b_vt = rows_tile(v + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV).to(tl.float32)
        b_do = rows_tile(do + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV).to(WT)
        b_vn = rows_tile(vn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_dvn = rows_tile(dvn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        for i_k in range(NK):
            b_k = _unit_rows(k + qk_base, n_valid, H, K, i_k * BK, b_rk, BT, BK)
            b_G = tl.cumsum(rows_tile(g + g_base, n_valid, HV * K, K, i_k * BK, BT, BK).to(tl.float32), axis=0)
            b_h = state_piece_load(h_base, i_k, i_v, K, V, BK, BV)
            b_vt -= mm((b_k * tl.exp(b_G)).to(WT), b_h)
        b_dT += mm(b_dvn, tl.trans(b_vt.to(WT)))
        b_dP += mm(b_do, tl.trans(b_vn))
        b_dv = mm(tl.trans(b_Ld), b_dvn) * b_beta[:, None]
        rows_tile_store(dv + v_row0, b_dv, n_valid, HV * V, V, i_v * BV, BT, BV)

    # Through T = L diag(beta), L = (I + A)^{-1}: dbeta_j += sum_i dT_ij L_ij,
    # dA = -L^T (dT diag(beta)) L^T on the strictly lower part; A = diag(beta) KK adds
    # dbeta_i += sum_j dA_ij KK_ij.
    b_dA = -mm(mm(tl.trans(b_Ld), (b_dT * b_beta[None, :]).to(WT)).to(WT), tl.trans(b_Ld))
    b_dA = tl.where((rows[:, None] > rows[None, :]) & valid[:, None], b_dA, 0.0)
    b_KK = rows_tile(KK + m_row0, n_valid, HV * BT, BT, 0, BT, BT).to(tl.float32)
    b_dbeta = tl.sum(b_dT * b_Ld.to(tl.float32), axis=0) + tl.sum(b_dA * b_KK, axis=1)
    tl.store(dbeta + (t0 + rows) * HV + i_hv, b_dbeta, mask=valid)
    causal = (rows[:, None] >= rows[None, :]) & valid[:, None]
    rows_tile_store(dPs + m_row0, tl.where(causal, b_dP, 0.0) * scale, n_valid, HV * BT, BT, 0, BT, BT)
    rows_tile_store(dA + m_row0, b_dA, n_valid, HV * BT, BT, 0, BT, BT)


@triton.jit
def _inter_chunk_contractions(do, vn, dvn, h_base, dh_base, n_valid, i_k, HV: tl.constexpr, K: tl.constexpr,
                              V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                              WT: tl.constexpr):
    """The inter-chunk contractions over V for one key block: dO h^T, dU h^T, U dh^T, and
    <h, dh> per key row (``do``, ``vn``, ``dvn`` at the chunk's first row)."""
    b_dqh = tl.zeros([BT, BK], dtype=tl.float32)
    b_dUh = tl.zeros([BT, BK], dtype=tl.float32)
    b_Udh = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = rows_tile(do, n_valid, HV * V, V, i_v * BV, BT, BV).to(WT)
        b_vn = rows_tile(vn, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_dvn = rows_tile(dvn, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_h = state_piece_load(h_base, i_k, i_v, K, V, BK, BV)
        b_dh = state_piece_load(dh_base, i_k, i_v, K, V, BK, BV)
        b_dqh += mm(b_do, tl.trans(b_h))
        b_dUh += mm(b_dvn, tl.trans(b_h))
        b_Udh += mm(b_vn, tl.trans(b_dh))
        b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    return b_dqh, b_dUh, b_Udh, b_hdh


@triton.jit
def _pair_products(d_P, d_A, k_left, q_right, kb_right):
    """One set of in-chunk pairs' products: what reaches q's rows and k's columns through P,
    k's rows and columns through A, and the pairs' dG terms from the same rounded operands."""
    to_q_P = mm(d_P, k_left)
    to_k_P = mm(tl.trans(d_P), q_right)
    to_k_Arow = mm(d_A, k_left)
    to_k_Acol = mm(tl.trans(d_A), kb_right)
    dG = (q_right.to(tl.float32) * to_q_P + kb_right.to(tl.float32) * to_k_Arow
          - k_left.to(tl.float32) * (to_k_P + to_k_Acol))
    return to_q_P, to_k_P, to_k_Arow, to_k_Acol, dG


@triton.jit
def _in_chunk_pair_grads(b_q, b_k, b_g, b_beta, b_dPs, b_dA, BT: tl.constexpr, BK: tl.constexpr,
                         LEVELS: tl.constexpr, WT: tl.constexpr, scratch, THROUGH_SCRATCH: tl.constexpr,
                         SPREAD: tl.constexpr, PAIRS: tl.constexpr):
    """The in-chunk pairs i > j, in one product where the gates allow it and level by
    level otherwise, for P (q_i, k_j) and A (k_i, k_j): the row
    side (rows i, factor e^{L}) and the column side (rows j, factor e^{R}). Returns their
    dq, dk (from P), dk (from A's rows and columns), their gate-carrying terms of dG, and
    the level sums L = G, R = G_C - G.

    In the one-product branch the dG terms are formed from the gated operands as rounded
    for the products: a pair (i, j) then enters its row side and its column side as the
    same number, and the pairs on one side of a row cancel exactly in dg's reverse cumsum;
    formed from q, k, each pair left the difference of two operand roundings in dg. The
    levels (strong decay) form them from q, k after the loop (see the comment there).
    ``PAIRS`` (bf16 work): ``"bf16"`` operands, or fp16 ones, each tile scaled by a power
    of two (``scaled_half``), for the score gradient's two products (``"fp16 scores"``: dPs,
    ``k e^{-G}``, ``q e^{G}``) or for all four (``"fp16"``). bf16 operands carry the
    gate-scaled values' roundings into dq, dk and dg; those of the score products weigh
    (chunk_kda's ``dg`` 1.23 -> 1.08 times the peer's error with either fp16 form, CPU
    emulation), A's products' do not, and each scaled tile costs a tile-wide reduction."""
    G, one_product = one_product_gates(b_g, SPREAD)
    if one_product:
        # every |G| <= SPREAD: all pairs in one product per term, rows e^{G}, columns e^{-G}
        row_factor = tl.exp(G)
        col_factor = tl.exp(-G)
        strict = tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :]
        if PAIRS != "bf16":
            # (names of their own: the levels' branch holds bf16 tiles under the same names)
            h_P, i_P = scaled_half(tl.where(strict, b_dPs.to(tl.float32), 0.0))
            h_kl, i_kl = scaled_half(b_k * col_factor)
            h_qr, i_qr = scaled_half(b_q * row_factor)
            to_q_P = tl.dot(h_P, h_kl) * (i_P * i_kl)
            to_k_P = tl.dot(tl.trans(h_P), h_qr) * (i_P * i_qr)
            kl_P = h_kl.to(tl.float32) * i_kl  # the operands as rounded, for dG
            if PAIRS == "fp16":
                h_A, i_A = scaled_half(tl.where(strict, b_dA.to(tl.float32), 0.0))
                h_kb, i_kb = scaled_half(b_k * (b_beta[:, None] * row_factor))
                to_k_Arow = tl.dot(h_A, h_kl) * (i_A * i_kl)
                to_k_Acol = tl.dot(tl.trans(h_A), h_kb) * (i_A * i_kb)
                kl_A = kl_P
                kb_A = h_kb.to(tl.float32) * i_kb
            else:
                k_left = (b_k * col_factor).to(WT)
                kb_right = (b_k * (b_beta[:, None] * row_factor)).to(WT)
                d_A = tl.where(strict, b_dA, 0.0).to(WT)
                to_k_Arow = mm(d_A, k_left)
                to_k_Acol = mm(tl.trans(d_A), kb_right)
                kl_A = k_left.to(tl.float32)
                kb_A = kb_right.to(tl.float32)
            dG_pairs = (h_qr.to(tl.float32) * i_qr * to_q_P + kb_A * to_k_Arow
                        - kl_P * to_k_P - kl_A * to_k_Acol)
        else:
            d_P = tl.where(strict, b_dPs, 0.0).to(WT)
            d_A = tl.where(strict, b_dA, 0.0).to(WT)
            k_left = (b_k * col_factor).to(WT)
            q_right = (b_q * row_factor).to(WT)
            kb_right = (b_k * (b_beta[:, None] * row_factor)).to(WT)
            to_q_P, to_k_P, to_k_Arow, to_k_Acol, dG_pairs = _pair_products(d_P, d_A, k_left, q_right, kb_right)
        dq_P = row_factor * to_q_P
        dk_P = col_factor * to_k_P
        dk_Arow = row_factor * to_k_Arow
        dk_Acol = col_factor * to_k_Acol
        b_L = G
        b_R = sums_after(b_g, G)
    else:
        dq_P = tl.zeros([BT, BK], dtype=tl.float32)
        dk_P = tl.zeros([BT, BK], dtype=tl.float32)
        dk_Arow = tl.zeros([BT, BK], dtype=tl.float32)
        dk_Acol = tl.zeros([BT, BK], dtype=tl.float32)
        b_L = b_g
        b_R = tl.zeros([BT, BK], dtype=tl.float32)
        for level in tl.static_range(LEVELS):
            right = right_half(level, BT)
            factor = tl.exp(tl.where(right, b_L, b_R))
            row_factor = tl.where(right, factor, 0.0)
            col_factor = tl.where(right, 0.0, factor)
            pairs = level_pairs(level, BT)
            d_P = tl.where(pairs, b_dPs, 0.0).to(WT)
            d_A = tl.where(pairs, b_dA, 0.0).to(WT)
            k_left = (b_k * col_factor).to(WT)
            q_right = (b_q * row_factor).to(WT)
            kb_right = (b_k * (b_beta[:, None] * row_factor)).to(WT)
            dq_P += row_factor * mm(d_P, k_left)
            dk_P += col_factor * mm(tl.trans(d_P), q_right)
            dk_Arow += row_factor * mm(d_A, k_left)
            dk_Acol += col_factor * mm(tl.trans(d_A), kb_right)
            b_L, b_R = next_level_sums(b_L, b_R, right, level, BT, BK, scratch, THROUGH_SCRATCH)
        # from q, k after the levels (a dG accumulator across them spilled 8x the bytes on sm90)
        dG_pairs = b_q * dq_P - b_k * dk_P + b_k * (dk_Arow * b_beta[:, None] - dk_Acol)
    return dq_P, dk_P, dk_Arow, dk_Acol, dG_pairs, b_L, b_R


@triton.jit
def kda_grad_keys_kernel(
    q, k, g, beta, L, h, dh, vn, dvn, do, rq, rk, dPs, dA,
    dq, dk, dg, scratch,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LEVELS: tl.constexpr,
    L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr,
    PAIRS: tl.constexpr,
):
    """One program per (chunk, value head, key block): dq, dk with respect to the
    (normalised) q, k of the recurrence, and dg. A key block per program, as GLA's
    backward: with a loop over key blocks the level-masked copies of dPs and dA, the same
    in every iteration, were hoisted out of it and overflowed shared memory. With
    THROUGH_SCRATCH the level sums' sibling totals go through the program's float32
    ``[BT, BK]`` tile of ``scratch`` instead of a gather."""
    NK: tl.constexpr = (K + BK - 1) // BK
    pid = tl.program_id(0).to(tl.int64)
    if THROUGH_SCRATCH:
        scratch += pid * (BT * BK)
    i_k = (pid % NK).to(tl.int32)
    i_hv, i_h, t0, slot, n_valid, rows, valid = chunk_head_program(
        pid // NK, cu_seqlens, chunk_map, T, H, HV, BT, IS_VARLEN)
    WT = L.dtype.element_ty
    qk_base = (t0 * H + i_h) * K
    g_base = (t0 * HV + i_hv) * K
    v_row0 = (t0 * HV + i_hv) * V
    m_row0 = (t0 * HV + i_hv) * BT

    b_beta = tl.load(beta + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    b_rq = tl.where(valid, 1.0, 0.0)
    b_rk = tl.where(valid, 1.0, 0.0)
    if L2NORM:
        b_rq = tl.load(rq + (t0 + rows) * H + i_h, mask=valid, other=0.0)
        b_rk = tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)
    b_Ld = rows_tile(L + m_row0, n_valid, HV * BT, BT, 0, BT, BT)
    b_dPs = rows_tile(dPs + m_row0, n_valid, HV * BT, BT, 0, BT, BT)
    b_dA = rows_tile(dA + m_row0, n_valid, HV * BT, BT, 0, BT, BT)
    b_dP_self = tl.sum(tl.where(rows[:, None] == rows[None, :], b_dPs.to(tl.float32), 0.0), axis=1)

    b_dqh, b_dUh, b_Udh, b_hdh = _inter_chunk_contractions(
        do + v_row0, vn + v_row0, dvn + v_row0, h + (slot * HV + i_hv) * K * V, dh + (slot * HV + i_hv) * K * V,
        n_valid, i_k, HV, K, V, BT, BK, BV, WT)
    b_q = _unit_rows(q + qk_base, n_valid, H, K, i_k * BK, b_rq, BT, BK)
    b_k = _unit_rows(k + qk_base, n_valid, H, K, i_k * BK, b_rk, BT, BK)
    b_g = rows_tile(g + g_base, n_valid, HV * K, K, i_k * BK, BT, BK).to(tl.float32)

    dq_P, dk_P, dk_Arow, dk_Acol, dG_pairs, b_L, b_R = _in_chunk_pair_grads(
        b_q, b_k, b_g, b_beta, b_dPs, b_dA, BT, BK, LEVELS, WT, scratch, THROUGH_SCRATCH, SPREAD, PAIRS)
    # L = G, R = G_C - G
    b_eG = tl.exp(b_L)
    dq_inter = b_dqh * b_eG * scale
    dk_in = -mm(tl.trans(b_Ld), b_dUh.to(WT)) * (b_beta[:, None] * b_eG)
    dk_out = b_Udh * tl.exp(b_R)

    # dG: every gate-carrying term, its row side + and its column side -, the diagonal of P
    # left out (no gate), the in-chunk pairs' as _in_chunk_pair_grads formed them; then
    # dg = reverse cumsum + the strict prefix of the next-state terms + e^{G_C} <h, dh>.
    b_dG = b_q * dq_inter + dG_pairs + b_k * dk_in
    b_dg = tl.cumsum(tl.where(valid[:, None], b_dG, 0.0), axis=0, reverse=True)
    b_dg += mm(tl.where(rows[:, None] > rows[None, :], 1.0, 0.0), b_k * dk_out)
    b_dg += (tl.exp(tl.sum(b_g, axis=0)) * b_hdh)[None, :]

    b_dq = dq_inter + dq_P + b_dP_self[:, None] * b_k
    b_dk = dk_P + b_dP_self[:, None] * b_q + dk_Arow * b_beta[:, None] + dk_Acol + dk_out + dk_in
    rows_tile_store(dq + g_base, b_dq, n_valid, HV * K, K, i_k * BK, BT, BK)
    rows_tile_store(dk + g_base, b_dk, n_valid, HV * K, K, i_k * BK, BT, BK)
    rows_tile_store(dg + g_base, b_dg, n_valid, HV * K, K, i_k * BK, BT, BK)
