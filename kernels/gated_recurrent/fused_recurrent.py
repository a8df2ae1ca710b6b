"""Fused-recurrent kernels for the gated linear recurrences, forward and backward.

One kernel pair serves linear_attn, simple_gla, retention and gla (OPS.md):

    S_t = diag(e^{a_t}) S_{t-1} + k_t v_t^T,     o_t = S_t^T (scale q_t)

with the gate ``a_t`` chosen by constexpr switches: none; a scalar log gate g ``[B, T, H]``;
a constant one g_gamma ``[H]`` (added to g when both are given); a per-channel one gk
``[B, T, H, K]``. The state tile ``[K, BV]`` lives in registers for one pass over T; its
columns evolve independently, so V is split into blocks of BV across programs (the whole
K is one block, K <= 256).

Backward (one program per (sequence, head, V block)), two passes over T:

1. forward in time, recomputing ``S_t`` from the initial state exactly as the forward
   did (only multiplications by ``e^{a} <= 1`` and additions):
   ``dq_t = scale S_t do_t``;
2. backward in time with ``dS_t = scale q_t do_t^T + diag(e^{a_{t+1}}) dS_{t+1}``
   (``dS_T`` = the final state's gradient): ``dk_t = dS_t v_t``, ``dv_t = dS_t^T k_t``;
   what is left, ``diag(e^{a_1}) dS_1``, is the initial state's gradient.

The state is never reconstructed backwards (``S_{t-1} = e^{-a_t}(S_t - k_t v_t^T)``
divides by ``e^{a_t}``, which underflows to 0 under strong decay and turns into inf/NaN),
so both passes are as well conditioned as the forward.

dq and dk get one partial sum per V block (each block sees part of the state); a
reduction kernel adds them up and casts them. The gate gradients come from dq and dk
through the identity in ``gate_grad.py`` (a reverse cumsum over time).

Launches: forward 1; backward 2 (+1 for a gate gradient). Grid axis 0 carries
``N * H * NV``; nothing large goes on axes 1 and 2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _arch
from .._utils import block_size, cdiv, empty
from .gate_grad import gate_grad
from .indexing import sequence_span
from .inputs import check_gated_inputs, retention_gamma


@triton.jit
def _program_tile(cu_seqlens, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's (sequence, head, V block): the head, the sequence's span, the state
    tile's column indices and masks, and the tile's offsets in a [N, H, K, V] state."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_nh = pid // NV
    i_v = pid % NV
    i_h = i_nh % H
    bos, T_seq = sequence_span(cu_seqlens, i_nh // H, T, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    tile = i_nh * K * V + o_k[:, None] * V + o_v[None, :]
    return i_v, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile


@triton.jit
def _step_decay(g, g_gamma, gk, row, i_h, o_k, m_k, K: tl.constexpr, USE_G: tl.constexpr,
                USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr):
    """``e^{a_t}`` for the step at (token, head) ``row``, as a [BK] vector (rows of the state)."""
    a = tl.zeros(o_k.shape, dtype=tl.float32)
    if USE_G:
        a += tl.load(g + row).to(tl.float32)
    if USE_G_GAMMA:
        a += tl.load(g_gamma + i_h).to(tl.float32)
    if USE_GK:
        a += tl.load(gk + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    return tl.exp(a)


@triton.jit
def _advance_state(S, k, v, g, g_gamma, gk, row, i_h, o_k, o_v, m_k, m_v, K: tl.constexpr, V: tl.constexpr,
                   USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr):
    """``S_t = diag(e^{a_t}) S_{t-1} + k_t v_t^T`` for the step at (token, head) ``row``."""
    bk = tl.load(k + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    bv = tl.load(v + row * V + o_v, mask=m_v, other=0.0).to(tl.float32)
    if USE_G or USE_G_GAMMA or USE_GK:
        S *= _step_decay(g, g_gamma, gk, row, i_h, o_k, m_k, K, USE_G, USE_G_GAMMA, USE_GK)[:, None]
    return S + bk[:, None] * bv[None, :]


@triton.jit
def fused_recurrent_fwd_kernel(
    q, k, v, g, g_gamma, gk, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    i_v, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile = _program_tile(cu_seqlens, T, H, K, V, BK, BV, IS_VARLEN)
    m_kv = m_k[:, None] & m_v[None, :]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + tile, mask=m_kv, other=0.0)
    row = bos * H + i_h  # (token, head) row of the current step
    for _ in range(T_seq):
        S = _advance_state(S, k, v, g, g_gamma, gk, row, i_h, o_k, o_v, m_k, m_v, K, V, USE_G, USE_G_GAMMA, USE_GK)
        bq = tl.load(q + row * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        tl.store(o + row * V + o_v, (tl.sum(S * bq[:, None], 0) * scale).to(o.dtype.element_ty), mask=m_v)
        row += H
    if STORE_HT:
        tl.store(ht + tile, S, mask=m_kv)


@triton.jit
def fused_recurrent_bwd_kernel(
    q, k, v, g, g_gamma, gk, do, dq_part, dk_part, dv, h0, dht, dh0, cu_seqlens, scale, T, n_rows,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_G_GAMMA: tl.constexpr, USE_GK: tl.constexpr,
    USE_H0: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """Both backward passes for one (sequence, head, V block); see the module docstring.

    ``dq_part``/``dk_part`` are float32 ``[NV, B*T, H, K]`` (``n_rows = B*T``): this
    block's share of dq and dk.
    """
    GATED: tl.constexpr = USE_G or USE_G_GAMMA or USE_GK
    i_v, i_h, bos, T_seq, o_k, o_v, m_k, m_v, tile = _program_tile(cu_seqlens, T, H, K, V, BK, BV, IS_VARLEN)
    m_kv = m_k[:, None] & m_v[None, :]
    slab = i_v * n_rows * H * K

    # pass 1: forward in time, dq_t = scale S_t do_t
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + tile, mask=m_kv, other=0.0)
    row = bos * H + i_h  # (token, head) row of the current step
    for _ in range(T_seq):
        S = _advance_state(S, k, v, g, g_gamma, gk, row, i_h, o_k, o_v, m_k, m_v, K, V, USE_G, USE_G_GAMMA, USE_GK)
        bdo = tl.load(do + row * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        tl.store(dq_part + slab + row * K + o_k, tl.sum(S * bdo[None, :], 1) * scale, mask=m_k)
        row += H

    # pass 2: backward in time
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + tile, mask=m_kv, other=0.0)
    for _ in range(T_seq):
        row -= H
        p_qk = row * K + o_k
        p_v = row * V + o_v
        bq = tl.load(q + p_qk, mask=m_k, other=0.0).to(tl.float32)
        bk = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        bv = tl.load(v + p_v, mask=m_v, other=0.0).to(tl.float32)
        bdo = tl.load(do + p_v, mask=m_v, other=0.0).to(tl.float32)
        dS += (bq * scale)[:, None] * bdo[None, :]
        tl.store(dk_part + slab + p_qk, tl.sum(dS * bv[None, :], 1), mask=m_k)
        tl.store(dv + p_v, tl.sum(dS * bk[:, None], 0).to(dv.dtype.element_ty), mask=m_v)
        if GATED:
            dS *= _step_decay(g, g_gamma, gk, row, i_h, o_k, m_k, K, USE_G, USE_G_GAMMA, USE_GK)[:, None]
    if STORE_DH0:
        tl.store(dh0 + tile, dS, mask=m_kv)


@triton.jit
def fused_recurrent_reduce_kernel(
    q, k, dq_part, dk_part, dq, dk, dB, n_rows, NV,
    K: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
    GATE_GRAD: tl.constexpr, PER_CHANNEL: tl.constexpr,
):
    """dq, dk = sums of the V-block partials; with GATE_GRAD also ``dL/dB = q (.) dq - k (.) dk``
    (summed over K for a scalar gate). ``n_rows`` counts (token, head) rows."""
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m_r = o_r < n_rows
    m = m_r[:, None] & (o_k < K)[None, :]
    offs = o_r[:, None] * K + o_k[None, :]
    bdq = tl.zeros([BR, BK], dtype=tl.float32)
    bdk = tl.zeros([BR, BK], dtype=tl.float32)
    for i_v in range(NV):
        slab = i_v * n_rows * K
        bdq += tl.load(dq_part + slab + offs, mask=m, other=0.0)
        bdk += tl.load(dk_part + slab + offs, mask=m, other=0.0)
    tl.store(dq + offs, bdq.to(dq.dtype.element_ty), mask=m)
    tl.store(dk + offs, bdk.to(dk.dtype.element_ty), mask=m)
    if GATE_GRAD:
        bq = tl.load(q + offs, mask=m, other=0.0).to(tl.float32)
        bk = tl.load(k + offs, mask=m, other=0.0).to(tl.float32)
        db = bq * bdq - bk * bdk
        if PER_CHANNEL:
            tl.store(dB + offs, db, mask=m)
        else:
            tl.store(dB + o_r, tl.sum(db, 1), mask=m_r)


def _configs(K: int, V: int) -> dict:
    """Block sizes: the state tile [BK, BV] in fp32 registers, ~64 per thread at 4 warps
    (forward) and the same in the backward, whose passes hold one tile at a time.
    Registers only: no shared memory beyond Triton's reductions, on every arch."""
    BK = block_size(K)
    BV = max(16, min(block_size(V), 8192 // BK))
    if _arch.target_arch() < 80:
        BV = max(16, BV // 2)
    return dict(BK=BK, BV=BV, num_warps=4 if BK * BV <= 8192 else 8)


class FusedRecurrentFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, g_gamma, gk, scale, initial_state, output_final_state, cu_seqlens, N):
        B, T, H, K = q.shape
        V = v.shape[-1]
        cfg = _configs(K, V)
        NV = cdiv(V, cfg["BV"])
        o = empty(v.shape, v.dtype, v.device)
        final_state = empty((N, H, K, V), torch.float32, q.device) if output_final_state else None
        fused_recurrent_fwd_kernel[(N * H * NV,)](
            q, k, v, g, g_gamma, gk, o, initial_state, final_state, cu_seqlens, scale, T,
            H=H, K=K, V=V, BK=cfg["BK"], BV=cfg["BV"],
            USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, USE_GK=gk is not None,
            USE_H0=initial_state is not None, STORE_HT=final_state is not None, IS_VARLEN=cu_seqlens is not None,
            num_warps=cfg["num_warps"],
        )
        ctx.save_for_backward(q, k, v, g, g_gamma, gk, initial_state, final_state, cu_seqlens)
        ctx.scale, ctx.N = scale, N
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, g_gamma, gk, initial_state, final_state, cu_seqlens = ctx.saved_tensors
        scale, N = ctx.scale, ctx.N
        B, T, H, K = q.shape
        V = v.shape[-1]
        cfg = _configs(K, V)
        NV = cdiv(V, cfg["BV"])
        do = do.contiguous()
        if dht is not None:
            dht = dht.contiguous()
        dq_part = empty((NV, B * T, H, K), torch.float32, q.device)
        dk_part = empty((NV, B * T, H, K), torch.float32, q.device)
        dv = empty(v.shape, v.dtype, v.device)
        need_dh0 = initial_state is not None and ctx.needs_input_grad[7]
        dh0 = empty(initial_state.shape, torch.float32, q.device) if need_dh0 else None
        fused_recurrent_bwd_kernel[(N * H * NV,)](
            q, k, v, g, g_gamma, gk, do, dq_part, dk_part, dv, initial_state, dht, dh0, cu_seqlens, scale, T, B * T,
            H=H, K=K, V=V, BK=cfg["BK"], BV=cfg["BV"],
            USE_G=g is not None, USE_G_GAMMA=g_gamma is not None, USE_GK=gk is not None,
            USE_H0=initial_state is not None, USE_DHT=dht is not None, STORE_DH0=need_dh0,
            IS_VARLEN=cu_seqlens is not None, num_warps=cfg["num_warps"],
        )

        gate = gk if gk is not None else g
        gate_index = 5 if gk is not None else 3
        need_dgate = gate is not None and ctx.needs_input_grad[gate_index]
        dq, dk = empty(q.shape, q.dtype, q.device), empty(k.shape, k.dtype, k.device)
        dB = None
        if need_dgate:
            dB = empty(gate.shape, torch.float32, q.device)
        n_rows = B * T * H
        BR = max(16, 4096 // cfg["BK"])
        if n_rows > 0:
            fused_recurrent_reduce_kernel[(cdiv(n_rows, BR),)](
                q, k, dq_part, dk_part, dq, dk, dB, n_rows, NV,
                K=K, BR=BR, BK=cfg["BK"], GATE_GRAD=need_dgate, PER_CHANNEL=gk is not None, num_warps=4,
            )
        dgate = None
        if need_dgate:
            dgate = gate_grad(dB, dht, final_state, cu_seqlens, N, K, V, gate.dtype)
        dg = dgate if gk is None else None
        dgk = dgate if gk is not None else None
        return dq, dk, dv, dg, None, dgk, None, dh0, None, None, None


def _fused_recurrent(op, q, k, v, g, g_gamma, gk, scale, initial_state, output_final_state, cu_seqlens,
                     cu_seqlens_cpu):
    shapes = check_gated_inputs(op, q, k, v, g=g, g_gamma=g_gamma, gk=gk, scale=scale,
                                initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu)
    q, k, v, g, g_gamma, gk, initial_state = (
        None if t is None else t.contiguous() for t in (q, k, v, g, g_gamma, gk, initial_state)
    )
    return FusedRecurrentFunction.apply(q, k, v, g, g_gamma, gk, shapes.scale, initial_state,
                                        bool(output_final_state), cu_seqlens, shapes.N)


def fused_recurrent_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None):
    """simple_gla, one pass over T: ``S_t = e^{g_t} S_{t-1} + k_t v_t^T``; g ``[B, T, H]``
    and/or g_gamma ``[H]`` (constant, no gradient), gate ``g + g_gamma``."""
    return _fused_recurrent("fused_recurrent_simple_gla", q, k, v, g, g_gamma, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_retention(q, k, v, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None, cu_seqlens_cpu=None):
    """Retention, one pass over T: simple_gla with ``g_gamma[h] = log(1 - 2^(-5-h))``."""
    gamma = retention_gamma(q.shape[2], q.device) if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    return _fused_recurrent("fused_recurrent_retention", q, k, v, None, gamma, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_linear_attn(q, k, v, scale=None, initial_state=None, output_final_state=False,
                                cu_seqlens=None, cu_seqlens_cpu=None):
    """Linear attention, one pass over T: ``S_t = S_{t-1} + k_t v_t^T``."""
    return _fused_recurrent("fused_recurrent_linear_attn", q, k, v, None, None, None, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, cu_seqlens_cpu=None):
    """GLA, one pass over T: ``S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T``, g ``[B, T, H, K]``."""
    if g is None:
        raise TypeError("fused_recurrent_gla: `g` must be a torch.Tensor [B, T, H, K], got None")
    return _fused_recurrent("fused_recurrent_gla", q, k, v, None, None, g, scale, initial_state,
                            output_final_state, cu_seqlens, cu_seqlens_cpu)
