"""Forward kernels of the chunked (gated) delta rule: WY prepare, state pass, output.

The math and its derivation are in ``kernels/delta_rule/chunk.py``. Three launches:

1. ``prepare_wy_kernel``, one program per (chunk, value head): chunk-local gate cumsum G,
   A = strictly-lower(diag(beta) K K^T * Gamma), its inverse L = (I + A)^{-1}, and
   W = L diag(beta e^G) K (kept as e^{-G_0} W), U~ = L diag(beta) V (also the key inverse
   norms under ``use_qk_l2norm_in_kernel``).
2. ``state_pass_kernel``, one program per (sequence, value head, value block), walking the
   chunks in order with the [K, BV] state in registers: stores each chunk's incoming
   state h and the pseudo-values U - W h.
3. ``output_kernel``, one program per (chunk, value head, value block): the inter-chunk
   read of h and the causal intra-chunk attention over the pseudo-values.

Without a gate (``USE_G = False``) the same kernels compute the plain delta rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._arch import COMPILE_OPTIONS
from .._utils import empty
from .._chunk import (
    chunk_coords, load_state_pieces, masked_exp, mm, rows_tile, rows_tile_store, rows_tile_t, state_piece_load, store_state_pieces,
)
from .._sequence import state_slots
from .._triangular import unit_lower_inverse
from ._chunk_common import CHUNK, L2NORM_EPS, load_gate_chunk, state_program


@triton.jit
def prepare_wy_kernel(
    k, v, g, beta, L, w, u, G, rk,
    cu_seqlens, chunk_map, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, STORE_L: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    i_chunk = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    rows = tl.arange(0, BT)
    valid = rows < n_valid
    DT = k.dtype.element_ty

    b_beta = tl.load(beta + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float32)
    b_kscale = b_beta
    if USE_G:
        b_G = tl.cumsum(tl.load(g + (t0 + rows) * HV + i_hv, mask=valid, other=0.0).to(tl.float64), axis=0)
        tl.store(G + (t0 + rows) * HV + i_hv, b_G, mask=valid)
        # W is kept as e^{-G_0} W (G_0 = g_0, the chunk's first cumulative gate): its rows
        # then reach 1 in magnitude, so fp16 does not flush them to zero under strong decay
        b_kscale = b_kscale * tl.exp((b_G - tl.sum(tl.where(rows == 0, b_G, 0.0), axis=0)).to(tl.float32))

    k_base = k + (t0 * H + i_h) * K
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = rows_tile(k_base, n_valid, H * K, K, i_k * BK, BT, BK)
        b_A += mm(b_k, tl.trans(b_k))
    if L2NORM:
        # |k_i|^2 is the diagonal of the Gram product K K^T above, as deterministic as the
        # product itself. (A loop of its own over k cost this kernel 0.21 -> 0.53 ms on the
        # H100, under the GatedDeltaNet layer's strong gates; sums from the tiles of the
        # pipelined product loop changed from run to run on sm90 in bf16.)
        b_ss = tl.sum(tl.where(rows[:, None] == rows[None, :], b_A, 0.0), axis=1)
        b_rk = 1.0 / tl.sqrt(b_ss + L2NORM_EPS)
        # every value head of the group computes the same norms; the first one stores them
        tl.store(rk + (t0 + rows) * H + i_h, b_rk, mask=tl.where(i_hv % (HV // H) == 0, valid, False))
        b_A = b_A * b_rk[:, None] * b_rk[None, :]
        b_kscale = b_kscale * b_rk

    # A = strictly-lower(diag(beta) K K^T * Gamma), and its transpose from the same K K^T
    strict = (rows[:, None] > rows[None, :]) & valid[:, None]
    strict_t = (rows[:, None] < rows[None, :]) & valid[None, :]
    b_AT = b_A
    if USE_G:
        b_AT = b_AT * masked_exp(b_G[None, :] - b_G[:, None], strict_t)
        b_A = b_A * masked_exp(b_G[:, None] - b_G[None, :], strict)
    b_AT = tl.where(strict_t, b_AT * b_beta[None, :], 0.0)
    b_A = tl.where(strict, b_A * b_beta[:, None], 0.0)
    b_L = unit_lower_inverse(b_A, b_AT, BT, DT)
    b_Ld = b_L.to(DT)
    if STORE_L:
        rows_tile_store(L + (t0 * HV + i_hv) * BT, b_Ld, n_valid, HV * BT, BT, 0, BT, BT)

    # W = L diag(beta e^{G - G_0}) K, U~ = L diag(beta) V
    for i_k in range(tl.cdiv(K, BK)):
        b_k = rows_tile(k_base, n_valid, H * K, K, i_k * BK, BT, BK)
        b_w = mm(b_Ld, (b_k * b_kscale[:, None]).to(DT))
        rows_tile_store(w + (t0 * HV + i_hv) * K, b_w, n_valid, HV * K, K, i_k * BK, BT, BK)
    for i_v in range(tl.cdiv(V, BV)):
        b_v = rows_tile(v + (t0 * HV + i_hv) * V, n_valid, HV * V, V, i_v * BV, BT, BV)
        b_u = mm(b_Ld, (b_v * b_beta[:, None]).to(DT))
        rows_tile_store(u + (t0 * HV + i_hv) * V, b_u, n_valid, HV * V, V, i_v * BV, BT, BV)


@triton.jit
def piece_decay(decay, slot_row, i_p, decay_scalar, K: tl.constexpr, BKS: tl.constexpr, CHANNEL_DECAY: tl.constexpr):
    """The decay of one [BKS, BV] key piece of a chunk's state: the scalar e^{G_C}, or with
    CHANNEL_DECAY the rows [i_p BKS, (i_p + 1) BKS) of the chunk's [K] vector e^{G_C}
    (``decay`` holds one per state slot and value head; ``slot_row`` is that row)."""
    if CHANNEL_DECAY:
        rows = i_p * BKS + tl.arange(0, BKS)
        piece = tl.load(decay + slot_row * K + rows, mask=rows < K, other=0.0)[:, None]
    else:
        piece = decay_scalar
    return piece


@triton.jit
def _state_piece_update(b_h, k_base, n_valid, i_p, b_vnd, decay,
                        H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BKS: tl.constexpr):
    """One [BKS, BV] piece of h <- e^{G_C} h + K^T (decayed pseudo-values)."""
    return b_h * decay + mm(rows_tile_t(k_base, n_valid, H * K, K, i_p * BKS, BT, BKS), b_vnd)


@triton.jit
def state_pass_kernel(
    k, w, u, G, rk, h0, h, vn, ht,
    cu_seqlens, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, CHANNEL_DECAY: tl.constexpr = False, decay=None,
):
    """The state is held as NKS (1, 2 or 4) pieces of [BKS, BV] rows, so each product
    stages a [BT, BKS] operand rather than the whole [BT, K] one (shared memory at K = 256).

    With CHANNEL_DECAY (kda, ``chunk_kda.py``) the gates are per key channel and already
    folded into the operands: ``k`` is the [B, T, HV, K] buffer of k ⊙ e^{G_C - G}
    (H = HV), ``w``, ``u`` need no gate, and ``decay`` holds each chunk's [K] e^{G_C}."""
    i_v, i_nh, i_hv, i_h, bos, eos, slot0, NT = state_program(cu_seqlens, T, H, HV, V, BT, BV, IS_VARLEN)
    rows = tl.arange(0, BT)
    DT = k.dtype.element_ty

    b_h1, b_h2, b_h3, b_h4 = load_state_pieces(h0, i_nh, i_v, K, V, BKS, NKS, BV, USE_H0)
    for i_c in range(0, NT):
        t0 = bos + i_c * BT
        n_valid = tl.minimum(eos - t0, BT)
        valid = rows < n_valid
        w_base = w + (t0 * HV + i_hv) * K
        k_base = k + (t0 * H + i_h) * K
        store_state_pieces(h + ((slot0 + i_c) * HV + i_hv) * K * V, b_h1, b_h2, b_h3, b_h4, i_v, K, V, BKS, NKS, BV)
        b_wh = mm(rows_tile(w_base, n_valid, HV * K, K, 0, BT, BKS), b_h1.to(DT))
        if NKS > 1:
            b_wh += mm(rows_tile(w_base, n_valid, HV * K, K, BKS, BT, BKS), b_h2.to(DT))
        if NKS > 2:
            b_wh += mm(rows_tile(w_base, n_valid, HV * K, K, 2 * BKS, BT, BKS), b_h3.to(DT))
            b_wh += mm(rows_tile(w_base, n_valid, HV * K, K, 3 * BKS, BT, BKS), b_h4.to(DT))

        # pseudo-values of the chunk: U - W h (W stored as e^{-G_0} W)
        if USE_G:
            b_wh = b_wh * tl.exp(tl.load(G + t0 * HV + i_hv).to(tl.float32))
        b_vn = rows_tile(u + (t0 * HV + i_hv) * V, n_valid, HV * V, V, i_v * BV, BT, BV).to(tl.float32) - b_wh
        rows_tile_store(vn + (t0 * HV + i_hv) * V, b_vn, n_valid, HV * V, V, i_v * BV, BT, BV)

        # h <- e^{G_C} h + (K * e^{G_C - G})^T (U - W h)
        chunk_decay = 1.0
        if USE_G:
            b_G, b_G_last = load_gate_chunk(G, t0, n_valid, i_hv, HV, BT)
            b_vn = b_vn * masked_exp(b_G_last - b_G, valid)[:, None]
            chunk_decay = tl.exp(b_G_last.to(tl.float32))
        if L2NORM:
            b_vn = b_vn * tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)[:, None]
        b_vnd = b_vn.to(DT)
        slot_row = (slot0 + i_c) * HV + i_hv
        b_h1 = _state_piece_update(b_h1, k_base, n_valid, 0, b_vnd,
                                   piece_decay(decay, slot_row, 0, chunk_decay, K, BKS, CHANNEL_DECAY), H, K, BT, BKS)
        if NKS > 1:
            b_h2 = _state_piece_update(b_h2, k_base, n_valid, 1, b_vnd,
                                       piece_decay(decay, slot_row, 1, chunk_decay, K, BKS, CHANNEL_DECAY), H, K, BT, BKS)
        if NKS > 2:
            b_h3 = _state_piece_update(b_h3, k_base, n_valid, 2, b_vnd,
                                       piece_decay(decay, slot_row, 2, chunk_decay, K, BKS, CHANNEL_DECAY), H, K, BT, BKS)
            b_h4 = _state_piece_update(b_h4, k_base, n_valid, 3, b_vnd,
                                       piece_decay(decay, slot_row, 3, chunk_decay, K, BKS, CHANNEL_DECAY), H, K, BT, BKS)

    if STORE_HT:
        store_state_pieces(ht + i_nh * K * V, b_h1, b_h2, b_h3, b_h4, i_v, K, V, BKS, NKS, BV)


