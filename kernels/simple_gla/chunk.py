"""Chunked simple_gla (and its special cases retention and linear_attn), forward and backward.

Recurrence, per head (docs/ops.md): ``S_t = e^{g_t} S_{t-1} + k_t v_t^T``, ``o_t = S_t^T (scale q_t)``,
with a scalar log gate g ``[B, T, H]``, a constant one ``g_gamma [H]``, their sum, or none.

Chunk form (chunk size BT = 64). In a chunk starting with state ``H_c``, let
``b_t = sum_{s <= t in chunk} g_s`` (the within-chunk cumulative gate, computed in each
kernel that needs it from the raw gates: no separate cumsum pass) and ``L`` the chunk's
last token. Then

    o_t     = scale e^{b_t} q_t^T H_c + scale sum_{s <= t} e^{b_t - b_s} (q_t . k_s) v_s
    H_{c+1} = e^{b_L} H_c + sum_s e^{b_L - b_s} k_s v_s^T

Every exponent above is ``<= 0`` for ``s <= t`` (gates are ``<= 0``), and the causal mask
is applied to ``b_t - b_s`` *before* ``exp``, so strong decay cannot overflow.

Backward, with ``dH_c`` the gradient of the loss w.r.t. ``H_c`` (``dH_N = dS_T``):

    dH_c = e^{b_L} dH_{c+1} + scale sum_t e^{b_t} q_t do_t^T
    dA   = scale (do v^T) (.) e^{b_t - b_s} [t >= s];   A^T likewise from k q^T
    dq   = scale e^{b} (.) (do H_c^T) + dA k
    dk   = e^{b_L - b} (.) (v dH_{c+1}^T) + dA^T q
    dv   = A^T do + (e^{b_L - b} (.) k) dH_{c+1}
    dg_t = e^{g_t} <S_{t-1}, dS_t>                 (exact, per token; see below)

The gate gradient. The usual identity ``dg = reverse-cumsum(q . dq - k . dk)`` is exact
in real arithmetic but, under strong decay, adds up O(1) terms whose true sum is tiny
(``~e^{g}``): in fp32 its absolute error is ~1e-7 of ``|q . dq|`` and its relative error
on dg reaches 10-100% (measured at ``g = logsigmoid(x) / 0.01``). Instead each chunk
evaluates ``dg_t = e^{g_t} <S_{t-1}, dS_t>`` directly. With ``e^{g_t} S_{t-1} =
e^{b_t} H_c + sum_{s<t} e^{b_t - b_s} k_s v_s^T`` and ``dS_t = e^{b_L - b_t} dH_{c+1} +
scale sum_{u>=t} e^{b_u - b_t} q_u do_u^T``, the four cross products are

    dg_t = e^{b_L} <H_c, dH_{c+1}>                         (same for every t of the chunk)
         + sum_{u >= t} q_u . dq^inter_u                  dq^inter = scale e^{b} (.) (do H_c^T)
         + sum_{s < t}  k_s . dk^inter_s                  dk^inter = e^{b_L - b} (.) (v dH_{c+1}^T)
         + sum_{s < t <= u} A_us (do_u . v_s)             A as above (scale and decay in it)

Every factor carries its own decay ``e^{(<= 0)}``, nothing cancels, and no pass across
chunks is needed: dg comes out of the same kernel as dq, dk, dv.

Kernels and launches:

* ``chunk_state_pass_kernel``: one sequential pass over a sequence's chunks per
  (sequence, head, K block, V block). Forward it builds ``H_c`` from k, v (and stores it
  per chunk in the input dtype, plus the final state); with ``REVERSE`` it builds
  ``dH_{c+1}`` from q, do (and d initial_state). One kernel, two directions.
* ``chunk_output_kernel``: one program per (chunk, head) and V block, fully parallel:
  ``q H_c`` and the masked intra-chunk attention as tensor-core ``tl.dot``.
* ``chunk_grad_kernel``: one program per (chunk, head): dq, dk, dv and dg.

Forward: 2 launches. Backward: 2 launches. Where the gradient kernel does not fit the
target's shared memory (sm75; float32 with K > 128 on sm86/89/120; K > 128 on sm100) the
backward is the fused-recurrent one (``gated_recurrent.fused_recurrent``): exact, slower. The per-chunk states from the
forward are kept for the backward (memory ``N * ceil(T/64) * H * K * V`` elements in the
input dtype) rather than recomputed.

``g_gamma`` is treated as a constant: it gets no gradient. If both g and g_gamma are
given the gate is ``g + g_gamma``.

Varlen: chunks of all sequences are listed by ``kernels._utils.chunk_map``; sequence n's
chunk c stores its state in slot ``cu_seqlens[n] // BT + n + c`` of the per-chunk buffer
(``_sequence.state_slots``: injective, no host-side prefix sum).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch
from .. import _library as library
from .._arch import COMPILE_OPTIONS
from .._utils import block_size, cdiv, chunk_map, contiguous, empty
from ..gated_recurrent.fused_recurrent import recurrent_backward
from .._sequence import first_state_slot, sequence_bounds, state_slots
from ..gated_recurrent.inputs import check_gated_inputs, retention_gamma

CHUNK_SIZE = 64
# Where the chunk gradient kernel does not fit, gradients come from the fused-recurrent
# backward instead (registers only; exact, but sequential in T). The kernel keeps q and k
# [64, K] as dot operands; by offline compile it needs 131072 bytes for float32 at
# K = 256 (over sm86/89/120's 101376), and on sm75 (65536, no bf16 tensor cores) 122880
# bytes already at K = 128: sm75 always takes the fused backward.
FP32_WIDE_K_SMEM = 140 * 1024
SMALL_SMEM = 96 * 1024
_TRITON_3_8 = triton.__version__.startswith("3.8.")


def _chunk_grad_fits(K: int, dtype, gamma_only: bool = False) -> bool:
    smem = _arch.shared_memory_limit()
    if smem < SMALL_SMEM:
        return False
    if gamma_only and K > 128:
        # the constant-decay variant (retention) stages more at K = 256 (offline compile:
        # 278528 bytes for float32, 192512 for bf16 at 3 stages, 122880 at 1): only the
        # 16-bit one on sm90 fits
        return dtype != torch.float32 and smem >= 200 * 1024 and _arch.target_arch() < 100
    if _arch.target_arch() >= 100 and K > 128:
        # sm100's tensor-core path stages more: 237648 bytes for bf16 at K = 256 even with
        # the sm90 config, 393224 for fp32 (offline compile); K > 128 takes the fused backward
        return False
    if dtype == torch.float32 and _TRITON_3_8 and (K > 128 or (gamma_only and K > 64 and smem < FP32_WIDE_K_SMEM)):
        # Triton 3.8 holds the whole-K fp32 tiles in one more layout: 262144 bytes at
        # K = 256 on sm90 (limit 232448), and for the constant-decay variant at K = 128
        # 106496 or more on the 100 KB parts (limit 101376), whatever the warps, stages or
        # value block (offline compile, kernels/README.md); 3.6, 3.7 and 3.9 need 163840
        # and 81920 there
        return False
    return not (dtype == torch.float32 and K > 128 and smem < FP32_WIDE_K_SMEM)


@triton.jit
def _chunk_gate(g, g_gamma, bos, i_t, i_h, T_seq, H: tl.constexpr, BT: tl.constexpr,
                USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, GATE_F64: tl.constexpr):
    """Within-chunk cumulative gate ``b`` [BT] and its value at the chunk's last token.

    With GATE_F64 (fp32 inputs) ``b`` is float64: under strong decay ``|b|`` reaches
    thousands, and an fp32 ``b_t - b_s`` would carry an absolute error of ~ulp(|b|) ~ 1e-4
    in the exponent of every decay factor. Callers take differences first, then cast.
    """
    GATE_DTYPE: tl.constexpr = tl.float64 if GATE_F64 else tl.float32
    o_t = tl.arange(0, BT)
    m_t = i_t * BT + o_t < T_seq
    b = tl.zeros([BT], dtype=GATE_DTYPE)
    if USE_G:
        b = tl.cumsum(tl.load(g + (bos + i_t * BT + o_t) * H + i_h, mask=m_t, other=0.0).to(GATE_DTYPE), 0)
    if USE_G_GAMMA:
        b += tl.load(g_gamma + i_h).to(GATE_DTYPE) * (o_t + 1).to(GATE_DTYPE)
    n_valid = tl.minimum(T_seq - i_t * BT, BT)
    b_last = tl.sum(tl.where(o_t == n_valid - 1, b, 0.0), 0)
    return b, b_last, m_t


@triton.jit
def _chunk_coords(chunk_table, cu_seqlens, i_c, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """For global chunk i_c: (start token of its sequence, sequence length, chunk in
    sequence, slot of its state in the per-chunk state buffer)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_table + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_table + i_c * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T_seq = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
        slot = bos // BT + i_n + i_t
    else:
        NT = tl.cdiv(T, BT)
        i_n = i_c // NT
        i_t = (i_c % NT).to(tl.int32)
        bos = i_n * T
        T_seq = T
        slot = i_c
    return bos, T_seq, i_t, slot


