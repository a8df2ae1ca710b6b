"""Fused-recurrent kernels for the gated linear recurrences, forward and backward.

One kernel pair serves linear_attn, simple_gla, retention, gla and rwkv6 (docs/ops.md):

    S_t = diag(e^{a_t}) S_{t-1} + k_t v_t^T,     o_t = S_t^T (scale q_t)

with the gate ``a_t`` chosen by constexpr switches: none; a scalar log gate g ``[B, T, H]``;
a constant one g_gamma ``[H]`` (added to g when both are given); a per-channel one gk
``[B, T, H, K]``. With BONUS (rwkv6: q = r, gk = w, a bonus ``u [H, K]``) the output reads
the state *before* the token's update, plus the bonus on the current token:
``o_t = scale (S_{t-1}^T r_t + (r_t . (u k_t)) v_t)``. The state tile ``[K, BV]`` lives in registers for one pass over T; its
columns evolve independently, so V is split into blocks of BV across programs (the whole
K is one block, K <= 256).

Backward, two passes over T, each one program per (sequence, head, block of the state):

1. forward in time, recomputing ``S_t`` from the initial state exactly as the forward
   did (only multiplications by ``e^{a} <= 1`` and additions): ``dq_t = scale S_t do_t``;
   with a gate gradient to compute it also keeps ``S`` at the start of every segment of
   SEG = 16 steps (a float32 checkpoint);
2. backward in time with ``dS_t = scale q_t do_t^T + diag(e^{a_{t+1}}) dS_{t+1}``
   (``dS_T`` = the final state's gradient): ``dk_t = dS_t v_t``, ``dv_t = dS_t^T k_t``;
   what is left, ``diag(e^{a_1}) dS_1``, is the initial state's gradient.

The state is never reconstructed backwards (``S_{t-1} = e^{-a_t}(S_t - k_t v_t^T)``
divides by ``e^{a_t}``, which underflows to 0 under strong decay and turns into inf/NaN),
so both passes are as well conditioned as the forward.

Gate gradient, exact per step: ``dg_t = e^{a_t} (.) rowsum(S_{t-1} (.) dS_t)`` (per row k;
summed over k for a scalar gate). The identity ``dg = reverse-cumsum(q . dq - k . dk)``
needs no state but, under strong decay, sums O(1) terms whose true total is ~e^{a}: in
fp32 it leaves errors of 1e-3..1e-1 relative on dg. Pass 2 has ``dS_t`` but not
``S_{t-1}``. Split it at the segment's checkpoint ``S_c`` (the state before the segment's
first token c0), with ``B^c_t = sum_{c0 <= r <= t} a_r``:

    e^{a_t} S_{t-1} = e^{B^c_t} S_c + sum_{c0 <= s < t} e^{B^c_t - B^c_s} k_s v_s^T
    dg_t = e^{B^c_t} rowsum(S_c (.) dS_t) + sum_{c0 <= s < t} k_s (.) Y_t[:, s],
    Y_t[:, s] = e^{B^c_t - B^c_s} (.) (dS_t v_s)

and ``Y`` follows ``dS`` backwards without any division:
``Y_t[:, s] = Y_{t+1}[:, s] + scale q_t (do_t . v_s) (.) e^{B^c_t - B^c_s}``, started at
the segment's end from one ``tl.dot`` of the carried ``dS`` with the segment's values.
Every exponent is ``<= 0``; for fp32 inputs the segment's cumulative gates are float64
so that their differences keep full precision under strong decay.

The first pass splits the state by V blocks, so dq gets one partial sum per block. The
second pass splits it by V blocks too under a scalar gate (dk and dg one partial sum per
block), and by blocks of key rows under a per-channel gate (gla, rwkv6): a row of the
state evolves on its own, and ``Y`` needs ``dS_t v_s`` over all of V, so a program holding
whole rows computes each row's ``[SEG]`` exponentials once and its dk and dg whole, and dv
gets one partial sum per row block (``_configs`` has the measurements). A reduction kernel
adds the partial sums up (dv's: ``kernels._partials.column_sum``) and casts them.

RWKV-6 (BONUS). Write ``D_t`` for the gradient of the state after step t (what ``dS_t``
is above). Its output reads ``S_{t-1}``, so ``D_{t-1} = diag(e^{a_t}) D_t + scale r_t do_t^T``:
pass 2 takes ``dk_t = D_t v_t``, ``dv_t = D_t^T k_t`` (plus the bonus terms
``scale (do_t . v_t) u r_t`` and ``scale (r_t . u k_t) do_t``) *before* decaying ``D`` and
adding the token's own ``r do^T``; pass 1 reads ``S_{t-1}`` for ``dr_t``. The gate gradient
keeps its form with ``D_t`` for ``dS_t``, and ``Y`` steps back with the query one step
later: ``Y_t[:, s] = Y_{t+1}[:, s] + scale r_{t+1} (do_{t+1} . v_s) e^{B^c_t - B^c_s}``.
``du = scale sum_t (do_t . v_t) r_t k_t`` over every token: each program adds its tokens'
share (of ``do_t . v_t``: its V block's, or all of it when split by rows) into one row
of ``[N * NV, H * K]`` partial sums (``NV = 1`` split by rows), added up in a fixed order
(``kernels._partials.column_sum``).

Launches: forward 1; backward 3 (the first pass is the forward kernel in its dq mode,
then the second pass, then the reduction), plus dv's sum when split by rows, and for rwkv6
the du sum and, before both passes, ``bonus_dots_kernel``: each token's ``r_t . (u k_t)``
and ``do_t . v_t``, which the passes read as one scalar a step (reduced in the step, each
was a reduction across the program's warps on the serial path). Grid axis 0 carries
``N * H`` times the blocks; nothing large goes on axes 1 and 2. The checkpoints take
``N * ceil(T / 16) * H * K * V`` floats, allocated only when a gate gradient is wanted.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _library as library
from .._arch import RECURRENT_OPTIONS
from .._partials import column_sum
from .._utils import block_size, cdiv, contiguous, empty
from .._sequence import first_state_slot, sequence_bounds, state_slots
from .inputs import check_gated_inputs, retention_gamma


@triton.jit
def _program_tile(cu_seqlens, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, IS_VARLEN: tl.constexpr, SPLIT_K: tl.constexpr):
    """This program's (sequence, head, block): the block's index, the sequence and the head,
    the sequence's span, the state tile's row and column indices and masks, and the tile's
    offsets in a [N, H, K, V] state. The blocks split V (a tile is all K rows by BV columns) or, with
    SPLIT_K, K (BK rows by all of V, BV >= V)."""
    NPART: tl.constexpr = (K + BK - 1) // BK if SPLIT_K else (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_nh = pid // NPART
    i_part = pid % NPART
    i_n = i_nh // H
    i_h = i_nh % H
    bos, T_seq = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    if SPLIT_K:
        o_k = i_part * BK + tl.arange(0, BK)
        o_v = tl.arange(0, BV)
    else:
        o_k = tl.arange(0, BK)
        o_v = i_part * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    tile = i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    return i_part, i_n, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile


@triton.jit
def fused_recurrent_fwd_kernel(
    q, k, v, g, g_gamma, gk, u, bonus_dots, readout, h0, ht, checkpoints, cu_seqlens, scale, T, n_rows,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SEG: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr, BONUS: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DQ_MODE: tl.constexpr, STORE_CHECKPOINTS: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """One pass forward in time over ``S_t = diag(e^{a_t}) S_{t-1} + k_t v_t^T``.

    Forward: ``readout`` is o and gets ``S_t^T (scale q_t)``. With DQ_MODE (the backward's
    first pass; ``q`` is then do): ``readout`` is the float32 partial dq
    (``[NV, B*T, H, K]``, ``n_rows = B*T``) and this V block's slab gets ``scale S_t do_t``;
    with STORE_CHECKPOINTS it also keeps S before every segment of SEG steps. With BONUS
    both read ``S_{t-1}`` and add the bonus term (module docstring); in DQ_MODE its
    ``do_t . v_t`` comes from ``bonus_dots`` (``bonus_dots_kernel``), all of it in the first
    V block's slab.

    The step is written out in the loop rather than in a helper: under the interpreter a
    helper call per step costs milliseconds (the interpreter re-patches on every call).
    """
    i_v, i_n, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile = _program_tile(cu_seqlens, T, H, K, V, BK, BV, IS_VARLEN,
                                                                        False)
    m_kv = m_k[:, None] & m_v[None, :]
    if STORE_CHECKPOINTS:
        slot0 = first_state_slot(bos, i_n, T, SEG, IS_VARLEN)
    CONSTANT: tl.constexpr = USE_G_GAMMA and not (USE_G or USE_GK)
    if USE_G_GAMMA:
        gamma = tl.load(g_gamma + i_h).to(tl.float32)
        decay_hi, decay_lo = _constant_decay(g_gamma, i_h)
    else:
        decay_hi, decay_lo = 1.0, 0.0

    if BONUS:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        first_block = (i_v == 0).to(tl.float32)  # the block whose dq slab takes the whole do . v term
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + tile, mask=m_kv, other=0.0).to(tl.float32)
    # The step's inputs are loaded one step ahead: each step is a few hundred cycles of
    # arithmetic on a state in registers, and with loads issued where they are used every
    # step would wait out a full memory latency (a few hundred programs, one pass over T).
    # Each step's row: ``row``; the loads in flight are for ``row + H``.
    row = bos * H + i_h  # (token, head) row of the current step
    QW: tl.constexpr = V if DQ_MODE else K  # q's row length (do's, in DQ_MODE)
    q_cols = o_v if DQ_MODE else o_k
    m_q = m_v if DQ_MODE else m_k
    # o_1: the scalar gate as a [1] tile; every "load ahead" flag is a [1] tensor too (built
    # on o_1), never a scalar comparison: a mask must be a boolean tensor on every Triton
    o_1 = tl.arange(0, 1)
    ahead = o_1 < T_seq
    nk = tl.load(k + row * K + o_k, mask=m_k & ahead, other=0.0)
    nv = tl.load(v + row * V + o_v, mask=m_v & ahead, other=0.0)
    nq = tl.load(q + row * QW + q_cols, mask=m_q & ahead, other=0.0)
    ng, ngk = _first_gates(g, gk, row, ahead, o_k, m_k, K, USE_G, USE_GK)
    BONUS_DOTS: tl.constexpr = BONUS and DQ_MODE
    if BONUS_DOTS:
        ndov = tl.load(bonus_dots + n_rows * H + row + o_1, mask=ahead, other=0.0)
    for t in range(T_seq):
        if STORE_CHECKPOINTS:
            if t % SEG == 0:
                tl.store(checkpoints + ((slot0 + t // SEG) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                         S, mask=m_kv)
        bk, bv, bq, bg, bgk = nk.to(tl.float32), nv.to(tl.float32), nq.to(tl.float32), ng, ngk
        if BONUS_DOTS:
            b_dov = ndov
        nxt = row + H
        ahead = o_1 + t + 1 < T_seq
        nk = tl.load(k + nxt * K + o_k, mask=m_k & ahead, other=0.0)
        nv = tl.load(v + nxt * V + o_v, mask=m_v & ahead, other=0.0)
        nq = tl.load(q + nxt * QW + q_cols, mask=m_q & ahead, other=0.0)
        if USE_G:
            ng = tl.load(g + nxt + o_1, mask=ahead, other=0.0)
        if USE_GK:
            ngk = tl.load(gk + nxt * K + o_k, mask=m_k & ahead, other=0.0)
        if BONUS_DOTS:
            ndov = tl.load(bonus_dots + n_rows * H + nxt + o_1, mask=ahead, other=0.0)
        a = tl.zeros([BK], dtype=tl.float32)
        if USE_G:
            a += bg.to(tl.float32)
        if USE_G_GAMMA:
            a += gamma
        if USE_GK:
            a += bgk.to(tl.float32)
        S_next = _decayed(S, a, decay_hi, decay_lo, CONSTANT) + bk[:, None] * bv[None, :]
        S_read = S if BONUS else S_next
        if DQ_MODE:  # bq is do here
            b_dq = tl.sum(S_read * bq[None, :], 1)
            if BONUS:
                b_dq += b_u * bk * (b_dov * first_block)
            tl.store(readout + i_v * n_rows * H * K + row * K + o_k, b_dq * scale, mask=m_k)
        else:
            b_o = tl.sum(S_read * bq[:, None], 0)
            if BONUS:
                b_o += tl.sum(bq * b_u * bk, 0) * bv
            tl.store(readout + row * V + o_v, (b_o * scale).to(readout.dtype.element_ty), mask=m_v)
        S = S_next
        row = nxt
    if STORE_HT:
        tl.store(ht + tile, S, mask=m_kv)


@triton.jit
def _first_gates(g, gk, row, ahead, o_k, m_k, K: tl.constexpr, USE_G: tl.constexpr, USE_GK: tl.constexpr):
    """The gates of the first step a loop loads ahead (``ahead``: a [1] flag): the scalar g
    as a [1] tile (its mask then is a tensor), gk as a [BK] row; 0.0 for a gate not used."""
    ng = 0.0
    if USE_G:
        ng = tl.load(g + row + tl.arange(0, 1), mask=ahead, other=0.0)
    ngk = 0.0
    if USE_GK:
        ngk = tl.load(gk + row * K + o_k, mask=m_k & ahead, other=0.0)
    return ng, ngk


@triton.jit
def _constant_decay(g_gamma, i_h):
    """``e^{g_gamma[i_h]}`` as an fp32 pair (hi, lo) with hi + lo exact to fp64.

    A constant decay multiplies the state by the same rounded factor at every step, so its
    rounding error compounds over T steps (``T u`` relative, 2.6e-5 at T = 2048 in fp32)
    instead of averaging out; ``S * hi + S * lo`` applies it to twice fp32's precision."""
    decay = tl.exp(tl.load(g_gamma + i_h).to(tl.float64))
    hi = decay.to(tl.float32)
    return hi, (decay - hi.to(tl.float64)).to(tl.float32)


