"""Backward kernels of the chunked DPLR delta rule: reverse state pass, chunk gradients.

The derivation is in ``kernels/dplr/chunk.py``. Three launches:

1. ``state_bwd_kernel``, one program per (sequence, head, value block), walking the chunks
   backwards with dh (the gradient of the state leaving the chunk) in registers: stores dh
   per chunk, ``du = A_qb^T dO + Bg dh``, and d initial_state.
2. ``score_grad_kernel``, one program per (chunk, head): ``dY = L^T du``, dv, and the
   gradients of the four score matrices (their diagonal and sub-diagonal terms, whose
   gate factor is exactly 1, kept apart as fp32 vectors).
3. ``qkabg_grad_kernel``, one program per (chunk, head, key block): the inter-chunk terms,
   the levels for the intra-chunk ones, then dq, dk, da, db and dgk.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._arch import COMPILE_OPTIONS, launch_options
from .._chunk import (
    chunk_coords, chunk_span, load_state_pieces, mm, mm_acc, rows_tile, rows_tile_store, state_piece_load,
    store_state_pieces,
)
from .._gate_levels import (
    level_pairs, next_level_sums_with_exclusive, one_product_gates, one_product_spread, right_half, sums_after,
)
from .._utils import cdiv, empty
from .chunk_fwd import LEVELS, _decay_piece, load_chunk_rows


@triton.jit
def _state_grad_piece(b_dh, b_dec, qg_base, w_base, n_valid, i_p, b_do, b_du,
                      H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    """One [BKS, BV] piece of dh <- e^{G_C} dh + Qg^T dO + W^T du."""
    b_q = rows_tile(qg_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    b_w = rows_tile(w_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    return b_dh * b_dec[:, None] + mm(tl.trans(b_q), b_do) + mm(tl.trans(b_w), b_du)


@triton.jit
def _bg_dh(bg_base, n_valid, i_p, b_dh, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    b_bg = rows_tile(bg_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    return mm(b_bg, b_dh.to(b_bg.dtype))


@triton.jit
def state_bwd_kernel(
    qg, w, bg, A_qb, decay, do, dht, dh, du, dh0,
    cu_seqlens, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    """dh is held as NKS pieces of [BKS, BV] rows, as the forward state pass holds h."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = (pid % NV).to(tl.int32)
    i_nh = pid // NV
    i_h = i_nh % H
    bos, eos, slot0 = chunk_span(i_nh // H, cu_seqlens, T, BT, IS_VARLEN)
    DT = w.dtype.element_ty

    b_dh1, b_dh2, b_dh3, b_dh4 = load_state_pieces(dht, i_nh, i_v, K, V, BKS, NKS, BV, USE_DHT)
    NT = tl.cdiv(eos - bos, BT)
    for i_rev in range(0, NT):
        i_c = NT - 1 - i_rev
        t0 = bos + i_c * BT
        n_valid = tl.minimum(eos - t0, BT)
        row0 = t0 * H + i_h
        slot = slot0 + i_c
        store_state_pieces(dh + (slot * H + i_h) * K * V, b_dh1, b_dh2, b_dh3, b_dh4, i_v, K, V, BKS, NKS, BV)
        b_do = rows_tile(do + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        b_Aqb = rows_tile(A_qb + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
        # du = A_qb^T dO + Bg dh
        bg_base = bg + row0 * K
        b_du = mm(tl.trans(b_Aqb), b_do) + _bg_dh(bg_base, n_valid, 0, b_dh1, H, K, BT, BKS)
        if NKS > 1:
            b_du += _bg_dh(bg_base, n_valid, 1, b_dh2, H, K, BT, BKS)
        if NKS > 2:
            b_du += _bg_dh(bg_base, n_valid, 2, b_dh3, H, K, BT, BKS)
            b_du += _bg_dh(bg_base, n_valid, 3, b_dh4, H, K, BT, BKS)
        rows_tile_store(du + row0 * V, b_du, n_valid, H * V, V, i_v * BV, BT, BV)
        b_dud = b_du.to(DT)
        qg_base = qg + row0 * K
        w_base = w + row0 * K
        b_dh1 = _state_grad_piece(b_dh1, _decay_piece(decay, slot, i_h, 0, H, K, BKS), qg_base, w_base, n_valid, 0,
                                  b_do, b_dud, H, K, BT, BKS)
        if NKS > 1:
            b_dh2 = _state_grad_piece(b_dh2, _decay_piece(decay, slot, i_h, 1, H, K, BKS), qg_base, w_base, n_valid,
                                      1, b_do, b_dud, H, K, BT, BKS)
        if NKS > 2:
            b_dh3 = _state_grad_piece(b_dh3, _decay_piece(decay, slot, i_h, 2, H, K, BKS), qg_base, w_base, n_valid,
                                      2, b_do, b_dud, H, K, BT, BKS)
            b_dh4 = _state_grad_piece(b_dh4, _decay_piece(decay, slot, i_h, 3, H, K, BKS), qg_base, w_base, n_valid,
                                      3, b_do, b_dud, H, K, BT, BKS)
    if STORE_DH0:
        store_state_pieces(dh0 + i_nh * K * V, b_dh1, b_dh2, b_dh3, b_dh4, i_v, K, V, BKS, NKS, BV)


@triton.jit
def score_grad_kernel(
    do, u, v, du, kg, dh, A_qk, Lmat, M, dY, dv, dA_qk, dA_qb, dA_ak, dA_ab, dA_unit,
    cu_seqlens, chunk_map, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """dY = L^T du; dv = A_qk^T dO + M^T du + Kg dh; the score gradients
    dA_qk = dO v^T, dA_qb = dO u^T, dA_ak = dY v^T, dA_ab = dY u^T."""
    pid = tl.program_id(0).to(tl.int64)
    i_chunk = pid // H
    i_h = pid % H
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    row0 = t0 * H + i_h
    DT = kg.dtype.element_ty
    rows = tl.arange(0, BT)
    dh_base = dh + (slot * H + i_h) * K * V

    b_dqk = tl.zeros([BT, BT], dtype=tl.float32)
    b_dqb = tl.zeros([BT, BT], dtype=tl.float32)
    b_dak = tl.zeros([BT, BT], dtype=tl.float32)
    b_dab = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = rows_tile(do + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        b_u = rows_tile(u + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV)
        b_v = rows_tile(v + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        b_du = rows_tile(du + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV)
        # loaded per value block: held across the loop, the three [BT, BT] operands (and the
        # split halves of fp32 ones) overflow the 100 KB parts' shared memory
        b_L = rows_tile(Lmat + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
        b_M = rows_tile(M + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
        b_Aqk = rows_tile(A_qk + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
        b_dY = mm(tl.trans(b_L), b_du).to(DT)
        rows_tile_store(dY + row0 * V, b_dY, n_valid, H * V, V, i_v * BV, BT, BV)
        b_dqk += mm(b_do, tl.trans(b_v))
        b_dqb += mm(b_do, tl.trans(b_u))
        b_dak += mm(b_dY, tl.trans(b_v))
        b_dab += mm(b_dY, tl.trans(b_u))
        b_dv = mm(tl.trans(b_Aqk), b_do) + mm(tl.trans(b_M), b_du)
        for i_k in range(tl.cdiv(K, BK)):
            b_kg = rows_tile(kg + row0 * K, n_valid, H * K, K, i_k * BK, BT, BK)
            b_dv += mm(b_kg, state_piece_load(dh_base, i_k, i_v, K, V, BK, BV).to(DT))
        rows_tile_store(dv + row0 * V, b_dv, n_valid, H * V, V, i_v * BV, BT, BV)

    # The pairs whose gate factor is exactly e^0 = 1 (the diagonal of the inclusive
    # scores, the sub-diagonal of the exclusive ones) are kept apart in fp32: their terms
    # cancel exactly in the gate gradient, which leaves them out (kernels/dplr/chunk.py).
    eye = rows[:, None] == rows[None, :]
    sub = rows[:, None] == rows[None, :] + 1
    strict = rows[:, None] > rows[None, :]
    unit = dA_unit + (t0 + rows) * (H * 4) + i_h * 4
    valid = rows < n_valid
    tl.store(unit, tl.sum(tl.where(eye, b_dqk, 0.0), axis=1), mask=valid)
    tl.store(unit + 1, tl.sum(tl.where(eye, b_dqb, 0.0), axis=1), mask=valid)
    tl.store(unit + 2, tl.sum(tl.where(sub, b_dak, 0.0), axis=1), mask=valid)
    tl.store(unit + 3, tl.sum(tl.where(sub, b_dab, 0.0), axis=1), mask=valid)
    rows_tile_store(dA_qk + row0 * BT, tl.where(strict, b_dqk, 0.0), n_valid, H * BT, BT, 0, BT, BT)
    rows_tile_store(dA_qb + row0 * BT, tl.where(strict, b_dqb, 0.0), n_valid, H * BT, BT, 0, BT, BT)
    rows_tile_store(dA_ak + row0 * BT, tl.where(strict & ~sub, b_dak, 0.0), n_valid, H * BT, BT, 0, BT, BT)
    rows_tile_store(dA_ab + row0 * BT, tl.where(strict & ~sub, b_dab, 0.0), n_valid, H * BT, BT, 0, BT, BT)


@triton.jit
def _inter_chunk_grads(do, u, v, dY, h_base, dh_base, row0, n_valid, i_k,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, DT: tl.constexpr):
    """The inter-chunk terms of one key block, over the value blocks: the gradients of the
    gated operands Qg, Ag (through the chunk's incoming state h) and Bg, Kg (through its
    gradient dh), and sum_v h dh per key channel."""
    b_dqg = tl.zeros([BT, BK], dtype=tl.float32)
    b_dag = tl.zeros([BT, BK], dtype=tl.float32)
    b_dbg = tl.zeros([BT, BK], dtype=tl.float32)
    b_dkg = tl.zeros([BT, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = rows_tile(do + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        b_dY = rows_tile(dY + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV)
        b_u = rows_tile(u + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV)
        b_v = rows_tile(v + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        b_h = state_piece_load(h_base, i_k, i_v, K, V, BK, BV)
        b_dh = state_piece_load(dh_base, i_k, i_v, K, V, BK, BV)
        b_dqg += mm(b_do, tl.trans(b_h))
        b_dag += mm(b_dY, tl.trans(b_h))
        b_dbg += mm(b_u, tl.trans(b_dh))
        b_dkg += mm(b_v, tl.trans(b_dh))
        b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    return b_dqg, b_dag, b_dbg, b_dkg, b_hdh


@triton.jit
def _unit_pair_grads(dA_unit, t0, i_h, n_valid, b_q, b_k, b_a, b_b, H: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr):
    """What the unit-factor pairs add to dq, da, dk, db: the diagonals of A_qk, A_qb and
    the sub-diagonals (i, i - 1) of A_ak, A_ab, which the level loop leaves out."""
    rows = tl.arange(0, BT)
    valid = rows < n_valid
    unit = dA_unit + (t0 + rows) * (H * 4) + i_h * 4
    d_qk_ii = tl.load(unit, mask=valid, other=0.0)
    d_qb_ii = tl.load(unit + 1, mask=valid, other=0.0)
    d_ak_sub = tl.load(unit + 2, mask=valid, other=0.0)
    d_ab_sub = tl.load(unit + 3, mask=valid, other=0.0)
    next_row = rows + 1 < n_valid
    d_ak_next = tl.load(unit + H * 4 + 2, mask=next_row, other=0.0)
    d_ab_next = tl.load(unit + H * 4 + 3, mask=next_row, other=0.0)
    prev = tl.broadcast_to(tl.maximum(rows - 1, 0)[:, None], (BT, BK))
    nxt = tl.broadcast_to(tl.minimum(rows + 1, BT - 1)[:, None], (BT, BK))
    b_a_next = tl.gather(b_a, nxt, axis=0)
    u_dq = d_qk_ii[:, None] * b_k + d_qb_ii[:, None] * b_b
    u_da = d_ak_sub[:, None] * tl.gather(b_k, prev, axis=0) + d_ab_sub[:, None] * tl.gather(b_b, prev, axis=0)
    u_dk = d_qk_ii[:, None] * b_q + d_ak_next[:, None] * b_a_next
    u_db = d_qb_ii[:, None] * b_q + d_ab_next[:, None] * b_a_next
    return u_dq, u_da, u_dk, u_db


@triton.jit
def _gate_grad(b_X, b_ada, b_Y, b_g, b_hdh, BT: tl.constexpr):
    """dgk_s = sum_{t >= s} X_t + sum_{t > s} (a da)_t + sum_{t < s} Y_t + e^{G_C} sum_v h dh,
    the sums over the chunk's rows as products with triangular masks."""
    rows = tl.arange(0, BT)
    from_later = (rows[:, None] <= rows[None, :]).to(tl.float32)
    after = (rows[:, None] < rows[None, :]).to(tl.float32)
    before = (rows[:, None] > rows[None, :]).to(tl.float32)
    b_dg = mm(from_later, b_X) + mm(after, b_ada) + mm(before, b_Y)
    return b_dg + (tl.exp(tl.sum(b_g, axis=0)) * b_hdh)[None, :]


@triton.jit
def _with_next_state_terms(b_k, b_b, b_dki, b_dbi, b_dkg, b_dbg, R):
    """dk, db with their terms through Kg, Bg (factor e^{G_C - G} = e^{R}), and those terms'
    share of dgk, ``k dk^inter + b db^inter``."""
    e_R = tl.exp(R)
    dk_inter = b_dkg * e_R
    db_inter = b_dbg * e_R
    return b_dki + dk_inter, b_dbi + db_inter, b_k * dk_inter + b_b * db_inter


@triton.jit
def qkabg_grad_kernel(
    q, k, a, b, gk, do, u, v, dY, h, dh, dA_qk, dA_qb, dA_ak, dA_ab, dA_unit,
    dq, dk, da, db, dg, scratch,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr, SPLIT_DQK: tl.constexpr,
):
    NK: tl.constexpr = (K + BK - 1) // BK
    pid = tl.program_id(0).to(tl.int64)
    if THROUGH_SCRATCH:  # the level sums' sibling totals through the program's [BT, BK] tile
        scratch += pid * (BT * BK)
    i_k = (pid % NK).to(tl.int32)
    i_chunk = (pid // NK) // H
    i_h = (pid // NK) % H
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    row0 = t0 * H + i_h
    DT = dA_qb.dtype.element_ty
    b_dqg, b_dag, b_dbg, b_dkg, b_hdh = _inter_chunk_grads(
        do, u, v, dY, h + (slot * H + i_h) * K * V, dh + (slot * H + i_h) * K * V, row0, n_valid, i_k,
        H, K, V, BT, BK, BV, DT)

    b_q, b_k, b_a, b_b, b_g = load_chunk_rows(q, k, a, b, gk, row0, n_valid, i_k * BK, scale, H, K, BT, BK)
    b_dAqk = rows_tile(dA_qk + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)  # fp32
    b_dAqb = rows_tile(dA_qb + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
    b_dAak = rows_tile(dA_ak + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
    b_dAab = rows_tile(dA_ab + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)

    # intra-chunk terms (unit-factor pairs left out), in one product per term where the
    # gates allow it and level by level otherwise, as in the forward
    G, one_product = one_product_gates(b_g, SPREAD)
    if one_product:
        strict = tl.arange(0, BT)[:, None] > tl.arange(0, BT)[None, :]
        L = G
        Lx = G - b_g
        R = sums_after(b_g, G)
        eL = tl.exp(L)
        eLx = tl.exp(Lx)
        e_col = tl.exp(-G)
        q_s = (b_q * eL).to(DT)
        a_s = (b_a * eLx).to(DT)
        k_s = (b_k * e_col).to(DT)
        b_s = (b_b * e_col).to(DT)
        d_qk = tl.where(strict, b_dAqk, 0.0)
        d_qk_hi = d_qk.to(DT)
        to_q = mm(d_qk_hi, k_s)
        to_k = mm(tl.trans(d_qk_hi), q_s)
        if SPLIT_DQK:
            # dA_qk = dO V^T as hi + lo 16-bit parts: its one rounding was dq's and dk's
            # largest error term (the q-k pairs carry most of both); two more products
            d_qk_lo = (d_qk - d_qk_hi.to(tl.float32)).to(DT)
            to_q = mm_acc(d_qk_lo, k_s, to_q)
            to_k = mm_acc(tl.trans(d_qk_lo), q_s, to_k)
        d_qb = tl.where(strict, b_dAqb, 0.0).to(DT)
        d_ak = tl.where(strict, b_dAak, 0.0).to(DT)
        d_ab = tl.where(strict, b_dAab, 0.0).to(DT)
        to_q = mm_acc(d_qb, b_s, to_q)
        to_k = mm_acc(tl.trans(d_ak), a_s, to_k)
        to_a = mm(d_ak, k_s) + mm(d_ab, b_s)
        to_b = mm(tl.trans(d_qb), q_s) + mm(tl.trans(d_ab), a_s)
        # dgk's intra-chunk terms from the operands as rounded for the products (see below);
        # the inter-chunk terms of dq, da joined here, where their factors are at hand (fewer
        # tiles live past the branch: less spilled)
        b_dqg = b_dqg * eL
        b_dag = b_dag * eLx
        x_gate = b_q * b_dqg + q_s.to(tl.float32) * to_q - k_s.to(tl.float32) * to_k - b_s.to(tl.float32) * to_b
        ada_gate = b_a * b_dag + a_s.to(tl.float32) * to_a
        b_dq = b_dqg + eL * to_q
        b_da = b_dag + eLx * to_a
        b_dk, b_db, y_gate = _with_next_state_terms(b_k, b_b, e_col * to_k, e_col * to_b, b_dkg, b_dbg, R)
    else:
        b_dqi = tl.zeros([BT, BK], dtype=tl.float32)
        b_dai = tl.zeros([BT, BK], dtype=tl.float32)
        b_dki = tl.zeros([BT, BK], dtype=tl.float32)
        b_dbi = tl.zeros([BT, BK], dtype=tl.float32)
        L = b_g
        Lx = tl.zeros([BT, BK], dtype=tl.float32)
        R = tl.zeros([BT, BK], dtype=tl.float32)
        dAqk_w = b_dAqk.to(DT)  # the levels take it in one part
        for level in range(LEVELS):
            right = right_half(level, BT)
            pairs = level_pairs(level, BT)
            eL = tl.exp(L)
            eLx = tl.exp(Lx)
            eR = tl.exp(R)
            q_s = tl.where(right, b_q * eL, 0.0).to(DT)
            a_s = tl.where(right, b_a * eLx, 0.0).to(DT)
            k_s = tl.where(right, 0.0, b_k * eR).to(DT)
            b_s = tl.where(right, 0.0, b_b * eR).to(DT)
            d_qk = tl.where(pairs, dAqk_w, 0.0)
            d_qb = tl.where(pairs, b_dAqb, 0.0).to(DT)
            d_ak = tl.where(pairs, b_dAak, 0.0).to(DT)
            d_ab = tl.where(pairs, b_dAab, 0.0).to(DT)
            to_q = mm(d_qk, k_s) + mm(d_qb, b_s)
            to_a = mm(d_ak, k_s) + mm(d_ab, b_s)
            to_k = mm(tl.trans(d_qk), q_s) + mm(tl.trans(d_ak), a_s)
            to_b = mm(tl.trans(d_qb), q_s) + mm(tl.trans(d_ab), a_s)
            b_dqi += tl.where(right, eL, 0.0) * to_q
            b_dai += tl.where(right, eLx, 0.0) * to_a
            b_dki += tl.where(right, 0.0, eR) * to_k
            b_dbi += tl.where(right, 0.0, eR) * to_b
            L, Lx, R = next_level_sums_with_exclusive(L, Lx, R, right, level, BT, BK, scratch, THROUGH_SCRATCH)
        # L = G, Lx = G^-, R = G_C - G; from q, k, a, b after the levels (two more
        # accumulators across them made the kernel spill twice the bytes on sm90)
        b_dq = b_dqg * tl.exp(L) + b_dqi
        b_da = b_dag * tl.exp(Lx) + b_dai
        x_gate = b_q * b_dq - b_k * b_dki - b_b * b_dbi
        ada_gate = b_a * b_da
        b_dk, b_db, y_gate = _with_next_state_terms(b_k, b_b, b_dki, b_dbi, b_dkg, b_dbg, R)

    # In the one-product branch the intra-chunk terms of dgk (x_gate, ada_gate) are formed
    # from the gated operands as rounded for the products, not from q, k, a, b: a pair
    # (i, j) then enters the q dq and k dk (a da and k dk, ...) terms as the same number,
    # and the pairs on one side of a row cancel exactly in the sum; from the unrounded
    # operands each pair left the difference of two operand roundings in dgk.
    b_dg = _gate_grad(x_gate, ada_gate, y_gate, b_g, b_hdh, BT)

    u_dq, u_da, u_dk, u_db = _unit_pair_grads(dA_unit, t0, i_h, n_valid, b_q, b_k, b_a, b_b, H, BT, BK)
    b_dq += u_dq
    b_da += u_da
    b_dk += u_dk
    b_db += u_db

    col0 = i_k * BK
    rows_tile_store(dq + row0 * K, b_dq * scale, n_valid, H * K, K, col0, BT, BK)
    rows_tile_store(dk + row0 * K, b_dk, n_valid, H * K, K, col0, BT, BK)
    rows_tile_store(da + row0 * K, b_da, n_valid, H * K, K, col0, BT, BK)
    rows_tile_store(db + row0 * K, b_db, n_valid, H * K, K, col0, BT, BK)
    rows_tile_store(dg + row0 * K, b_dg, n_valid, H * K, K, col0, BT, BK)


def chunk_bwd(q, k, v, a, b, gk, scale, initial_state, do, dht, cu_seqlens, chunk_map, num_seqs, saved, cfg):
    """Launch the backward kernels; returns ``(dq, dk, dv, da, db, dgk, d_initial_state)``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = cfg.BT
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * cdiv(T, BT)
    dev, wt = q.device, cfg.work
    flags = dict(IS_VARLEN=varlen)
    h = saved["h"]

    dh = empty(h.shape, wt, dev)
    du = empty((B, T, H, V), wt, dev)
    dh0 = empty(initial_state.shape, initial_state.dtype, dev) if initial_state is not None else None
    if num_seqs * H > 0:
        state_bwd_kernel[(num_seqs * H * cdiv(V, cfg.state_BV),)](
            saved["qg"], saved["w"], saved["bg"], saved["A_qb"], saved["decay"], do, dht, dh, du, dh0,
            cu_seqlens, T, H=H, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.NKS, BV=cfg.state_BV,
            USE_DHT=dht is not None, STORE_DH0=dh0 is not None,
            num_warps=cfg.state_warps, num_stages=cfg.state_stages, **flags, **COMPILE_OPTIONS,
        )

    dv = empty(v.shape, v.dtype, dev)
    dY = empty((B, T, H, V), wt, dev)
    # dA_qk in fp32: the gradient kernel takes it as two 16-bit parts (SPLIT_DQK)
    dA = [empty((B, T, H, BT), torch.float32 if i == 0 else wt, dev) for i in range(4)]
    dA_unit = empty((B, T, H, 4), torch.float32, dev)
    dq, dk, da, db = (empty(t.shape, t.dtype, dev) for t in (q, k, a, b))
    dg = empty(gk.shape, gk.dtype, dev)
    if n_chunks > 0:
        score_grad_kernel[(n_chunks * H,)](
            do, saved["u"], v, du, saved["kg"], dh, saved["A_qk"], saved["L"], saved["M"], dY, dv, *dA, dA_unit,
            cu_seqlens, chunk_map, T, H=H, K=K, V=V, BT=BT, BK=cfg.score_BK, BV=cfg.score_BV,
            **flags, **launch_options(cfg.score_warps, 1, cfg.score_maxnreg),
        )
        n_programs = n_chunks * H * cdiv(K, cfg.grad_BK)
        through = cfg.grad_siblings == "scratch"
        scratch = empty((n_programs, BT, cfg.grad_BK), torch.float32, dev) if through else None
        qkabg_grad_kernel[(n_programs,)](
            q, k, a, b, gk, do, saved["u"], v, dY, h, dh, *dA, dA_unit, dq, dk, da, db, dg, scratch,
            cu_seqlens, chunk_map, T, scale, H=H, K=K, V=V, BT=BT, BK=cfg.grad_BK, BV=cfg.grad_BV,
            THROUGH_SCRATCH=through, SPREAD=one_product_spread(wt), SPLIT_DQK=wt != torch.float32,
            **flags, **launch_options(cfg.grad_warps, 1, cfg.grad_maxnreg),
        )
    return dq, dk, dv, da, db, dg, dh0