@triton.jit
def chunk_state_pass_kernel(
    x, y, g, g_gamma, states, s0, s_end, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, GATE_F64: tl.constexpr, USE_S0: tl.constexpr, STORE_S_END: tl.constexpr,
    IS_VARLEN: tl.constexpr, REVERSE: tl.constexpr, PRECISION: tl.constexpr,
):
    """Sequential pass over one sequence's chunks for a [BK, BV] tile of the state.

    Forward (x = k, y = v, scale = 1): stores ``H_c`` for each chunk, then
    ``H_{c+1} = e^{b_L} H_c + (k (.) e^{b_L - b})^T v``.
    Reverse (x = q, y = do): walks chunks backwards, stores ``dH_{c+1}`` for each chunk,
    then ``dH_c = e^{b_L} dH_{c+1} + scale (q (.) e^{b})^T do``.
    Rows and columns of the state evolve independently (the gate is a scalar), so the
    K and V blocks run in separate programs.
    """
    i_nh = tl.program_id(0).to(tl.int64)
    i_kv = tl.program_id(1)
    NV = tl.cdiv(V, BV)
    i_k = i_kv // NV
    i_v = i_kv % NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, T_seq = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    slot0 = first_state_slot(bos, i_n, T, BT, IS_VARLEN)

    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    tile = o_k[:, None] * V + o_v[None, :]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_S0:
        S += tl.load(s0 + i_nh * K * V + tile, mask=m_kv, other=0.0).to(tl.float32)

    NT = tl.cdiv(T_seq, BT)
    for i in range(NT):
        scale_c = scale
        if REVERSE:
            i_t = NT - 1 - i
        else:
            i_t = i
        tl.store(states + ((slot0 + i_t) * H + i_h) * K * V + tile, S.to(states.dtype.element_ty), mask=m_kv)
        t = bos + i_t * BT + o_t
        m_t = i_t * BT + o_t < T_seq
        xT = tl.load(x + (t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        yb = tl.load(y + (t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
        if USE_G or USE_G_GAMMA:
            b, b_last, m_t = _chunk_gate(g, g_gamma, bos, i_t, i_h, T_seq, H, BT, USE_G, USE_G_GAMMA, GATE_F64)
            if REVERSE:
                # e^{b_t} = e^{b_0} e^{b_t - b_0}: the largest factor (b_0, gates <= 0) is
                # applied in fp32 after the dot, so a 16-bit operand never holds e^{b_0}
                # itself (under strong decay it is ~e^{-70} and would flush to zero in fp16)
                b_0 = tl.sum(tl.where(o_t == 0, b, 0.0), 0)
                w = tl.exp(tl.where(m_t, (b - b_0).to(tl.float32), float("-inf")))
                scale_c = scale * tl.exp(b_0.to(tl.float32))
            else:
                w = tl.exp(tl.where(m_t, (b_last - b).to(tl.float32), float("-inf")))
            xT = (xT * w[None, :]).to(xT.dtype)
            S *= tl.exp(b_last.to(tl.float32))
        if REVERSE:
            S += scale_c * tl.dot(xT, yb, input_precision=PRECISION)
        else:
            S = tl.dot(xT, yb, S, input_precision=PRECISION)
    if STORE_S_END:
        tl.store(s_end + i_nh * K * V + tile, S.to(s_end.dtype.element_ty), mask=m_kv)


@triton.jit
def chunk_output_kernel(
    q, k, v, g, g_gamma, states, o, chunk_table, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, GATE_F64: tl.constexpr, IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr,
):
    """``o = scale (e^{b} (.) (q H_c) + (q k^T (.) e^{b_t - b_s} [t >= s]) v)`` for one chunk."""
    i_ch = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    i_c = i_ch // H
    i_h = i_ch % H
    bos, T_seq, i_t, slot = _chunk_coords(chunk_table, cu_seqlens, i_c, T, BT, IS_VARLEN)

    o_t = tl.arange(0, BT)
    t = bos + i_t * BT + o_t
    m_t = i_t * BT + o_t < T_seq
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        qb = tl.load(q + (t[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
        kT = tl.load(k + (t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.0)
        hb = tl.load(states + (slot * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                     mask=m_k[:, None] & m_v[None, :], other=0.0)
        acc = tl.dot(qb, hb, acc, input_precision=PRECISION)
        A = tl.dot(qb, kT, A, input_precision=PRECISION)

    causal = o_t[:, None] >= o_t[None, :]
    if USE_G or USE_G_GAMMA:
        b, b_last, m_t = _chunk_gate(g, g_gamma, bos, i_t, i_h, T_seq, H, BT, USE_G, USE_G_GAMMA, GATE_F64)
        acc *= tl.exp(b.to(tl.float32))[:, None]
        A *= tl.exp(tl.where(causal, (b[:, None] - b[None, :]).to(tl.float32), float("-inf")))
    else:
        A = tl.where(causal, A, 0.0)
    vb = tl.load(v + (t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.0)
    acc = tl.dot(A.to(vb.dtype), vb, acc, input_precision=PRECISION)
    tl.store(o + (t[:, None] * H + i_h) * V + o_v[None, :], (acc * scale).to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit
def _chunk_gate_grad(qb, kb, dA_raw, dq_inter_raw, dk_inter_raw, hdh, b, b_last, scale, k_decay,
                     PRECISION: tl.constexpr):
    """``dg_t = e^{g_t} <S_{t-1}, dS_t>`` for the chunk's tokens (module docstring).

    ``dA_raw = do v^T``; ``dq_inter_raw = do H_c^T`` and ``dk_inter_raw = v dH_{c+1}^T``
    before their decays; ``hdh = <H_c, dH_{c+1}>``. The attention matrix is recomputed
    here rather than kept from before the V loop: holding it across the loop made the
    kernel spill registers.
    """
    o_t = tl.arange(0, dA_raw.shape[0])
    x = tl.sum(qb.to(tl.float32) * dq_inter_raw, 1) * scale * tl.exp(b.to(tl.float32))
    y = tl.sum(kb.to(tl.float32) * dk_inter_raw, 1) * k_decay
    # M[u, s] = A_us (do_u . v_s) for s < u; a token t collects the pairs s < t <= u
    strict = o_t[:, None] > o_t[None, :]
    A = tl.dot(qb, tl.trans(kb), input_precision=PRECISION)
    M = A * dA_raw * scale * tl.exp(tl.where(strict, (b[:, None] - b[None, :]).to(tl.float32), float("-inf")))
    before_t = tl.cumsum(M, 1) - M  # [u, t] -> sum_{s < t} M[u, s]
    crossing = tl.sum(tl.where(o_t[:, None] >= o_t[None, :], before_t, 0.0), 0)
    return tl.exp(b_last.to(tl.float32)) * hdh + tl.cumsum(x, 0, reverse=True) + (tl.cumsum(y, 0) - y) + crossing


@triton.jit
def _value_blocks_bwd(v, do, states, dstates, dv, AT, k_dec, t, m_t, o_k, m_k, i_h, state_base,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, STORE_DG: tl.constexpr, PRECISION: tl.constexpr):
    """A chunk's walk over value blocks: stores dv = A^T do + (decayed k) dH_{c+1}; returns
    dA = do v^T, do H_c^T, v dH_{c+1}^T (undecayed) and, with STORE_DG, the row sums of
    H_c * dH_{c+1} (``<H_c, dH_{c+1}>`` once summed over K)."""
    hdh = tl.zeros([BK], dtype=tl.float32)
    dq_acc = tl.zeros([BT, BK], dtype=tl.float32)
    dk_acc = tl.zeros([BT, BK], dtype=tl.float32)
    dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        m_kv = m_k[:, None] & m_v[None, :]
        tv_offs = (t[:, None] * H + i_h) * V + o_v[None, :]
        kv_offs = state_base + o_k[:, None] * V + o_v[None, :]
        vb = tl.load(v + tv_offs, mask=m_tv, other=0.0)
        dob = tl.load(do + tv_offs, mask=m_tv, other=0.0)
        hb = tl.load(states + kv_offs, mask=m_kv, other=0.0)
        dhb = tl.load(dstates + kv_offs, mask=m_kv, other=0.0)
        if STORE_DG:
            hdh += tl.sum(hb.to(tl.float32) * dhb.to(tl.float32), 1)
        dA = tl.dot(dob, tl.trans(vb), dA, input_precision=PRECISION)
        dq_acc = tl.dot(dob, tl.trans(hb), dq_acc, input_precision=PRECISION)
        dk_acc = tl.dot(vb, tl.trans(dhb), dk_acc, input_precision=PRECISION)
        dvb = tl.dot(AT, dob, input_precision=PRECISION)
        dvb = tl.dot(k_dec, dhb, dvb, input_precision=PRECISION)
        tl.store(dv + tv_offs, dvb.to(dv.dtype.element_ty), mask=m_tv)
    return dA, dq_acc, dk_acc, hdh


@triton.jit
def chunk_grad_kernel(
    q, k, v, g, g_gamma, states, dstates, do, dq, dk, dv, dg, chunk_table, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, GATE_F64: tl.constexpr, STORE_DG: tl.constexpr,
    IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr,
):
    """dq, dk, dv and (with STORE_DG) dg of one chunk.

    The whole key dim is in one program (BK >= K): the attention matrix needs all of it,
    and dv needs the attention matrix. The value dim is walked in blocks of BV.
    """
    i_ch = tl.program_id(0).to(tl.int64)
    i_c = i_ch // H
    i_h = i_ch % H
    bos, T_seq, i_t, slot = _chunk_coords(chunk_table, cu_seqlens, i_c, T, BT, IS_VARLEN)
    state_base = (slot * H + i_h) * K * V

    o_t = tl.arange(0, BT)
    t = bos + i_t * BT + o_t
    m_t = i_t * BT + o_t < T_seq
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    qk_offs = (t[:, None] * H + i_h) * K + o_k[None, :]
    qb = tl.load(q + qk_offs, mask=m_tk, other=0.0)
    kb = tl.load(k + qk_offs, mask=m_tk, other=0.0)

    # AT[s, t] = scale (k_s . q_t) e^{b_t - b_s} for s <= t
    AT = tl.dot(kb, tl.trans(qb), input_precision=PRECISION) * scale
    anti_causal = o_t[:, None] <= o_t[None, :]
    if USE_G or USE_G_GAMMA:
        b, b_last, m_t = _chunk_gate(g, g_gamma, bos, i_t, i_h, T_seq, H, BT, USE_G, USE_G_GAMMA, GATE_F64)
        AT *= tl.exp(tl.where(anti_causal, (b[None, :] - b[:, None]).to(tl.float32), float("-inf")))
        k_decay = tl.exp(tl.where(m_t, (b_last - b).to(tl.float32), float("-inf")))
        k_dec = (kb * k_decay[:, None]).to(kb.dtype)
    else:
        AT = tl.where(anti_causal, AT, 0.0)
        k_dec = kb
    AT = AT.to(kb.dtype)

    dA, dq_acc, dk_acc, hdh = _value_blocks_bwd(v, do, states, dstates, dv, AT, k_dec, t, m_t, o_k, m_k, i_h,
                                                state_base, H, K, V, BT, BK, BV, STORE_DG, PRECISION)

    causal = o_t[:, None] >= o_t[None, :]
    if STORE_DG:
        dg_chunk = _chunk_gate_grad(qb, kb, dA, dq_acc, dk_acc, tl.sum(hdh, 0), b, b_last, scale, k_decay, PRECISION)
        tl.store(dg + t * H + i_h, dg_chunk.to(dg.dtype.element_ty), mask=m_t)
    if USE_G or USE_G_GAMMA:
        dA *= scale * tl.exp(tl.where(causal, (b[:, None] - b[None, :]).to(tl.float32), float("-inf")))
        dq_acc *= scale * tl.exp(b.to(tl.float32))[:, None]
        dk_acc *= k_decay[:, None]
    else:
        dA = tl.where(causal, dA * scale, 0.0)
        dq_acc *= scale
    dA = dA.to(kb.dtype)
    dq_acc = tl.dot(dA, kb, dq_acc, input_precision=PRECISION)
    dk_acc = tl.dot(tl.trans(dA), qb, dk_acc, input_precision=PRECISION)
    tl.store(dq + qk_offs, dq_acc.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + qk_offs, dk_acc.to(dk.dtype.element_ty), mask=m_tk)


def _precision(dtype) -> str:
    # fp32 operands: three tf32 products, close to fp32; 16-bit operands ignore this
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _configs(K: int, V: int, dtype, gated: bool = True) -> dict:
    """Block sizes, warps and stages per kernel, from the target arch's shared-memory budget.

    Timed on an H200 (bf16, B=4 T=4096 H=16 K=V=128): state pass 0.092 ms at BK=BV=64,
    4 warps, 3 stages (2 stages: 0.122; BV=32: 0.112); output 0.120 ms at BK=64, BV=128,
    4 warps, 3 stages (BK=128: 0.20); gradient with dg 0.46 ms at BV=64, 8 warps, 3 stages
    (2 stages: 0.506; BV=32: 0.54; 4 warps: 0.79), without dg 0.33 ms. Shared memory, by offline compile, stays within every
    arch's limit at K = V = 64..256 (sm86/89 take smaller V blocks for K = 256).
    """
    big_smem = _arch.shared_memory_limit() >= 160 * 1024
    huge_smem = _arch.shared_memory_limit() >= 200 * 1024  # sm90, sm100
    fast = big_smem and dtype != torch.float32  # 16-bit operands on a large-smem arch
    BKf = block_size(K)
    return {
        # state pass: small tiles, many programs (B * H * NK * NV), pipelined loads
        "state": dict(BK=min(BKf, 64), BV=min(block_size(V), 64 if dtype != torch.float32 else 32), num_warps=4,
                      num_stages=3 if fast else 2),
        # output: K walked in blocks of 64, V blocks on grid axis 1
        "output": dict(BK=min(BKf, 64), BV=min(block_size(V), 128 if fast else 64), num_warps=4,
                       num_stages=3 if fast else 2),
        # gradients: the whole K per program, V in blocks
        # gradients: the whole K per program, V in blocks; without a gate the kernel is
        # lighter and runs best with 4 warps and narrower V blocks (0.198 vs 0.280 ms)
        "grad": dict(BK=BKf, BV=min(block_size(V), 64 if (BKf <= 128 and fast and gated) else 16 if (BKf > 128 and not big_smem) else 32),
                     num_warps=8 if (BKf >= 128 and (gated or BKf > 128)) else 4,
                     # fp32 at K = 256 and two stages takes 172 KB under Triton 3.8 (over sm80's 163 KB)
                     num_stages=3 if fast else (2 if big_smem and (BKf <= 128 or huge_smem) else 1)),
    }


def _launch_state_pass(x, y, g, g_gamma, states, s0, s_end, cu_seqlens, scale, T, N, H, K, V, reverse, cfg):
    c = cfg["state"]
    grid = (N * H, cdiv(K, c["BK"]) * cdiv(V, c["BV"]))
    chunk_state_pass_kernel[grid](
        x, y, g, g_gamma, states, s0, s_end, cu_seqlens, scale, T,
        H=H, K=K, V=V, BT=CHUNK_SIZE, BK=c["BK"], BV=c["BV"],
        USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, GATE_F64=x.dtype == torch.float32,
        USE_S0=s0 is not None,
        STORE_S_END=s_end is not None, IS_VARLEN=cu_seqlens is not None, REVERSE=reverse,
        PRECISION=_precision(x.dtype), num_warps=c["num_warps"], num_stages=c["num_stages"], **COMPILE_OPTIONS,
    )


def _chunk_grid(B: int, T: int, offsets_host, device):
    """(number of chunks, chunk table or None)."""
    if offsets_host is None:
        return B * cdiv(T, CHUNK_SIZE), None
    table = chunk_map(offsets_host, CHUNK_SIZE, device)
    return table.shape[0], table


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor],
             g_gamma: Optional[torch.Tensor], initial_state: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], cu_seqlens_cpu: Optional[torch.Tensor], scale: float,
             output_final_state: bool, *, keep, offsets):
    """The forward launches; returns ``((o, final state or None), (chunk states,))``."""
    q, k, v, g, g_gamma, initial_state = contiguous(q, k, v, g, g_gamma, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    cfg = _configs(K, V, q.dtype)
    states = empty((state_slots(B, T, N, CHUNK_SIZE, cu_seqlens is not None), H, K, V), q.dtype, q.device)
    final_state = empty((N, H, K, V), torch.float32, q.device) if output_final_state else None
    _launch_state_pass(k, v, g, g_gamma, states, initial_state, final_state, cu_seqlens, 1.0,
                       T, N, H, K, V, False, cfg)
    o = empty(v.shape, v.dtype, v.device)
    n_chunks, table = _chunk_grid(B, T, offsets, q.device)
    c = cfg["output"]
    if n_chunks > 0:
        chunk_output_kernel[(n_chunks * H, cdiv(V, c["BV"]))](
            q, k, v, g, g_gamma, states, o, table, cu_seqlens, scale, T,
            H=H, K=K, V=V, BT=CHUNK_SIZE, BK=c["BK"], BV=c["BV"],
            USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, GATE_F64=q.dtype == torch.float32,
            IS_VARLEN=cu_seqlens is not None,
            PRECISION=_precision(q.dtype), num_warps=c["num_warps"], num_stages=c["num_stages"], **COMPILE_OPTIONS,
        )
    return (o, final_state), (states,) if keep else ()


def _backward(grads, saved, q, k, v, g, g_gamma, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, *, needs_grad, offsets):
    (states,) = saved
    q, k, v, g, g_gamma, initial_state, do, dht = contiguous(q, k, v, g, g_gamma, initial_state, *grads)
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    cfg = _configs(K, V, q.dtype, gated=g is not None or g_gamma is not None)
    need_dg = g is not None and needs_grad["g"]
    need_dh0 = initial_state is not None and needs_grad["initial_state"]
    if not _chunk_grad_fits(K, q.dtype, gamma_only=g is None and g_gamma is not None):
        dq, dk, dv, dg, dh0, _ = recurrent_backward(
            q, k, v, g, g_gamma, None, do, dht, initial_state, cu_seqlens, scale, N, need_dg, need_dh0)
        return dict(q=dq, k=dk, v=dv, g=dg, initial_state=dh0)
    dstates = empty(states.shape, q.dtype, q.device)
    dh0 = empty((N, H, K, V), initial_state.dtype, q.device) if need_dh0 else None
    _launch_state_pass(q, do, g, g_gamma, dstates, dht, dh0, cu_seqlens, scale, T, N, H, K, V, True, cfg)

    dq, dk, dv = empty(q.shape, q.dtype, q.device), empty(k.shape, k.dtype, k.device), empty(v.shape, v.dtype, v.device)
    dg = empty(g.shape, g.dtype, g.device) if need_dg else None
    n_chunks, table = _chunk_grid(B, T, offsets, q.device)
    c = cfg["grad"]
    if n_chunks > 0:
        chunk_grad_kernel[(n_chunks * H,)](
            q, k, v, g, g_gamma, states, dstates, do, dq, dk, dv, dg, table, cu_seqlens, scale, T,
            H=H, K=K, V=V, BT=CHUNK_SIZE, BK=c["BK"], BV=c["BV"],
            USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, GATE_F64=q.dtype == torch.float32,
            STORE_DG=need_dg,
            IS_VARLEN=cu_seqlens is not None, PRECISION=_precision(q.dtype),
            num_warps=c["num_warps"], num_stages=c["num_stages"], **COMPILE_OPTIONS,
        )
    return dict(q=dq, k=dk, v=dv, g=dg, initial_state=dh0)


OPS = {name: library.register(name, _forward, _backward)
       for name in ("chunk_simple_gla", "chunk_retention", "chunk_linear_attn")}


def _chunk_gated(op, q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
    shapes = check_gated_inputs(op, q, k, v, g=g, g_gamma=g_gamma, scale=scale, initial_state=initial_state,
                                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    return OPS[op](q, k, v, g, g_gamma, initial_state, cu_seqlens, cu_seqlens_cpu, shapes.scale,
                   bool(output_final_state), offsets=shapes.offsets_host)


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, cu_seqlens_cpu=None):
    """simple_gla, chunked: ``S_t = e^{g_t} S_{t-1} + k_t v_t^T``, ``o_t = S_t^T (scale q_t)``.

    q, k ``[B, T, H, K]``, v ``[B, T, H, V]``; g ``[B, T, H]`` (log gate, ``<= 0``) and/or
    g_gamma ``[H]`` (constant log gate; no gradient), gate ``g + g_gamma``; neither gives
    plain linear attention. Returns ``(o, final_state)``. See the module docstring.
    """
    return _chunk_gated("chunk_simple_gla", q, k, v, g, g_gamma, scale, initial_state, output_final_state,
                        cu_seqlens, cu_seqlens_cpu)


def chunk_retention(q, k, v, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                    cu_seqlens_cpu=None):
    """Retention: simple_gla with ``g_gamma[h] = log(1 - 2^(-5-h))``."""
    gamma = retention_gamma(q.shape[2], q.device) if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    return _chunk_gated("chunk_retention", q, k, v, None, gamma, scale, initial_state, output_final_state,
                        cu_seqlens, cu_seqlens_cpu)


def chunk_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                      cu_seqlens_cpu=None):
    """Linear attention: ``S_t = S_{t-1} + k_t v_t^T`` (simple_gla without a gate)."""
    return _chunk_gated("chunk_linear_attn", q, k, v, None, None, scale, initial_state, output_final_state,
                        cu_seqlens, cu_seqlens_cpu)