@triton.jit
def _decayed(S, a, hi, lo, CONSTANT: tl.constexpr):
    """``S`` times the step's decay: ``e^a`` row-wise, or the constant pair (hi, lo)."""
    if CONSTANT:
        return S * hi + S * lo
    return S * tl.exp(a)[:, None]


@triton.jit
def _segment_gates(g, g_gamma, gk, rows, m_s, i_h, o_k, m_k, K: tl.constexpr, USE_G: tl.constexpr,
                   USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr, GATE_DTYPE: tl.constexpr):
    """Cumulative log gates ``B^c`` of one segment: [BK, SEG] per channel, else [1, SEG]."""
    if USE_GK:
        a = tl.load(gk + rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_s[None, :], other=0.0).to(GATE_DTYPE)
        B_c = tl.cumsum(a, 1)
    else:
        a = tl.zeros(rows.shape, dtype=GATE_DTYPE)
        if USE_G:
            a += tl.load(g + rows, mask=m_s, other=0.0).to(GATE_DTYPE)
        if USE_G_GAMMA:
            a += tl.where(m_s, tl.load(g_gamma + i_h).to(GATE_DTYPE), 0.0)
        # scan in 1-D, then add the unit dim (Triton 3.6 fails to lower a scan over a [1, n] tile)
        B_c = tl.cumsum(a, 0)[None, :]
    return B_c


