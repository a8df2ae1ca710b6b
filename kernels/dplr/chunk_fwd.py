"""Forward kernels of the chunked DPLR delta rule: intra-chunk prepare, state pass, output.

The math is in ``kernels/dplr/chunk.py``. Three launches:

1. ``intra_fwd_kernel``, one program per (chunk, head): the four gated score matrices by
   levels (``kernels._gate_levels``), the gate-scaled operands ``Qg = scale q e^{G}``,
   ``Kg = k e^{G_C - G}``, ``Bg = b e^{G_C - G}``, ``Ag = a e^{G^-}``, the chunk decay
   ``e^{G_C}``, ``L = (I - A_ab)^{-1}``, ``W = L Ag``, ``M = L A_ak``, ``U~ = M V``.
2. ``state_fwd_kernel``, one program per (sequence, head, value block), walking the chunks
   in order with the [K, BV] state in registers: stores each chunk's incoming state h and
   the pseudo-values ``u = U~ + W h``.
3. ``output_fwd_kernel``, one program per (chunk, head, value block):
   ``o = Qg h + A_qb u + A_qk v``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._arch import COMPILE_OPTIONS, launch_options
from .._chunk import (
    chunk_coords, chunk_span, load_state_pieces, mm, rows_tile, rows_tile_store, rows_tile_t, state_piece_load,
    store_state_pieces,
)
from .. import _gate_levels
from .._gate_levels import (
    level_pairs, next_level_sums_with_exclusive, one_product_gates, one_product_spread, right_half, sums_after,
)
from .._sequence import state_slots
from .._triangular import unit_lower_inverse
from .._utils import cdiv, empty

LEVELS = tl.constexpr(_gate_levels.LEVELS)  # log2 of the chunk length


@triton.jit
def level_operands(x_row, x_row_excl, y_col, L, Lx, R, right):
    """One level's gate-scaled operands: rows i (right half) scaled by ``e^{L}`` (``e^{Lx}``
    for the exclusive ones), columns j (left half) by ``e^{R}``, zero elsewhere."""
    return (tl.where(right, x_row * tl.exp(L), 0.0), tl.where(right, x_row_excl * tl.exp(Lx), 0.0),
            tl.where(right, 0.0, y_col * tl.exp(R)))


@triton.jit
def load_chunk_rows(q, k, a, b, gk, row0, n_valid, col0, scale,
                    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """The chunk's [BT, BK] tiles of scale q, k, a, b and gk in fp32 (rows past the end 0)."""
    b_q = rows_tile(q + row0 * K, n_valid, H * K, K, col0, BT, BK).to(tl.float32) * scale
    b_k = rows_tile(k + row0 * K, n_valid, H * K, K, col0, BT, BK).to(tl.float32)
    b_a = rows_tile(a + row0 * K, n_valid, H * K, K, col0, BT, BK).to(tl.float32)
    b_b = rows_tile(b + row0 * K, n_valid, H * K, K, col0, BT, BK).to(tl.float32)
    b_g = rows_tile(gk + row0 * K, n_valid, H * K, K, col0, BT, BK).to(tl.float32)
    return b_q, b_k, b_a, b_b, b_g