@triton.jit
def output_kernel(
    q, k, vn, h, G, rk, rq, o, P,
    cu_seqlens, chunk_map, T, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, L2NORM: tl.constexpr, IS_VARLEN: tl.constexpr, STORE_P: tl.constexpr,
    GIVEN_P: tl.constexpr = False,
):
    """O = scale ((Q * e^G) h + P U). With GIVEN_P (kda, ``chunk_kda.py``) the per-channel
    gates are already folded in: ``q`` is the [B, T, HV, K] buffer of scale q ⊙ e^G
    (H = HV), ``P`` the scaled intra-chunk matrix, and ``scale`` is 1."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = (pid % NV).to(tl.int32)
    i_chunk = (pid // NV) // HV
    i_hv = (pid // NV) % HV
    i_h = i_hv // (HV // H)
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    rows = tl.arange(0, BT)
    valid = rows < n_valid
    DT = q.dtype.element_ty

    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_q = rows_tile(q + (t0 * H + i_h) * K, n_valid, H * K, K, i_k * BK, BT, BK)
        b_h = state_piece_load(h + (slot * HV + i_hv) * K * V, i_k, i_v, K, V, BK, BV)
        b_o += mm(b_q, b_h)
        if not GIVEN_P:
            b_kt = rows_tile_t(k + (t0 * H + i_h) * K, n_valid, H * K, K, i_k * BK, BT, BK)
            b_A += mm(b_q, b_kt)

    if L2NORM:
        # The norms of q take a loop of their own (the tiles come again from cache): summed
        # from the tiles of the loop above, pipelined in two stages for the tensor cores,
        # they came out wrong on sm90 in bf16 (Triton 3.6; rel error 0.3 at K = 128)
        b_ss = tl.zeros([BT], dtype=tl.float32)
        for i_k in range(tl.cdiv(K, BK)):
            b_qf = rows_tile(q + (t0 * H + i_h) * K, n_valid, H * K, K, i_k * BK, BT, BK).to(tl.float32)
            b_ss += tl.sum(b_qf * b_qf, axis=1)
        b_rq = 1.0 / tl.sqrt(b_ss + L2NORM_EPS)
        first = (i_v == 0) & (i_hv % (HV // H) == 0)
        tl.store(rq + (t0 + rows) * H + i_h, b_rq, mask=tl.where(first, valid, False))
        b_rk = tl.load(rk + (t0 + rows) * H + i_h, mask=valid, other=0.0)
        b_o = b_o * b_rq[:, None]
        b_A = b_A * b_rq[:, None] * b_rk[None, :]
    causal = (rows[:, None] >= rows[None, :]) & valid[:, None]
    if USE_G:
        b_G, b_G_last = load_gate_chunk(G, t0, n_valid, i_hv, HV, BT)
        b_o = b_o * tl.exp(b_G.to(tl.float32))[:, None]
        b_A = b_A * masked_exp(b_G[:, None] - b_G[None, :], causal)
    if GIVEN_P:
        b_A = rows_tile(P + (t0 * HV + i_hv) * BT, n_valid, HV * BT, BT, 0, BT, BT).to(tl.float32)
    b_A = tl.where(causal, b_A, 0.0)
    if STORE_P:
        # the backward reads P = scale (Q K^T) * Gamma instead of recomputing it
        if i_v == 0:
            rows_tile_store(P + (t0 * HV + i_hv) * BT, b_A * scale, n_valid, HV * BT, BT, 0, BT, BT)

    b_vn = rows_tile(vn + (t0 * HV + i_hv) * V, n_valid, HV * V, V, i_v * BV, BT, BV)
    b_o = (b_o + mm(b_A.to(DT), b_vn)) * scale
    rows_tile_store(o + (t0 * HV + i_hv) * V, b_o, n_valid, HV * V, V, i_v * BV, BT, BV)


def chunk_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, chunk_map,
              num_seqs, l2norm, keep_for_backward, cfg):
    """Launch the three forward kernels; returns ``(o, final_state, saved)``.

    ``saved`` holds what the backward reads (None entries where not needed): the cumulative
    gates G, the inverse L, the intra-chunk attention P, W, the per-chunk states h, the
    pseudo-values, and the inverse norms of q and k.
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * triton.cdiv(T, BT)
    use_g = g is not None
    dt = q.dtype
    G = empty((B, T, HV), torch.float64, q.device) if use_g else None
    L = empty((B, T, HV, BT), dt, q.device) if keep_for_backward else None
    rk = empty((B, T, H), torch.float32, q.device) if l2norm else None
    rq = empty((B, T, H), torch.float32, q.device) if l2norm else None
    w = empty((B, T, HV, K), dt, q.device)
    u = empty((B, T, HV, V), dt, q.device)
    flags = dict(USE_G=use_g, L2NORM=l2norm, IS_VARLEN=varlen)
    if n_chunks > 0:
        prepare_wy_kernel[(n_chunks * HV,)](
            k, v, g, beta, L, w, u, G, rk, cu_seqlens, chunk_map, T,
            H=H, HV=HV, K=K, V=V, BT=BT, BK=cfg.prepare_BK, BV=cfg.prepare_BV, STORE_L=keep_for_backward,
            num_warps=cfg.prepare_warps, num_stages=cfg.prepare_stages, **flags, **COMPILE_OPTIONS,
        )

    h = empty((state_slots(num_seqs, T, num_seqs, CHUNK, varlen), HV, K, V), dt, q.device)
    vn = empty((B, T, HV, V), dt, q.device)
    final_state = empty((num_seqs, HV, K, V), torch.float32, q.device) if output_final_state else None
    state_pass_kernel[(num_seqs * HV * triton.cdiv(V, cfg.state_BV),)](
        k, w, u, G, rk, initial_state, h, vn, final_state, cu_seqlens, T,
        H=H, HV=HV, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.BK_full // cfg.BKS, BV=cfg.state_BV,
        USE_H0=initial_state is not None, STORE_HT=output_final_state,
        num_warps=cfg.state_warps, num_stages=cfg.state_stages, **flags, **COMPILE_OPTIONS,
    )

    o = empty((B, T, HV, V), v.dtype, q.device)
    P = empty((B, T, HV, BT), dt, q.device) if keep_for_backward else None
    if n_chunks > 0:
        output_kernel[(n_chunks * HV * triton.cdiv(V, cfg.output_BV),)](
            q, k, vn, h, G, rk, rq, o, P, cu_seqlens, chunk_map, T, scale,
            H=H, HV=HV, K=K, V=V, BT=BT, BK=cfg.output_BK, BV=cfg.output_BV, STORE_P=keep_for_backward,
            num_warps=cfg.output_warps, num_stages=cfg.output_stages, **flags, **COMPILE_OPTIONS,
        )
    saved = dict(G=G, L=L, P=P, w=w, h=h, vn=vn, rq=rq, rk=rk) if keep_for_backward else None
    return o, final_state, saved