@triton.jit
def fused_recurrent_bwd_kernel(
    q, k, v, g, g_gamma, gk, u, bonus_dots, do, dk_part, dg_part, du_part, dv, dht, dh0, checkpoints, cu_seqlens,
    scale, T, n_rows, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    SEG: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr, BONUS: tl.constexpr,
    GATE_GRAD: tl.constexpr, GATE_F64: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
    IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr, SPLIT_K: tl.constexpr, DV_PARTIAL: tl.constexpr,
):
    """The backward's second pass (backward in time) for one (sequence, head, block).

    Split by V blocks (NV of them): ``dk_part`` is float32 ``[NV, B*T, H, K]`` (``n_rows =
    B*T``) and ``dg_part`` float32 ``[NV, B*T, H(, K)]``: this block's share of dk and dg.
    With SPLIT_K (NK blocks of BK key rows, each all of V): dk and a per-channel dg are whole
    in the program, so both take one slab; dv is the share, in ``dv`` as float32
    ``[NK, B*T, H, V]`` slabs with DV_PARTIAL (NK > 1). ``checkpoints`` holds the state
    before each segment (from the first pass), in ``state_slots`` rows. With BONUS,
    ``du_part`` is float32 ``[N * NV, H * K]`` (``[N, H * K]`` with SPLIT_K): this
    program's share of du. Its two dot products per token, ``q_t . (u k_t)`` and
    ``do_t . v_t``, come from ``bonus_dots`` (``bonus_dots_kernel``): whole, so the program
    whose share is a block of the one (K blocks with SPLIT_K, V blocks without) takes the
    term in the first block only.
    """
    GATED: tl.constexpr = USE_G or USE_G_GAMMA or USE_GK
    GATE_DTYPE: tl.constexpr = tl.float64 if GATE_F64 else tl.float32
    NPART: tl.constexpr = (K + BK - 1) // BK if SPLIT_K else (V + BV - 1) // BV
    i_part, i_n, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile = _program_tile(cu_seqlens, T, H, K, V, BK, BV,
                                                                           IS_VARLEN, SPLIT_K)
    m_kv = m_k[:, None] & m_v[None, :]
    # the slab of dk and a per-channel dg: a V block's share, or (SPLIT_K) the whole
    if SPLIT_K:
        slab = i_part * 0
        du_row = i_n
    else:
        slab = i_part * n_rows * H * K
        du_row = i_n * NPART + i_part
    if DV_PARTIAL:
        dv += i_part * n_rows * H * V
    seg_tile = i_h * K * V + o_k[:, None] * V + o_v[None, :]
    slot0 = first_state_slot(bos, i_n, T, SEG, IS_VARLEN)
    if USE_G_GAMMA:
        gamma = tl.load(g_gamma + i_h).to(tl.float32)
    if BONUS:
        b_u = tl.load(u + i_h * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        first_block = (i_part == 0).to(tl.float32)
        # a K block holds part of q . (u k), a V block part of do . v: the whole goes to block 0
        quk_share = first_block if SPLIT_K else 1.0
        dov_share = 1.0 if SPLIT_K else first_block
    b_du = tl.zeros([BK], dtype=tl.float32)
    o_1 = tl.arange(0, 1)  # as in the forward: the "load ahead" flags and the step's validity as [1] tiles

    # pass 2: backward in time, one segment of SEG steps at a time
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + tile, mask=m_kv, other=0.0)
    o_s = tl.arange(0, SEG)
    NS = tl.cdiv(T_seq, SEG)
    for i_s in range(NS):
        seg = NS - 1 - i_s
        m_s = seg * SEG + o_s < T_seq
        rows = (bos + seg * SEG + o_s) * H + i_h
        if GATE_GRAD:
            S_c = tl.load(checkpoints + (slot0 + seg) * H * K * V + seg_tile, mask=m_kv, other=0.0)
            kT_seg = tl.load(k + rows[None, :] * K + o_k[:, None], mask=m_k[:, None] & m_s[None, :], other=0.0).to(tl.float32)
            v_seg = tl.load(v + rows[:, None] * V + o_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0).to(tl.float32)
            B_c = _segment_gates(g, g_gamma, gk, rows, m_s, i_h, o_k, m_k, K, USE_G, USE_G_GAMMA, USE_GK, GATE_DTYPE)
            # Y[:, s] = e^{B_end - B_s} (dS' v_s): padded steps past the end have zero gates,
            # so B at the segment's last slot is B at its last real token
            B_end = tl.sum(tl.where(o_s[None, :] == SEG - 1, B_c, 0.0), 1)
            Y = tl.dot(dS, tl.trans(v_seg), input_precision=PRECISION)
            Y *= tl.exp((B_end[:, None] - B_c).to(tl.float32))
        # rwkv6: the query and output gradient one step later (none after the segment's end,
        # whose D is in the carried dS)
        q_next = tl.zeros([BK], dtype=tl.float32)
        do_next = tl.zeros([BV], dtype=tl.float32)
        # as in the forward, each step's inputs are loaded one step ahead (here: the step before)
        row = (bos + seg * SEG + SEG - 1) * H + i_h
        ahead = o_1 + seg * SEG + SEG - 1 < T_seq
        nq = tl.load(q + row * K + o_k, mask=m_k & ahead, other=0.0)
        nk = tl.load(k + row * K + o_k, mask=m_k & ahead, other=0.0)
        nv = tl.load(v + row * V + o_v, mask=m_v & ahead, other=0.0)
        ndo = tl.load(do + row * V + o_v, mask=m_v & ahead, other=0.0)
        ng, ngk = _first_gates(g, gk, row, ahead, o_k, m_k, K, USE_G, USE_GK)
        if BONUS:
            nquk = tl.load(bonus_dots + row + o_1, mask=ahead, other=0.0)
            ndov = tl.load(bonus_dots + n_rows * H + row + o_1, mask=ahead, other=0.0)
        for jj in range(SEG):
            j = SEG - 1 - jj
            valid = o_1 + seg * SEG + j < T_seq  # a [1] tensor, like the masks built on it
            row = (bos + seg * SEG + j) * H + i_h
            m_kt = m_k & valid
            m_vt = m_v & valid
            bq, bk, bv, bdo, bg, bgk = nq.to(tl.float32), nk.to(tl.float32), nv.to(tl.float32), ndo.to(tl.float32), ng, ngk
            if BONUS:
                b_quk, b_dov = nquk, ndov
            prev = row - H
            ahead = (o_1 + jj + 1 < SEG) & (o_1 + seg * SEG + j - 1 < T_seq)
            nq = tl.load(q + prev * K + o_k, mask=m_k & ahead, other=0.0)
            nk = tl.load(k + prev * K + o_k, mask=m_k & ahead, other=0.0)
            nv = tl.load(v + prev * V + o_v, mask=m_v & ahead, other=0.0)
            ndo = tl.load(do + prev * V + o_v, mask=m_v & ahead, other=0.0)
            if USE_G:
                ng = tl.load(g + prev + o_1, mask=ahead, other=0.0)
            if USE_GK:
                ngk = tl.load(gk + prev * K + o_k, mask=m_k & ahead, other=0.0)
            if BONUS:
                nquk = tl.load(bonus_dots + prev + o_1, mask=ahead, other=0.0)
                ndov = tl.load(bonus_dots + n_rows * H + prev + o_1, mask=ahead, other=0.0)
            if not BONUS:
                dS += (bq * scale)[:, None] * bdo[None, :]
            b_dk = tl.sum(dS * bv[None, :], 1)
            b_dv = tl.sum(dS * bk[:, None], 0)
            if BONUS:
                do_v = b_dov * (scale * dov_share)
                b_dk += do_v * b_u * bq
                b_dv += b_quk * (scale * quk_share) * bdo
                b_du += do_v * bq * bk
            tl.store(dk_part + slab + row * K + o_k, b_dk, mask=m_kt)
            tl.store(dv + row * V + o_v, b_dv.to(dv.dtype.element_ty), mask=m_vt)
            if GATE_GRAD:
                before = o_s[None, :] < j
                B_t = tl.sum(tl.where(o_s[None, :] == j, B_c, 0.0), 1)  # [BK] or [1]
                decay = tl.exp(tl.where(before, (B_t[:, None] - B_c).to(tl.float32), float("-inf")))
                if BONUS:
                    Y += (q_next * scale)[:, None] * tl.sum(v_seg * do_next[None, :], 1)[None, :] * decay
                else:
                    Y += (bq * scale)[:, None] * tl.sum(v_seg * bdo[None, :], 1)[None, :] * decay
                dg_t = tl.exp(B_t.to(tl.float32)) * tl.sum(S_c * dS, 1) + tl.sum(tl.where(before, kT_seg * Y, 0.0), 1)
                if USE_GK:
                    tl.store(dg_part + slab + row * K + o_k, dg_t, mask=m_kt)
                else:
                    tl.store(dg_part + i_part * n_rows * H + row + o_1, tl.zeros([1], tl.float32) + tl.sum(dg_t, 0),
                             mask=valid)
            if GATED:
                a = tl.zeros([BK], dtype=tl.float32)
                if USE_G:
                    a += bg.to(tl.float32)
                if USE_G_GAMMA:
                    a += tl.where(valid, gamma, 0.0)
                if USE_GK:
                    a += bgk.to(tl.float32)
                dS *= tl.exp(a)[:, None]
            if BONUS:
                dS += (bq * scale)[:, None] * bdo[None, :]
                q_next = bq
                do_next = bdo
    if BONUS:
        tl.store(du_part + du_row * H * K + i_h * K + o_k, b_du, mask=m_k)
    if STORE_DH0:
        tl.store(dh0 + tile, dS.to(dh0.dtype.element_ty), mask=m_kv)


