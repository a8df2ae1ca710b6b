"""Backward kernels of the chunked (gated) delta rule: reverse state pass, chunk gradients.

The derivation is in ``kernels/delta_rule/chunk.py``. Two or three launches:

1. ``state_grad_kernel``, one program per (sequence, value head, value block), walking the
   chunks backwards with dh (the gradient of the state leaving the chunk) in registers:
   stores dh per chunk and the gradient of the pseudo-values, and d initial_state.
2. ``chunk_grad_kernel``, one program per (chunk, value head): dv, dbeta, dg, and dq, dk
   with respect to the (normalised) q, k of the recurrence. Its parts: a pass over value
   blocks (``_value_pass``: dv, dT, dP), the chunk's [BT, BT] gradients from those
   (``_chunk_matrix_grads``), a pass over key blocks (``_key_block_grads``: dq, dk) and
   the gate gradient (``_gate_grad``).
3. ``qk_grad_finalize_kernel``, only for grouped value heads or
   ``use_qk_l2norm_in_kernel``: sums dq, dk over the value heads of each key head and
   takes them back through the l2 norm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._arch import COMPILE_OPTIONS
from .._utils import empty
from .._chunk import (
    chunk_coords, load_state_pieces, masked_exp, mm, rows_tile, rows_tile_store, state_piece_load, store_state_pieces,
)
from ._chunk_common import CHUNK, load_gate_chunk, state_program
from .chunk_fwd import piece_decay


@triton.jit
def _kd_dh(k_base, n_valid, i_p, b_kf, b_dh, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    """One key piece of (K * kf) dh."""
    b_k = rows_tile(k_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    return mm((b_k * b_kf[:, None]).to(b_k.dtype), b_dh.to(b_k.dtype))


@triton.jit
def _state_grad_piece_update(b_dh, q_base, w_base, n_valid, i_p, b_qf, b_do, b_dvnd, decay, chunk_scale,
                             H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                             BKS: tl.constexpr):
    """One [BKS, BV] piece of dh <- e^{G_C} dh + e^{G_0} ((Q qf)^T dO - W^T dU)."""
    b_q = rows_tile(q_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    b_w = rows_tile(w_base, n_valid, HV * K, K, i_p * BKS, BT, BKS)
    b_chunk = mm(tl.trans((b_q * b_qf[:, None]).to(b_q.dtype)), b_do) - mm(tl.trans(b_w), b_dvnd)
    return b_dh * decay + b_chunk * chunk_scale


@triton.jit
def state_grad_kernel(
    q, k, w, G, P, rq, rk, do, dht, dh, dvn, dh0,
    cu_seqlens, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, CHANNEL_DECAY: tl.constexpr = False, decay=None,
):
    """dh is held as NKS pieces of [BKS, BV] rows, as the forward state pass holds h.

    With CHANNEL_DECAY (kda) the operands carry their gates, as in the forward state pass:
    ``q`` is scale q ⊙ e^G and ``k`` is k ⊙ e^{G_C - G} ([B, T, HV, K], H = HV, scale 1),
    and ``decay`` each chunk's [K] e^{G_C}."""
    i_v, i_nh, i_hv, i_h, bos, eos, slot0, NT = state_program(cu_seqlens, T, H, HV, V, BT, BV, IS_VARLEN)
    rows = tl.arange(0, BT)
    DT = k.dtype.element_ty

    b_dh1, b_dh2, b_dh3, b_dh4 = load_state_pieces(dht, i_nh, i_v, K, V, BKS, NKS, BV, USE_DHT)
    for i_rev in range(0, NT):
        i_c = NT - 1 - i_rev
        t0 = bos + i_c * BT
        n_valid = tl.minimum(eos - t0, BT)
        valid = rows < n_valid
        q_base = q + (t0 * H + i_h) * K
        k_base = k + (t0 * H + i_h) * K
        w_base = w + (t0 * HV + i_hv) * K
        store_state_pieces(dh + ((slot0 + i_c) * HV + i_hv) * K * V, b_dh1, b_dh2, b_dh3, b_dh4, i_v, K, V, BKS, NKS, BV)

        # row factors: k_j -> k_j (rk_j) e^{G_C - G_j} for the state; q_i -> scale (rq_i) e^{G_i - G_0}
        b_kf = tl.where(valid, 1.0, 0.0)
        b_qf = tl.zeros([BT], dtype=tl.float32) + scale
        if L2NORM:
            b_kf = b_kf * tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)
            b_qf = b_qf * tl.load(rq + (t0 + rows) * H + i_h, mask=valid, other=0.0)
        chunk_decay = 1.0
        chunk_scale = 1.0
        if USE_G:
            b_G, b_G_last = load_gate_chunk(G, t0, n_valid, i_hv, HV, BT)
            b_G_first = tl.load(G + t0 * HV + i_hv)
            b_kf = b_kf * masked_exp(b_G_last - b_G, valid)
            b_qf = b_qf * masked_exp(b_G - b_G_first, valid)
            chunk_decay = tl.exp(b_G_last.to(tl.float32))
            # e^{G_0}, the chunk's first cumulative gate, comes out of the chunk's products
            # (W is stored as e^{-G_0} W), which keeps their fp16 operands from flushing to zero
            chunk_scale = tl.exp(b_G_first.to(tl.float32))

        # d(pseudo-values) = P^T dO + (K * e^{G_C - G}) dh, P = scale (Q K^T) * Gamma kept by the forward
        b_P = rows_tile(P + (t0 * HV + i_hv) * BT, n_valid, HV * BT, BT, 0, BT, BT)
        b_do = rows_tile(do + (t0 * HV + i_hv) * V, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_dvn = mm(tl.trans(b_P), b_do) + _kd_dh(k_base, n_valid, 0, b_kf, b_dh1, H, K, BT, BKS)
        if NKS > 1:
            b_dvn += _kd_dh(k_base, n_valid, 1, b_kf, b_dh2, H, K, BT, BKS)
        if NKS > 2:
            b_dvn += _kd_dh(k_base, n_valid, 2, b_kf, b_dh3, H, K, BT, BKS)
            b_dvn += _kd_dh(k_base, n_valid, 3, b_kf, b_dh4, H, K, BT, BKS)
        rows_tile_store(dvn + (t0 * HV + i_hv) * V, b_dvn, n_valid, HV * V, V, i_v * BV, BT, BV)

        # dh_c = e^{G_C} dh_{c+1} + scale (Q e^G)^T dO - W^T d(pseudo-values)
        b_dvnd = b_dvn.to(DT)
        slot_row = (slot0 + i_c) * HV + i_hv
        b_dh1 = _state_grad_piece_update(b_dh1, q_base, w_base, n_valid, 0, b_qf, b_do, b_dvnd,
                                         piece_decay(decay, slot_row, 0, chunk_decay, K, BKS, CHANNEL_DECAY),
                                         chunk_scale, H, HV, K, BT, BKS)
        if NKS > 1:
            b_dh2 = _state_grad_piece_update(b_dh2, q_base, w_base, n_valid, 1, b_qf, b_do, b_dvnd,
                                             piece_decay(decay, slot_row, 1, chunk_decay, K, BKS, CHANNEL_DECAY),
                                             chunk_scale, H, HV, K, BT, BKS)
        if NKS > 2:
            b_dh3 = _state_grad_piece_update(b_dh3, q_base, w_base, n_valid, 2, b_qf, b_do, b_dvnd,
                                             piece_decay(decay, slot_row, 2, chunk_decay, K, BKS, CHANNEL_DECAY),
                                             chunk_scale, H, HV, K, BT, BKS)
            b_dh4 = _state_grad_piece_update(b_dh4, q_base, w_base, n_valid, 3, b_qf, b_do, b_dvnd,
                                             piece_decay(decay, slot_row, 3, chunk_decay, K, BKS, CHANNEL_DECAY),
                                             chunk_scale, H, HV, K, BT, BKS)

    if STORE_DH0:
        store_state_pieces(dh0 + i_nh * K * V, b_dh1, b_dh2, b_dh3, b_dh4, i_v, K, V, BKS, NKS, BV)


@triton.jit
def _value_pass(v, do, vn, dvn, dv, k_base, h_base, v_row0, n_valid, b_kg, b_Ld, b_beta,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Phase 1, over value blocks: dT = dU' Vt^T with Vt = V - (K e^G) h, dP = dO U'^T;
    stores dv = diag(beta) L^T dU' (U' the pseudo-values). Returns (dT, dP)."""
    NK: tl.constexpr = (K + BK - 1) // BK
    NV: tl.constexpr = (V + BV - 1) // BV
    DT = k_base.dtype.element_ty
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dP = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(NV):
        b_vt = rows_tile(v + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV).to(tl.float32)
        b_do = rows_tile(do + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_vn = rows_tile(vn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_dvn = rows_tile(dvn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV).to(DT)
        for i_k in range(NK):
            b_k = rows_tile(k_base, n_valid, H * K, K, i_k * BK, BT, BK)
            b_h = state_piece_load(h_base, i_k, i_v, K, V, BK, BV)
            b_vt -= mm((b_k * b_kg[:, None]).to(DT), b_h)
        b_dT += mm(b_dvn, tl.trans(b_vt.to(DT)))
        b_dP += mm(b_do, tl.trans(b_vn))
        b_dv = mm(tl.trans(b_Ld), b_dvn) * b_beta[:, None]
        rows_tile_store(dv + v_row0, b_dv, n_valid, HV * V, V, i_v * BV, BT, BV)
    return b_dT, b_dP


@triton.jit
def _chunk_matrix_grads(b_dT, b_dP, b_Ld, b_beta, b_rq, b_rk, b_G, P_base, n_valid, scale,
                        HV: tl.constexpr, BT: tl.constexpr, USE_G: tl.constexpr):
    """From dT and dP, the chunk's [BT, BT] gradients: dbeta's T part, dG's P terms, and the
    dot operands of phase 2 (with the inverse norms of the k or q rows they multiply
    folded in). Returns (dbeta_T, dG, m_dq, m_dk1, m_dk4a, m_dk4b)."""
    DT = b_Ld.dtype
    rows = tl.arange(0, BT)
    valid = rows < n_valid
    causal = (rows[:, None] >= rows[None, :]) & valid[:, None]
    strict = (rows[:, None] > rows[None, :]) & valid[:, None]
    # Through T = L diag(beta), L = (I + A)^{-1}: dbeta_j += sum_i dT_ij L_ij,
    # dL = dT diag(beta), dA = -L^T dL L^T on the strictly lower part.
    b_dbeta_T = tl.sum(b_dT * b_Ld.to(tl.float32), axis=0)
    b_dA = -mm(mm(tl.trans(b_Ld), (b_dT * b_beta[None, :]).to(DT)).to(DT), tl.trans(b_Ld))
    if USE_G:
        decay = masked_exp(b_G[:, None] - b_G[None, :], causal)
    else:
        decay = tl.where(causal, 1.0, 0.0)
    b_Dp = tl.where(strict, b_dA * decay, 0.0)  # dA * Gamma: dA_ij / (beta_i k_i . k_j)
    b_dPs = b_dP * decay * scale  # dO U'^T * Gamma * scale: dP_ij / (q_i . k_j)
    b_dG = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        # The P terms of dG as row sum minus column sum of dP_ij P_ij over j < i: the
        # diagonal (no gate dependence) would cancel, but only up to rounding of O(1) terms.
        b_P = rows_tile(P_base, n_valid, HV * BT, BT, 0, BT, BT)
        b_M = tl.where(strict, b_dP * b_P.to(tl.float32), 0.0)
        b_dG += tl.sum(b_M, axis=1) - tl.sum(b_M, axis=0)
    m_dq = (b_dPs * b_rk[None, :]).to(DT)
    m_dk1 = (b_dPs * b_rq[:, None]).to(DT)
    m_dk4a = (b_Dp * b_rk[None, :]).to(DT)
    m_dk4b = (b_Dp * (b_beta * b_rk)[:, None]).to(DT)
    return b_dbeta_T, b_dG, m_dq, m_dk1, m_dk4a, m_dk4b


@triton.jit
def _key_block_grads(do, vn, dvn, h_base, dh_base, q_base, k_base, v_row0, n_valid, i_k, scale,
                     b_eG, b_eGC, b_beta, b_Ld, m_dq, m_dk1, m_dk4a, m_dk4b, b_hdh,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr):
    """Phase 2, one key block: dq and dk with respect to the q, k the recurrence sees
    (normalised under L2NORM), and the pieces the row dots for dbeta and dg need; adds
    this block's rows of h . dh to ``b_hdh``. Returns (dq, dk, dqh, dk2, dk3, dk4a, dk4b, q, k, hdh)."""
    NV: tl.constexpr = (V + BV - 1) // BV
    DT = k_base.dtype.element_ty
    b_dqh = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk2 = tl.zeros([BT, BK], dtype=tl.float32)
    for i_v in range(NV):
        b_do = rows_tile(do + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_vn = rows_tile(vn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_dvn = rows_tile(dvn + v_row0, n_valid, HV * V, V, i_v * BV, BT, BV).to(DT)
        b_h = state_piece_load(h_base, i_k, i_v, K, V, BK, BV)
        b_dh = state_piece_load(dh_base, i_k, i_v, K, V, BK, BV)
        b_dqh += mm(b_do, tl.trans(b_h))
        b_dw += mm(b_dvn, tl.trans(b_h))
        b_dk2 += mm(b_vn, tl.trans(b_dh))
        if USE_G:
            b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
    b_q = rows_tile(q_base, n_valid, H * K, K, i_k * BK, BT, BK)
    b_k = rows_tile(k_base, n_valid, H * K, K, i_k * BK, BT, BK)

    b_dqh = b_dqh * (scale * b_eG)[:, None]
    b_dq = b_dqh + mm(m_dq, b_k)
    b_dk1 = mm(tl.trans(m_dk1), b_q)
    b_dk2 = b_dk2 * b_eGC[:, None]
    b_dk3 = mm(tl.trans(b_Ld), b_dw.to(DT)) * (b_beta * b_eG)[:, None]
    b_dk4a = mm(m_dk4a, b_k)
    b_dk4b = mm(tl.trans(m_dk4b), b_k)
    b_dk = b_dk1 + b_dk2 - b_dk3 + b_dk4a * b_beta[:, None] + b_dk4b
    return b_dq, b_dk, b_dqh, b_dk2, b_dk3, b_dk4a, b_dk4b, b_q, b_k, b_hdh


@triton.jit
def _gate_grad(b_dG, b_kdk2, b_hdh, b_G_last, valid, rows):
    """dg from the gradient of the chunk-local cumsum G of g.

    G is a chunk-local cumsum of g: dg_t = sum_{s >= t} dG_s. The next-state decay
    e^{G_C - G_i} depends on g_t for i < t <= C: an exclusive prefix sum, formed
    directly rather than as a difference of sums. e^{G_C} <dh, h> reaches every g_t."""
    b_dg = tl.cumsum(tl.where(valid, b_dG, 0.0), axis=0, reverse=True)
    b_dg += tl.sum(tl.where(rows[:, None] < rows[None, :], b_kdk2[:, None], 0.0), axis=0)
    b_dg += tl.exp(b_G_last.to(tl.float32)) * tl.sum(b_hdh, axis=0)
    return b_dg


@triton.jit
def chunk_grad_kernel(
    q, k, v, G, beta, L, P, h, dh, vn, dvn, do, rq, rk,
    dq, dk, dv, dbeta, dg,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    NK: tl.constexpr = (K + BK - 1) // BK
    pid = tl.program_id(0).to(tl.int64)
    i_chunk = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    rows = tl.arange(0, BT)
    valid = rows < n_valid
    h_base = h + (slot * HV + i_hv) * K * V
    dh_base = dh + (slot * HV + i_hv) * K * V

    b_beta = tl.load(beta + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    b_rq = tl.where(valid, 1.0, 0.0)
    b_rk = tl.where(valid, 1.0, 0.0)
    if L2NORM:
        b_rq = tl.load(rq + (t0 + rows) * H + i_h, mask=valid, other=0.0)
        b_rk = tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)
    if USE_G:
        b_G, b_G_last = load_gate_chunk(G, t0, n_valid, i_hv, HV, BT)
        b_eG = tl.where(valid, tl.exp(b_G.to(tl.float32)), 0.0)
        b_eGC = masked_exp(b_G_last - b_G, valid)
    else:
        b_G = tl.zeros([BT], dtype=tl.float32)  # unused
        b_eG = tl.where(valid, 1.0, 0.0)
        b_eGC = b_eG
    b_Ld = rows_tile(L + (t0 * HV + i_hv) * BT, n_valid, HV * BT, BT, 0, BT, BT)
    q_base = q + (t0 * H + i_h) * K
    k_base = k + (t0 * H + i_h) * K
    v_row0 = (t0 * HV + i_hv) * V  # first element of this chunk's rows in v, do, vn, dvn, dv

    b_dT, b_dP = _value_pass(v, do, vn, dvn, dv, k_base, h_base, v_row0, n_valid, b_rk * b_eG, b_Ld, b_beta,
                             H, HV, K, V, BT, BK, BV)

    b_dbeta_T, b_dG, m_dq, m_dk1, m_dk4a, m_dk4b = _chunk_matrix_grads(
        b_dT, b_dP, b_Ld, b_beta, b_rq, b_rk, b_G, P + (t0 * HV + i_hv) * BT, n_valid, scale, HV, BT, USE_G)

    # Phase 2, over key blocks: dq, dk; row dots for dbeta and dg.
    b_dbeta_A = tl.zeros([BT], dtype=tl.float32)
    b_kdk2 = tl.zeros([BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    for i_k in range(NK):
        b_dq, b_dk, b_dqh, b_dk2, b_dk3, b_dk4a, b_dk4b, b_q, b_k, b_hdh = _key_block_grads(
            do, vn, dvn, h_base, dh_base, q_base, k_base, v_row0, n_valid, i_k, scale,
            b_eG, b_eGC, b_beta, b_Ld, m_dq, m_dk1, m_dk4a, m_dk4b, b_hdh, H, HV, K, V, BT, BK, BV, USE_G)
        b_kn = b_k.to(tl.float32) * b_rk[:, None]
        b_dbeta_A += tl.sum(b_kn * b_dk4a, axis=1)
        if USE_G:
            b_qn = b_q.to(tl.float32) * b_rq[:, None]
            b_kdk2 += tl.sum(b_kn * b_dk2, axis=1)
            b_dG += tl.sum(b_qn * b_dqh, axis=1) - tl.sum(b_kn * (b_dk3 + b_dk4b - b_dk4a * b_beta[:, None]), axis=1)
        rows_tile_store(dq + (t0 * HV + i_hv) * K, b_dq, n_valid, HV * K, K, i_k * BK, BT, BK)
        rows_tile_store(dk + (t0 * HV + i_hv) * K, b_dk, n_valid, HV * K, K, i_k * BK, BT, BK)

    tl.store(dbeta + (t0 + rows) * HV + i_hv, b_dbeta_T + b_dbeta_A, mask=valid)
    if USE_G:
        tl.store(dg + (t0 + rows) * HV + i_hv, _gate_grad(b_dG, b_kdk2, b_hdh, b_G_last, valid, rows), mask=valid)


@triton.jit
def qk_grad_finalize_kernel(
    q, k, rq, rk, dq_part, dk_part, dq, dk, n_tokens,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    BTOK: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr,
):
    """Sum the per-value-head dq, dk of each key head; under L2NORM, dx = r (dy - y (y . dy))."""
    pid = tl.program_id(0).to(tl.int64)
    i_t = pid // H
    i_h = pid % H
    toks = i_t * BTOK + tl.arange(0, BTOK)
    cols = tl.arange(0, BK)
    mask = (toks < n_tokens)[:, None] & (cols < K)[None, :]
    part = (toks[:, None] * HV + i_h * (HV // H)) * K + cols[None, :]
    out = (toks[:, None] * H + i_h) * K + cols[None, :]
    b_dq = tl.zeros([BTOK, BK], dtype=tl.float32)
    b_dk = tl.zeros([BTOK, BK], dtype=tl.float32)
    for j in range(HV // H):
        b_dq += tl.load(dq_part + part + j * K, mask=mask, other=0.0)
        b_dk += tl.load(dk_part + part + j * K, mask=mask, other=0.0)
    if L2NORM:
        b_rq = tl.load(rq + toks * H + i_h, mask=toks < n_tokens, other=0.0)
        b_rk = tl.load(rk + toks * H + i_h, mask=toks < n_tokens, other=0.0)
        b_yq = tl.load(q + out, mask=mask, other=0.0).to(tl.float32) * b_rq[:, None]
        b_yk = tl.load(k + out, mask=mask, other=0.0).to(tl.float32) * b_rk[:, None]
        b_dq = (b_dq - b_yq * tl.sum(b_yq * b_dq, axis=1)[:, None]) * b_rq[:, None]
        b_dk = (b_dk - b_yk * tl.sum(b_yk * b_dk, axis=1)[:, None]) * b_rk[:, None]
    tl.store(dq + out, b_dq.to(dq.dtype.element_ty), mask=mask)
    tl.store(dk + out, b_dk.to(dk.dtype.element_ty), mask=mask)


def chunk_bwd(q, k, v, g, beta, scale, initial_state, do, dht, cu_seqlens, chunk_map, num_seqs,
              l2norm, saved, cfg):
    """Launch the backward kernels; returns ``(dq, dk, dv, dg, dbeta, d_initial_state)``."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * triton.cdiv(T, BT)
    use_g = g is not None
    dt = q.dtype
    flags = dict(USE_G=use_g, L2NORM=l2norm, IS_VARLEN=varlen)
    h = saved["h"]

    dh = empty(h.shape, dt, q.device)
    dvn = empty((B, T, HV, V), dt, q.device)
    dh0 = empty(initial_state.shape, initial_state.dtype, q.device) if initial_state is not None else None
    state_grad_kernel[(num_seqs * HV * triton.cdiv(V, cfg.state_grad_BV),)](
        q, k, saved["w"], saved["G"], saved["P"], saved["rq"], saved["rk"], do, dht, dh, dvn, dh0,
        cu_seqlens, T, scale,
        H=H, HV=HV, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.BK_full // cfg.BKS, BV=cfg.state_grad_BV,
        USE_DHT=dht is not None, STORE_DH0=dh0 is not None,
        num_warps=cfg.state_grad_warps, num_stages=cfg.state_grad_stages, **flags, **COMPILE_OPTIONS,
    )

    direct = HV == H and not l2norm  # dq, dk need neither a head sum nor the norm's backward
    qk_dtype = dt if direct else torch.float32
    dq_heads = empty((B, T, HV, K), qk_dtype, q.device)
    dk_heads = empty((B, T, HV, K), qk_dtype, q.device)
    dv = empty(v.shape, v.dtype, q.device)
    dbeta = empty(beta.shape, beta.dtype, q.device)
    dg = empty(g.shape, g.dtype, q.device) if use_g else None
    if n_chunks > 0:
        chunk_grad_kernel[(n_chunks * HV,)](
            q, k, v, saved["G"], beta, saved["L"], saved["P"], h, dh, saved["vn"], dvn, do, saved["rq"], saved["rk"],
            dq_heads, dk_heads, dv, dbeta, dg,
            cu_seqlens, chunk_map, T, scale,
            H=H, HV=HV, K=K, V=V, BT=BT, BK=cfg.grad_BK, BV=cfg.grad_BV,
            num_warps=cfg.grad_warps, num_stages=cfg.grad_stages, **flags, **COMPILE_OPTIONS,
        )
    if direct:
        dq, dk = dq_heads, dk_heads
    else:
        dq, dk = empty(q.shape, dt, q.device), empty(k.shape, dt, q.device)
        n_tokens = B * T
        BTOK = 32 if cfg.BK_full <= 128 else 16
        if n_tokens > 0:
            qk_grad_finalize_kernel[(triton.cdiv(n_tokens, BTOK) * H,)](
                q, k, saved["rq"], saved["rk"], dq_heads, dk_heads, dq, dk, n_tokens,
                H=H, HV=HV, K=K, BTOK=BTOK, BK=cfg.BK_full, L2NORM=l2norm, num_warps=4, **COMPILE_OPTIONS,
            )
    return dq, dk, dv, dg, dbeta, dh0