@triton.jit
def intra_fwd_kernel(
    q, k, v, a, b, gk, qg, kg, bg, ag, decay, A_qk, A_qb, Lmat, M, w, u_tilde, scratch,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, THROUGH_SCRATCH: tl.constexpr, SPREAD: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    if THROUGH_SCRATCH:  # the level sums' sibling totals through the program's [BT, BK] tile
        scratch += pid * (BT * BK)
    i_chunk = pid // H
    i_h = pid % H
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    row0 = t0 * H + i_h  # (token, head) row of the chunk's first token
    DT = qg.dtype.element_ty
    rows = tl.arange(0, BT)

    b_Aqk = tl.zeros([BT, BT], dtype=tl.float32)
    b_Aqb = tl.zeros([BT, BT], dtype=tl.float32)
    b_Aak = tl.zeros([BT, BT], dtype=tl.float32)
    b_Aab = tl.zeros([BT, BT], dtype=tl.float32)
    d_qk = tl.zeros([BT], dtype=tl.float32)
    d_qb = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q, b_k, b_a, b_b, b_g = load_chunk_rows(q, k, a, b, gk, row0, n_valid, i_k * BK, scale, H, K, BT, BK)
        G, one_product = one_product_gates(b_g, SPREAD)
        if one_product:
            # every |G| <= SPREAD: all pairs i > j in one product per matrix, rows e^{G}
            # (a: e^{G^-}), columns e^{-G}
            strict = rows[:, None] > rows[None, :]
            L = G
            Lx = G - b_g
            R = sums_after(b_g, G)
            e_col = tl.exp(-G)
            q_s, a_s = (b_q * tl.exp(L)).to(DT), (b_a * tl.exp(Lx)).to(DT)
            k_s, b_s = (b_k * e_col).to(DT), (b_b * e_col).to(DT)
            b_Aqk += tl.where(strict, mm(q_s, tl.trans(k_s)), 0.0)
            b_Aqb += tl.where(strict, mm(q_s, tl.trans(b_s)), 0.0)
            b_Aak += tl.where(strict, mm(a_s, tl.trans(k_s)), 0.0)
            b_Aab += tl.where(strict, mm(a_s, tl.trans(b_s)), 0.0)
        else:
            # pairs i > j level by level: (x_i e^{G_i - G_e}) . (y_j e^{G_e - G_j}); the rows of a
            # read the state before their own step, e^{G^-_i - G_e} (exclusive sums Lx)
            L = b_g
            Lx = tl.zeros([BT, BK], dtype=tl.float32)
            R = tl.zeros([BT, BK], dtype=tl.float32)
            for level in range(LEVELS):
                right = right_half(level, BT)
                pairs = level_pairs(level, BT)
                q_s, a_s, k_s = level_operands(b_q, b_a, b_k, L, Lx, R, right)
                b_s = tl.where(right, 0.0, b_b * tl.exp(R))
                q_s, a_s, k_s, b_s = q_s.to(DT), a_s.to(DT), k_s.to(DT), b_s.to(DT)
                b_Aqk += tl.where(pairs, mm(q_s, tl.trans(k_s)), 0.0)
                b_Aqb += tl.where(pairs, mm(q_s, tl.trans(b_s)), 0.0)
                b_Aak += tl.where(pairs, mm(a_s, tl.trans(k_s)), 0.0)
                b_Aab += tl.where(pairs, mm(a_s, tl.trans(b_s)), 0.0)
                L, Lx, R = next_level_sums_with_exclusive(L, Lx, R, right, level, BT, BK, scratch, THROUGH_SCRATCH)
        # one block now: L = G, Lx = G^- (the sum before the row), R = G_C - G
        d_qk += tl.sum(b_q * b_k, axis=1)
        d_qb += tl.sum(b_q * b_b, axis=1)
        rows_tile_store(qg + row0 * K, b_q * tl.exp(L), n_valid, H * K, K, i_k * BK, BT, BK)
        rows_tile_store(kg + row0 * K, b_k * tl.exp(R), n_valid, H * K, K, i_k * BK, BT, BK)
        rows_tile_store(bg + row0 * K, b_b * tl.exp(R), n_valid, H * K, K, i_k * BK, BT, BK)
        rows_tile_store(ag + row0 * K, b_a * tl.exp(Lx), n_valid, H * K, K, i_k * BK, BT, BK)
        cols = i_k * BK + tl.arange(0, BK)
        tl.store(decay + (slot * H + i_h) * K + cols, tl.exp(tl.sum(b_g, axis=0)), mask=cols < K)

    eye = rows[:, None] == rows[None, :]
    b_Aqk = tl.where(eye, d_qk[:, None], b_Aqk)
    b_Aqb = tl.where(eye, d_qb[:, None], b_Aqb)
    rows_tile_store(A_qk + row0 * BT, b_Aqk, n_valid, H * BT, BT, 0, BT, BT)
    rows_tile_store(A_qb + row0 * BT, b_Aqb, n_valid, H * BT, BT, 0, BT, BT)
    # u = A_ab u + A_ak v + Ag h  =>  u = L (A_ak v + Ag h), L = (I - A_ab)^{-1}
    b_L = unit_lower_inverse(-b_Aab, -tl.trans(b_Aab), BT, DT).to(DT)
    rows_tile_store(Lmat + row0 * BT, b_L, n_valid, H * BT, BT, 0, BT, BT)
    b_M = mm(b_L, b_Aak.to(DT)).to(DT)
    rows_tile_store(M + row0 * BT, b_M, n_valid, H * BT, BT, 0, BT, BT)
    tl.debug_barrier()  # Ag was stored by other threads of this program
    for i_k in range(tl.cdiv(K, BK)):
        b_ag = rows_tile(ag + row0 * K, n_valid, H * K, K, i_k * BK, BT, BK)
        rows_tile_store(w + row0 * K, mm(b_L, b_ag), n_valid, H * K, K, i_k * BK, BT, BK)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = rows_tile(v + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        rows_tile_store(u_tilde + row0 * V, mm(b_M, b_v), n_valid, H * V, V, i_v * BV, BT, BV)


@triton.jit
def _state_piece_step(b_h, b_dec, bg_base, kg_base, n_valid, i_p, b_u, b_v,
                      H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    """One [BKS, BV] piece of h <- e^{G_C} h + Bg^T u + Kg^T v."""
    b_bt = rows_tile_t(bg_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    b_kt = rows_tile_t(kg_base, n_valid, H * K, K, i_p * BKS, BT, BKS)
    return b_h * b_dec[:, None] + mm(b_bt, b_u) + mm(b_kt, b_v)


@triton.jit
def _decay_piece(decay, slot, i_h, i_p, H: tl.constexpr, K: tl.constexpr, BKS: tl.constexpr):
    cols = i_p * BKS + tl.arange(0, BKS)
    return tl.load(decay + (slot * H + i_h) * K + cols, mask=cols < K, other=0.0)


@triton.jit
def state_fwd_kernel(
    w, u_tilde, v, bg, kg, decay, h0, h, u, ht,
    cu_seqlens, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr,
    BV: tl.constexpr, IS_VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
):
    """The state is held as NKS (1, 2 or 4) pieces of [BKS, BV] key rows, so that each
    product stages a [BT, BKS] operand tile rather than a [BT, K] one."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = (pid % NV).to(tl.int32)
    i_nh = pid // NV
    i_h = i_nh % H
    bos, eos, slot0 = chunk_span(i_nh // H, cu_seqlens, T, BT, IS_VARLEN)
    DT = w.dtype.element_ty

    b_h1, b_h2, b_h3, b_h4 = load_state_pieces(h0, i_nh, i_v, K, V, BKS, NKS, BV, USE_H0)
    for i_c in range(0, tl.cdiv(eos - bos, BT)):
        t0 = bos + i_c * BT
        n_valid = tl.minimum(eos - t0, BT)
        row0 = t0 * H + i_h
        slot = slot0 + i_c
        store_state_pieces(h + (slot * H + i_h) * K * V, b_h1, b_h2, b_h3, b_h4, i_v, K, V, BKS, NKS, BV)
        w_base = w + row0 * K
        b_wh = mm(rows_tile(w_base, n_valid, H * K, K, 0, BT, BKS), b_h1.to(DT))
        if NKS > 1:
            b_wh += mm(rows_tile(w_base, n_valid, H * K, K, BKS, BT, BKS), b_h2.to(DT))
        if NKS > 2:
            b_wh += mm(rows_tile(w_base, n_valid, H * K, K, 2 * BKS, BT, BKS), b_h3.to(DT))
            b_wh += mm(rows_tile(w_base, n_valid, H * K, K, 3 * BKS, BT, BKS), b_h4.to(DT))
        b_u = rows_tile(u_tilde + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(tl.float32) + b_wh
        rows_tile_store(u + row0 * V, b_u, n_valid, H * V, V, i_v * BV, BT, BV)
        b_ud = b_u.to(DT)
        b_v = rows_tile(v + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
        bg_base = bg + row0 * K
        kg_base = kg + row0 * K
        b_h1 = _state_piece_step(b_h1, _decay_piece(decay, slot, i_h, 0, H, K, BKS), bg_base, kg_base, n_valid, 0,
                                 b_ud, b_v, H, K, BT, BKS)
        if NKS > 1:
            b_h2 = _state_piece_step(b_h2, _decay_piece(decay, slot, i_h, 1, H, K, BKS), bg_base, kg_base, n_valid,
                                     1, b_ud, b_v, H, K, BT, BKS)
        if NKS > 2:
            b_h3 = _state_piece_step(b_h3, _decay_piece(decay, slot, i_h, 2, H, K, BKS), bg_base, kg_base, n_valid,
                                     2, b_ud, b_v, H, K, BT, BKS)
            b_h4 = _state_piece_step(b_h4, _decay_piece(decay, slot, i_h, 3, H, K, BKS), bg_base, kg_base, n_valid,
                                     3, b_ud, b_v, H, K, BT, BKS)
    if STORE_HT:
        store_state_pieces(ht + i_nh * K * V, b_h1, b_h2, b_h3, b_h4, i_v, K, V, BKS, NKS, BV)


@triton.jit
def output_fwd_kernel(
    qg, h, u, v, A_qk, A_qb, o,
    cu_seqlens, chunk_map, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = (pid % NV).to(tl.int32)
    i_chunk = (pid // NV) // H
    i_h = (pid // NV) % H
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    row0 = t0 * H + i_h
    DT = qg.dtype.element_ty

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    h_base = h + (slot * H + i_h) * K * V
    for i_k in range(tl.cdiv(K, BK)):
        b_q = rows_tile(qg + row0 * K, n_valid, H * K, K, i_k * BK, BT, BK)
        b_o += mm(b_q, state_piece_load(h_base, i_k, i_v, K, V, BK, BV).to(DT))
    b_Aqk = rows_tile(A_qk + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
    b_Aqb = rows_tile(A_qb + row0 * BT, n_valid, H * BT, BT, 0, BT, BT)
    b_u = rows_tile(u + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV)
    b_v = rows_tile(v + row0 * V, n_valid, H * V, V, i_v * BV, BT, BV).to(DT)
    b_o += mm(b_Aqb, b_u) + mm(b_Aqk, b_v)
    rows_tile_store(o + row0 * V, b_o, n_valid, H * V, V, i_v * BV, BT, BV)


def chunk_fwd(q, k, v, a, b, gk, scale, initial_state, output_final_state, cu_seqlens, chunk_map, num_seqs,
              keep, cfg):
    """Launch the forward kernels; returns ``(o, final_state, saved)`` (``saved`` None unless ``keep``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = cfg.BT
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * cdiv(T, BT)
    n_slots = state_slots(num_seqs, T, num_seqs, BT, varlen)
    dev, wt = q.device, cfg.work
    qg, kg, bg, ag, w = (empty((B, T, H, K), wt, dev) for _ in range(5))
    A_qk, A_qb, L, M = (empty((B, T, H, BT), wt, dev) for _ in range(4))
    u_tilde = empty((B, T, H, V), wt, dev)
    decay = empty((n_slots, H, K), torch.float32, dev)
    flags = dict(IS_VARLEN=varlen)
    if n_chunks > 0:
        through = cfg.intra_siblings == "scratch"
        scratch = empty((n_chunks * H, BT, cfg.intra_BK), torch.float32, dev) if through else None
        intra_fwd_kernel[(n_chunks * H,)](
            q, k, v, a, b, gk, qg, kg, bg, ag, decay, A_qk, A_qb, L, M, w, u_tilde, scratch, cu_seqlens, chunk_map,
            T, scale, H=H, K=K, V=V, BT=BT, BK=cfg.intra_BK, BV=cfg.intra_BV, THROUGH_SCRATCH=through,
            SPREAD=one_product_spread(wt), **flags, **launch_options(cfg.intra_warps, 1, cfg.intra_maxnreg),
        )
    h = empty((n_slots, H, K, V), wt, dev)
    u = empty((B, T, H, V), wt, dev)
    final_state = empty((num_seqs, H, K, V), torch.float32, dev) if output_final_state else None
    if num_seqs * H > 0:
        state_fwd_kernel[(num_seqs * H * cdiv(V, cfg.state_BV),)](
            w, u_tilde, v, bg, kg, decay, initial_state, h, u, final_state, cu_seqlens, T,
            H=H, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.NKS, BV=cfg.state_BV,
            USE_H0=initial_state is not None, STORE_HT=output_final_state,
            num_warps=cfg.state_warps, num_stages=cfg.state_stages, **flags, **COMPILE_OPTIONS,
        )
    o = empty(v.shape, v.dtype, dev)
    if n_chunks > 0:
        output_fwd_kernel[(n_chunks * H * cdiv(V, cfg.out_BV),)](
            qg, h, u, v, A_qk, A_qb, o, cu_seqlens, chunk_map, T,
            H=H, K=K, V=V, BT=BT, BK=cfg.out_BK, BV=cfg.out_BV,
            num_warps=cfg.out_warps, num_stages=cfg.out_stages, **flags, **COMPILE_OPTIONS,
        )
    saved = dict(qg=qg, kg=kg, bg=bg, w=w, A_qk=A_qk, A_qb=A_qb, L=L, M=M, decay=decay, h=h, u=u) if keep else None
    return o, final_state, saved