@triton.jit
def fused_recurrent_reduce_kernel(
    dq_part, dk_part, dg_part, dq, dk, dg, n_rows, NV_Q, NV,
    K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
    GATE_GRAD: tl.constexpr, PER_CHANNEL: tl.constexpr,
):
    """dq, dk (and dg) = sums of the V-block partials, cast to the inputs' dtypes: NV_Q
    blocks of dq (the first pass's V blocks), NV of dk and dg (the second pass's).
    ``n_rows`` counts (token, head) rows."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m_r = o_r < n_rows
    m = m_r[:, None] & (o_k < K)[None, :]
    offs = o_r[:, None] * K + o_k[None, :]
    bdq = tl.zeros([BR, BK], dtype=tl.float32)
    bdk = tl.zeros([BR, BK], dtype=tl.float32)
    bdg = tl.zeros([BR, BK], dtype=tl.float32)
    bdg_row = tl.zeros([BR], dtype=tl.float32)
    for i_v in range(NV_Q):
        bdq += tl.load(dq_part + i_v * n_rows * K + offs, mask=m, other=0.0)
    for i_v in range(NV):
        slab = i_v * n_rows * K
        bdk += tl.load(dk_part + slab + offs, mask=m, other=0.0)
        if GATE_GRAD:
            if PER_CHANNEL:
                bdg += tl.load(dg_part + slab + offs, mask=m, other=0.0)
            else:
                bdg_row += tl.load(dg_part + i_v * n_rows + o_r, mask=m_r, other=0.0)
    tl.store(dq + offs, bdq.to(dq.dtype.element_ty), mask=m)
    tl.store(dk + offs, bdk.to(dk.dtype.element_ty), mask=m)
    if GATE_GRAD:
        if PER_CHANNEL:
            tl.store(dg + offs, bdg.to(dg.dtype.element_ty), mask=m)
        else:
            tl.store(dg + o_r, bdg_row.to(dg.dtype.element_ty), mask=m_r)


@triton.jit
def bonus_dots_kernel(q, k, u, do, v, out, n_rows, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """rwkv6's two dot products per (token, head) row, float32 into ``out [2, n_rows]``:
    ``q_t . (u ⊙ k_t)`` and ``do_t . v_t``. The backward's passes take them as one scalar
    a step instead of reducing across the program's threads on their serial path."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = o_r < n_rows
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_qk = m_r[:, None] & (o_k < K)[None, :]
    m_dv = m_r[:, None] & (o_v < V)[None, :]
    b_q = tl.load(q + o_r[:, None] * K + o_k[None, :], mask=m_qk, other=0.0).to(tl.float32)
    b_k = tl.load(k + o_r[:, None] * K + o_k[None, :], mask=m_qk, other=0.0).to(tl.float32)
    b_u = tl.load(u + (o_r % H)[:, None] * K + o_k[None, :], mask=m_qk, other=0.0).to(tl.float32)
    b_do = tl.load(do + o_r[:, None] * V + o_v[None, :], mask=m_dv, other=0.0).to(tl.float32)
    b_v = tl.load(v + o_r[:, None] * V + o_v[None, :], mask=m_dv, other=0.0).to(tl.float32)
    tl.store(out + o_r, tl.sum(b_q * b_u * b_k, 1), mask=m_r)
    tl.store(out + n_rows + o_r, tl.sum(b_do * b_v, 1), mask=m_r)


def _bonus_dots(q, k, u, do, v) -> torch.Tensor:
    """``bonus_dots_kernel`` over every (token, head) row: float32 ``[2, B*T*H]``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    n_rows = B * T * H
    out = empty((2, n_rows), torch.float32, q.device)
    BK, BV = block_size(K), block_size(V)
    BR = max(1, 4096 // max(BK, BV))
    if n_rows > 0:
        bonus_dots_kernel[(cdiv(n_rows, BR),)](q, k, u, do, v, out, n_rows, H=H, K=K, V=V, BR=BR, BK=BK, BV=BV,
                                               num_warps=4, **RECURRENT_OPTIONS)
    return out


# Steps per segment of the gate-gradient split (module docstring): a tl.dot dim (>= 16);
# the float32 checkpoints take N * ceil(T / SEGMENT) * H * K * V * 4 bytes.
SEGMENT = 16


def _configs(K: int, V: int, backward: bool, bonus: bool = False, channel_gate: bool = False) -> dict:
    """Block sizes: the state tile [BK, BV] in fp32 registers, ~64 registers a thread at
    4 warps in the forward. The backward (both passes) holds the state, its gradient and
    the segment's [BK, SEG] tiles at once: at 8 warps and a 64-wide V block that was ~235
    registers a thread (ptxas, sm90, K = 128), one program per SM, the programs in waves.
    No shared memory beyond Triton's reductions and the one small dot, on every arch.
    ``dq_BV`` and ``dq_warps`` are the backward's first pass (the forward kernel in its dq
    mode), which holds only the state and may split V its own way.

    ``split`` is how the backward's second pass divides a head's state between programs:
    "V" (the tile is [BK, BV]) or "K" (``rows_BK`` key rows by all of V). Under a
    per-channel gate (``channel_gate``: gla, rwkv6) the pass keeps, per key row, the
    segment's [SEG] gate exponentials and ``Y`` terms, whose ``dS v_s`` sums over all of V:
    split by V, each of a head's V blocks recomputes them for every key row (Nsight Compute
    on the H100, rwkv6 at BV 32: 255 registers and spills, 68.5% of cycles without an
    eligible warp, 20.8 ms). Split by K, each row's are computed once, dk and dg are whole
    in their program, and dv becomes the per-block share. Split by K only where all of V
    fits a 16-row tile of at most 2048 values (V <= 128)."""
    BK = block_size(K)
    if backward and channel_gate and block_size(V) <= 128:
        # 16 key rows by all of V at 2 warps. On the H100 (B=4 T=4096 H=16 K=V=128 bf16,
        # forward+backward, config_sweep.py): gla 21.5 ms against 27.4 split by V; rwkv6
        # 27.0 against 28.2 (38.1 at 32 rows and 4 warps, 60.7 at 64 and 8)
        return {**_configs(K, V, backward, bonus), "split": "K", "rows_BK": 16, "BV": block_size(V), "num_warps": 2}
    if bonus and BK <= 128:
        # rwkv6 (the bonus u): each step also forms q . (u ⊙ k) and the du partial sums.
        # On the H100 (fused_recurrent_rwkv6, same size; config_sweep.py): backward 28.7 ms
        # at BV 32 and 4 warps against 34.5 at 16 and 2; forward 2.16 ms at BV 16 and 2
        # warps against 2.64 at 64 and 4
        return dict(BK=BK, BV=32, num_warps=4, dq_BV=32, dq_warps=4) if backward else dict(BK=BK, BV=16, num_warps=2)
    if backward:
        # narrow V blocks, few warps: more, lighter programs, each a serial walk over T, so
        # more of them in flight hide each step's latency. On the H100 (fused_recurrent_gla,
        # B=4 T=4096 H=16 K=V=128 bf16, forward+backward): 27.2 ms at BV 16 and 2 warps,
        # 29.1 at 32 and 4, 33.5 at 16 and 4, 46.5 at 64 and 8 (the rule before)
        warps = 2 if BK <= 128 else 4
        return dict(BK=BK, BV=16, num_warps=warps, dq_BV=16, dq_warps=warps)
    BV = max(16, min(block_size(V), 8192 // BK))
    return dict(BK=BK, BV=BV, num_warps=4 if BK * BV <= 8192 else 8)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
             g_gamma: Optional[torch.Tensor], gk: Optional[torch.Tensor], u: Optional[torch.Tensor],
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool):
    """The forward launch; returns ``((o, final state or None), ())``: the backward
    replays the recurrence from the inputs. ``u``: rwkv6's bonus (module docstring)."""
    q, k, v, g, g_gamma, gk, u, initial_state = contiguous(q, k, v, g, g_gamma, gk, u, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    cfg = _configs(K, V, backward=False, bonus=u is not None)
    NV = cdiv(V, cfg["BV"])
    o = empty(v.shape, v.dtype, v.device)
    final_state = empty((N, H, K, V), torch.float32, q.device) if output_final_state else None
    fused_recurrent_fwd_kernel[(N * H * NV,)](
        q, k, v, g, g_gamma, gk, u, None, o, initial_state, final_state, None, cu_seqlens, scale, T, B * T,
        H=H, K=K, V=V, BK=cfg["BK"], BV=cfg["BV"], SEG=SEGMENT,
        USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, USE_GK=gk is not None, BONUS=u is not None,
        USE_H0=initial_state is not None, STORE_HT=final_state is not None, DQ_MODE=False,
        STORE_CHECKPOINTS=False, IS_VARLEN=cu_seqlens is not None, num_warps=cfg["num_warps"], **RECURRENT_OPTIONS,
    )
    return (o, final_state), ()


def _backward(grads, saved, q, k, v, g, g_gamma, gk, u, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, *, needs_grad):
    do, dht = grads
    q, k, v, g, g_gamma, gk, u, initial_state = contiguous(q, k, v, g, g_gamma, gk, u, initial_state)
    if do is None:  # only the final state was used
        do = torch.zeros_like(v)
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    gate = "gk" if gk is not None else "g"
    need_dgate = (gk is not None or g is not None) and needs_grad[gate]
    need_dh0 = initial_state is not None and needs_grad["initial_state"]
    dq, dk, dv, dgate, dh0, du = recurrent_backward(q, k, v, g, g_gamma, gk, do, dht, initial_state, cu_seqlens,
                                                    scale, N, need_dgate, need_dh0, u)
    return {"q": dq, "k": dk, "v": dv, gate: dgate, "u": du, "initial_state": dh0}


OPS = {name: library.register(name, _forward, _backward) for name in (
    "fused_recurrent_simple_gla", "fused_recurrent_retention", "fused_recurrent_linear_attn", "fused_recurrent_gla",
    "fused_recurrent_rwkv6")}


def recurrent_backward(q, k, v, g, g_gamma, gk, do, dht, initial_state, cu_seqlens, scale, N, need_dgate, need_dh0,
                       u=None):
    """dq, dk, dv, d(gate), d(initial_state) and du (None without the bonus u) of the
    recurrence, by the fused backward (module docstring); the gate is gk if given, else g
    (+ g_gamma, which gets no gradient)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    cfg = _configs(K, V, backward=True, bonus=u is not None, channel_gate=gk is not None)
    split_k = cfg.get("split") == "K"
    # the second pass's blocks: NP of them a head; dk and dg come in NV slabs (one with
    # split_k, whose programs hold whole key rows), dv in NP slabs when split_k
    tile_BK = cfg["rows_BK"] if split_k else cfg["BK"]
    NP = cdiv(K, tile_BK) if split_k else cdiv(V, cfg["BV"])
    NV, NV_Q = (1 if split_k else NP), cdiv(V, cfg["dq_BV"])
    do = do.contiguous()
    if dht is not None:
        dht = dht.contiguous()
    gate = gk if gk is not None else g
    dq_part = empty((NV_Q, B * T, H, K), torch.float32, q.device)
    dk_part = empty((NV, B * T, H, K), torch.float32, q.device)
    dg_part = empty((NV, *gate.shape), torch.float32, q.device) if need_dgate else None
    slots = state_slots(B, T, N, SEGMENT, cu_seqlens is not None)
    checkpoints = empty((slots, H, K, V), torch.float32, q.device) if need_dgate else None
    dv_partial = split_k and NP > 1
    dv = empty((NP, *v.shape) if dv_partial else v.shape, torch.float32 if dv_partial else v.dtype, v.device)
    dh0 = empty(initial_state.shape, initial_state.dtype, q.device) if need_dh0 else None
    du_part = empty((N * NV, H * K), torch.float32, q.device) if u is not None else None
    gates = dict(USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, USE_GK=gk is not None, BONUS=u is not None)
    bonus_dots = _bonus_dots(q, k, u, do, v) if u is not None else None
    fused_recurrent_fwd_kernel[(N * H * NV_Q,)](
        do, k, v, g, g_gamma, gk, u, bonus_dots, dq_part, initial_state, None, checkpoints, cu_seqlens, scale, T, B * T,
        H=H, K=K, V=V, BK=cfg["BK"], BV=cfg["dq_BV"], SEG=SEGMENT, **gates,
        USE_H0=initial_state is not None, STORE_HT=False, DQ_MODE=True, STORE_CHECKPOINTS=need_dgate,
        IS_VARLEN=cu_seqlens is not None, num_warps=cfg["dq_warps"], **RECURRENT_OPTIONS,
    )
    fused_recurrent_bwd_kernel[(N * H * NP,)](
        q, k, v, g, g_gamma, gk, u, bonus_dots, do, dk_part, dg_part, du_part, dv, dht, dh0, checkpoints, cu_seqlens,
        scale, T, B * T,
        H=H, K=K, V=V, BK=tile_BK, BV=cfg["BV"], SEG=SEGMENT, **gates, GATE_GRAD=need_dgate,
        GATE_F64=q.dtype == torch.float32, USE_DHT=dht is not None, STORE_DH0=need_dh0,
        IS_VARLEN=cu_seqlens is not None, PRECISION="tf32x3", SPLIT_K=split_k, DV_PARTIAL=dv_partial,
        num_warps=cfg["num_warps"], **RECURRENT_OPTIONS,
    )
    if dv_partial:
        dv = column_sum(dv.view(NP, -1), v.dtype).view(v.shape)

    dq, dk = empty(q.shape, q.dtype, q.device), empty(k.shape, k.dtype, k.device)
    dgate = empty(gate.shape, gate.dtype, gate.device) if need_dgate else None
    n_rows = B * T * H
    BR = max(16, 4096 // cfg["BK"])
    if n_rows > 0:
        fused_recurrent_reduce_kernel[(cdiv(n_rows, BR),)](
            dq_part, dk_part, dg_part, dq, dk, dgate, n_rows, NV_Q, NV,
            K=K, BR=BR, BK=cfg["BK"], GATE_GRAD=need_dgate, PER_CHANNEL=gk is not None, num_warps=4, **RECURRENT_OPTIONS,
        )
    du = column_sum(du_part, u.dtype).view(u.shape) if u is not None else None
    return dq, dk, dv, dgate, dh0, du


def fused_recurrent(op, q, k, v, g, g_gamma, gk, scale, initial_state, output_final_state, cu_seqlens,
                    cu_seqlens_cpu, gk_name="gk", u=None, q_name="q"):
    """Validate, then run the fused recurrence (``u``: rwkv6's bonus; ``q_name``: what the
    op calls q, for its error messages)."""
    shapes = check_gated_inputs(op, q, k, v, g=g, g_gamma=g_gamma, gk=gk, u=u, scale=scale,
                                initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                                gk_name=gk_name, q_name=q_name)
    return OPS[op](q, k, v, g, g_gamma, gk, u, initial_state, cu_seqlens, cu_seqlens_cpu, shapes.scale,
                   bool(output_final_state), offsets=shapes.offsets_host)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None):
    """simple_gla, one pass over T: ``S_t = e^{g_t} S_{t-1} + k_t v_t^T``; g ``[B, T, H]``
    and/or g_gamma ``[H]`` (constant, no gradient), gate ``g + g_gamma``."""
    return fused_recurrent("fused_recurrent_simple_gla", q, k, v, g, g_gamma, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_retention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None, cu_seqlens_cpu=None):
    """Retention, one pass over T: simple_gla with ``g_gamma[h] = log(1 - 2^(-5-h))``."""
    gamma = retention_gamma(q.shape[2], q.device) if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    return fused_recurrent("fused_recurrent_retention", q, k, v, None, gamma, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                cu_seqlens=None, cu_seqlens_cpu=None):
    """Linear attention, one pass over T: ``S_t = S_{t-1} + k_t v_t^T``."""
    return fused_recurrent("fused_recurrent_linear_attn", q, k, v, None, None, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, cu_seqlens_cpu=None):
    """GLA, one pass over T: ``S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T``, g ``[B, T, H, K]``."""
    if g is None:
        raise TypeError("fused_recurrent_gla: `g` must be a torch.Tensor [B, T, H, K], got None")
    return fused_recurrent("fused_recurrent_gla", q, k, v, None, None, g, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu, gk_name="g")
