r"""Fused-recurrent DPLR delta rule and RWKV-7: one pass over time, the state in registers.

Recurrence (per head; docs/ops.md), state ``S`` [K, V]::

    S_t = (diag(e^{gk_t}) + b_t a_t^T) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

``fused_recurrent_rwkv7(r, w, k, v, a, b)`` is the same with q = r, gk = w and a default
scale of 1. One step, with ``d = e^{gk_t}`` and ``q~ = scale q_t``, regrouped so that both
reductions over the key rows read ``S_{t-1}`` side by side::

    p_t = S_{t-1}^T a_t                        (what the rank-one term reads)
    o_t = S_{t-1}^T (d q~) + p_t (b_t . q~) + v_t (k_t . q~)
    S_t = d S_{t-1} + b_t p_t^T + k_t v_t^T

One program owns a [K, BV] tile of one head's state for one sequence (the columns of S
are independent given a, b, k and gk) and walks its tokens with the next token's loads in
flight. Grid ``N * H * cdiv(V, BV)`` on axis 0; offsets are 64-bit.

Backward
--------
The adjoint of one step, with ``dS`` the gradient w.r.t. ``S_t`` from the future::

    dS   += q~ do_t^T                      (o_t reads S_t)
    dq~   = S_t do_t = d (S_{t-1} do_t) + b_t (p_t . do_t) + k_t (v_t . do_t)
    dk_t  = dS v_t     dv_t = dS^T k_t     db_t = dS p_t     dp = dS^T b_t
    da_t  = S_{t-1} dp
    dgk_t = d * sum_v (dS * S_{t-1})       (per key row)
    dS_{t-1} = d dS + a_t dp^T

It needs ``S_{t-1}`` at every step walking backwards. ``diag(d) + b a^T`` is singular for
some inputs (rwkv7's ``b = -a`` direction with ``d = 1``) and undoing ``d`` multiplies
rounding errors by ``e^{-gk}``, so states are never reconstructed backwards: the forward
keeps a checkpoint every C steps and the backward replays each C-step segment forward
from it (the scheme and its costs are those of ``kernels/delta_rule/fused_recurrent.py``,
whose configs this module shares). Per-program partial sums over the value columns of
dq, dk, da, db, dgk go to fp32 buffers ``[NV, tokens, H, K]``, added in a fixed order by a
second kernel: no atomics, two runs are bitwise equal.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _library as library
from .._arch import RECURRENT_OPTIONS
from .._sequence import first_state_slot, longest_sequence, sequence_bounds, state_slots
from .._utils import cdiv, contiguous, empty, shapes_only
from ..delta_rule.fused_recurrent import backward_config, checkpoint_interval, forward_config
from ._inputs import check_dplr_inputs


@triton.jit
def _load_token(q, k, v, a, b, gk, tok, valid, i_h, o_k, o_v, m_k, m_v,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Token tok's q, k, a, b, gk rows and v columns in fp32 (zero where not ``valid``)."""
    m = tl.where(valid, m_k, False)
    row = (tok * H + i_h) * K + o_k
    b_q = tl.load(q + row, mask=m, other=0.0).to(tl.float32)
    b_k = tl.load(k + row, mask=m, other=0.0).to(tl.float32)
    b_a = tl.load(a + row, mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(b + row, mask=m, other=0.0).to(tl.float32)
    b_g = tl.load(gk + row, mask=m, other=0.0).to(tl.float32)
    b_v = tl.load(v + (tok * H + i_h) * V + o_v, mask=tl.where(valid, m_v, False), other=0.0).to(tl.float32)
    return b_q, b_k, b_a, b_b, b_g, b_v


@triton.jit
def _step(S, b_q, b_k, b_a, b_b, b_g, b_v):
    """S_{t-1} -> S_t and o_t (b_q already scaled); also p_t = S_{t-1}^T a_t and d = e^{gk_t}."""
    b_d = tl.exp(b_g)
    b_p = tl.sum(S * b_a[:, None], 0)
    b_o = tl.sum(S * (b_d * b_q)[:, None], 0) + b_p * tl.sum(b_b * b_q, 0) + b_v * tl.sum(b_k * b_q, 0)
    S = S * b_d[:, None] + b_b[:, None] * b_p[None, :] + b_k[:, None] * b_v[None, :]
    return S, b_o, b_p, b_d


@triton.jit
def dplr_fused_fwd_kernel(
    q, k, v, a, b, gk, o, h0, ht, ckpt, cu_seqlens, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    VARLEN: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, SAVE_CKPT: tl.constexpr,
):
    """One program: value columns [i_v BV, i_v BV + BV) of head i_h of sequence i_n.

    ckpt [state_slots(...), H, K, V]: the state before step c C of sequence n in row
    first_state_slot(n) + c.
    """
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, seq_len = sequence_bounds(cu_seqlens, i_n, T, VARLEN)
    first_slot = first_state_slot(bos, i_n, T, C, VARLEN)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + i_nh * K * V + o_kv, mask=m_kv, other=0.0).to(tl.float32)
    nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, bos, seq_len > 0, i_h, o_k, o_v, m_k, m_v, H, K, V)
    for t in range(0, seq_len):
        tok = bos + t
        b_q, b_k, b_a, b_b, b_g, b_v = nq, nk, na, nb, ng, nv
        # the next token's loads are issued before this step's arithmetic
        nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, tok + 1, t + 1 < seq_len, i_h, o_k, o_v, m_k, m_v,
                                             H, K, V)
        if SAVE_CKPT:
            if t % C == 0:
                tl.store(ckpt + ((first_slot + t // C) * H + i_h) * K * V + o_kv, S, mask=m_kv)
        S, b_o, _, _ = _step(S, b_q * scale, b_k, b_a, b_b, b_g, b_v)
        tl.store(o + (tok * H + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    if STORE_HT:
        tl.store(ht + i_nh * K * V + o_kv, S, mask=m_kv)


@triton.jit
def dplr_fused_bwd_kernel(
    q, k, v, a, b, gk, do, dht, ckpt, scratch, cu_seqlens,
    dq_part, dk_part, da_part, db_part, dg_part, dv, dh0,
    scale, T, NTOK,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    VARLEN: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    """Reverse pass of one program (the forward's tiling), segment by segment.

    Writes dv (the program owns its value columns), dh0, and its partial sums over its
    value columns of dq, dk, da, db, dgk: [NV, B*T, H, K] fp32.
    """
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // H
    i_h = i_nh % H
    bos, seq_len = sequence_bounds(cu_seqlens, i_n, T, VARLEN)
    first_slot = first_state_slot(bos, i_n, T, C, VARLEN)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    # this program's scratch: C tiles [BK, BV], written and read back by this program only
    p_scratch = scratch + pid * C * BK * BV + o_k[:, None] * BV + tl.arange(0, BV)[None, :]
    whole_tile = tl.full([BK, BV], True, tl.int1)

    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + i_nh * K * V + o_kv, mask=m_kv, other=0.0)

    n_segments = (seq_len + C - 1) // C
    for c_rev in range(0, n_segments):
        c = n_segments - 1 - c_rev
        t0 = c * C
        seg_len = tl.minimum(seq_len - t0, C)
        S = tl.load(ckpt + ((first_slot + c) * H + i_h) * K * V + o_kv, mask=m_kv, other=0.0)
        # replay the segment with the forward's own step, keeping every S_{t-1}
        nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, bos + t0, True, i_h, o_k, o_v, m_k, m_v, H, K, V)
        for i in range(0, seg_len):
            b_q, b_k, b_a, b_b, b_g, b_v = nq, nk, na, nb, ng, nv
            nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, bos + t0 + i + 1, i + 1 < seg_len, i_h,
                                                 o_k, o_v, m_k, m_v, H, K, V)
            tl.store(p_scratch + i * BK * BV, S)
            S, _, _, _ = _step(S, b_q, b_k, b_a, b_b, b_g, b_v)
        tl.debug_barrier()
        # walk the segment backwards, loading the previous token's inputs and state ahead
        tok = bos + t0 + seg_len - 1
        nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, tok, True, i_h, o_k, o_v, m_k, m_v, H, K, V)
        ndo = tl.load(do + (tok * H + i_h) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        nS = tl.load(p_scratch + (seg_len - 1) * BK * BV)
        for i_rev in range(0, seg_len):
            i = seg_len - 1 - i_rev
            tok = bos + t0 + i
            b_q, b_k, b_a, b_b, b_g, b_v, b_do, S = nq, nk, na, nb, ng, nv, ndo, nS  # S = S_{t-1}
            nq, nk, na, nb, ng, nv = _load_token(q, k, v, a, b, gk, tok - 1, i > 0, i_h, o_k, o_v, m_k, m_v, H, K, V)
            ndo = tl.load(do + ((tok - 1) * H + i_h) * V + o_v, mask=tl.where(i > 0, m_v, False),
                          other=0.0).to(tl.float32)
            nS = tl.load(p_scratch + (i - 1) * BK * BV, mask=tl.where(i > 0, whole_tile, False), other=0.0)
            b_q = b_q * scale
            b_d = tl.exp(b_g)
            b_p = tl.sum(S * b_a[:, None], 0)
            # dq~ = S_t do with S_t = d S_{t-1} + b p^T + k v^T
            b_dq = b_d * tl.sum(S * b_do[None, :], 1) + b_b * tl.sum(b_p * b_do, 0) + b_k * tl.sum(b_v * b_do, 0)
            dS += b_q[:, None] * b_do[None, :]
            b_dp = tl.sum(dS * b_b[:, None], 0)
            b_dk = tl.sum(dS * b_v[None, :], 1)
            b_db = tl.sum(dS * b_p[None, :], 1)
            b_da = tl.sum(S * b_dp[None, :], 1)
            b_dg = b_d * tl.sum(dS * S, 1)
            b_dv = tl.sum(dS * b_k[:, None], 0)
            p_part = ((i_v * NTOK + tok) * H + i_h) * K + o_k
            tl.store(dq_part + p_part, b_dq * scale, mask=m_k)
            tl.store(dk_part + p_part, b_dk, mask=m_k)
            tl.store(da_part + p_part, b_da, mask=m_k)
            tl.store(db_part + p_part, b_db, mask=m_k)
            tl.store(dg_part + p_part, b_dg, mask=m_k)
            tl.store(dv + (tok * H + i_h) * V + o_v, b_dv.to(dv.dtype.element_ty), mask=m_v)
            dS = dS * b_d[:, None] + b_a[:, None] * b_dp[None, :]
        tl.debug_barrier()  # the next segment overwrites the scratch tiles read above

    if STORE_DH0:
        tl.store(dh0 + i_nh * K * V + o_kv, dS.to(dh0.dtype.element_ty), mask=m_kv)


@triton.jit
def _part_sum(part, out, rows, mask, slice_len, NV: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    acc = tl.zeros([BR, BK], dtype=tl.float32)
    for i_v in range(0, NV):
        acc += tl.load(part + i_v * slice_len + rows, mask=mask, other=0.0)
    tl.store(out + rows, acc.to(out.dtype.element_ty), mask=mask)


@triton.jit
def dplr_fused_reduce_kernel(
    dq_part, dk_part, da_part, db_part, dg_part, dq, dk, da, db, dg, n_rows,
    K: tl.constexpr, NV: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
):
    """Sum the NV partial gradients of BR (token, head) rows, in a fixed order, and cast."""
    pid = tl.program_id(0).to(tl.int64)
    r = pid * BR + tl.arange(0, BR).to(tl.int64)
    c = tl.arange(0, BK)
    mask = (r < n_rows)[:, None] & (c < K)[None, :]
    rows = r[:, None] * K + c[None, :]
    total = tl.cast(n_rows, tl.int64) * K  # elements of one partial slice: past 2**31 at large batches
    _part_sum(dq_part, dq, rows, mask, total, NV, BR, BK)
    _part_sum(dk_part, dk, rows, mask, total, NV, BR, BK)
    _part_sum(da_part, da, rows, mask, total, NV, BR, BK)
    _part_sum(db_part, db, rows, mask, total, NV, BR, BK)
    _part_sum(dg_part, dg, rows, mask, total, NV, BR, BK)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             gk: torch.Tensor, initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, *, keep, offsets):
    """The forward launch; returns ``((o, final state or None), (checkpoints or None,))``."""
    q, k, v, a, b, gk, initial_state = contiguous(q, k, v, a, b, gk, initial_state)
    save_checkpoints = keep
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C = checkpoint_interval(B * T, N)
    o = empty(v.shape, v.dtype, q.device)
    ht = empty((N, H, K, V), torch.float32, q.device) if output_final_state else None
    ckpt = None
    if save_checkpoints:
        ckpt = empty((state_slots(B, T, N, C, cu_seqlens is not None), H, K, V), torch.float32, q.device)
    if shapes_only():  # no launch: tile sizes from symbolic sizes cost sympy minutes under tracing
        return (o, ht), (ckpt,)
    BK, BV, num_warps = forward_config(K, V, longest_sequence(offsets, T), N * H)
    grid = (N * H * cdiv(V, BV),)
    if grid[0] > 0:
        dplr_fused_fwd_kernel[grid](
            q, k, v, a, b, gk, o, initial_state, ht, ckpt, cu_seqlens, scale, T,
            H=H, K=K, V=V, BK=BK, BV=BV, C=C, VARLEN=cu_seqlens is not None,
            USE_H0=initial_state is not None, STORE_HT=output_final_state, SAVE_CKPT=save_checkpoints,
            num_warps=num_warps, num_stages=1, **RECURRENT_OPTIONS,
        )
    return (o, ht), (ckpt,)


def _backward(grads, saved, q, k, v, a, b, gk, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state):
    (ckpt,) = saved
    q, k, v, a, b, gk, initial_state, do, dht = contiguous(q, k, v, a, b, gk, initial_state, *grads)
    device = q.device
    grads = [empty(t.shape, t.dtype, device) for t in (q, k, a, b, gk)]
    dv = empty(v.shape, v.dtype, device)
    dh0 = empty(initial_state.shape, initial_state.dtype, device) if initial_state is not None else None
    if shapes_only():  # the gradients' shapes are the inputs'; no tile sizes (see _forward)
        dq, dk, da, db, dg = grads
        return dict(q=dq, k=dk, v=dv, a=da, b=db, gk=dg, initial_state=dh0)
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C = checkpoint_interval(B * T, N)
    NTOK = B * T
    BK, BV, num_warps = backward_config(K, V)
    NV = cdiv(V, BV)
    n_programs = N * H * NV
    scratch = empty((n_programs, C, BK, BV), torch.float32, device)
    parts = [empty((NV, NTOK, H, K), torch.float32, device) for _ in range(5)]
    if n_programs > 0:
        dplr_fused_bwd_kernel[(n_programs,)](
            q, k, v, a, b, gk, do, dht, ckpt, scratch, cu_seqlens, *parts, dv, dh0, scale, T, NTOK,
            H=H, K=K, V=V, BK=BK, BV=BV, C=C, VARLEN=cu_seqlens is not None,
            USE_DHT=dht is not None, STORE_DH0=dh0 is not None, num_warps=num_warps, num_stages=1, **RECURRENT_OPTIONS,
        )
    n_rows = NTOK * H
    BR = max(2048 // BK, 1)
    if n_rows > 0:
        dplr_fused_reduce_kernel[(cdiv(n_rows, BR),)](
            *parts, *grads, n_rows, K=K, NV=NV, BR=BR, BK=BK, num_warps=4, **RECURRENT_OPTIONS
        )
    dq, dk, da, db, dg = grads
    return dict(q=dq, k=dk, v=dv, a=da, b=db, gk=dg, initial_state=dh0)


OPS = {name: library.register(name, _forward, _backward)
       for name in ("fused_recurrent_dplr_delta_rule", "fused_recurrent_rwkv7")}


def _run(op, names, q, k, v, a, b, gk, scale, initial_state, output_final_state, cu_seqlens,
         cu_seqlens_cpu):
    p = check_dplr_inputs(op, names, q, k, v, a, b, gk, scale, initial_state, output_final_state,
                          cu_seqlens, cu_seqlens_cpu)
    return OPS[op](q, k, v, a, b, gk, initial_state, cu_seqlens, cu_seqlens_cpu, p.scale, output_final_state,
                   offsets=p.offsets_host)


def fused_recurrent_dplr_delta_rule(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False,
                                    cu_seqlens=None, cu_seqlens_cpu=None):
    """DPLR delta rule, one pass over time: ``S_t = (diag(e^{gk_t}) + b_t a_t^T) S_{t-1} + k_t v_t^T``.

    q, k, a, b, gk [B, T, H, K]; v [B, T, H, V]; ``o_t = S_t^T (scale q_t)``, scale
    defaulting to K^-0.5. initial_state [N, H, K, V] float32; returns (o, final_state or
    None). ``cu_seqlens`` (with ``cu_seqlens_cpu`` to skip the host sync) packs N sequences
    into B = 1. K and V up to 128.
    """
    return _run("fused_recurrent_dplr_delta_rule", {}, q, k, v, a, b, gk, scale, initial_state,
                output_final_state, cu_seqlens, cu_seqlens_cpu)


def fused_recurrent_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False,
                          cu_seqlens=None, cu_seqlens_cpu=None):
    """RWKV-7, one pass over time: the DPLR delta rule with q = r, gk = w (log decay), scale 1."""
    return _run("fused_recurrent_rwkv7", {"q": "r", "gk": "w"}, r, k, v, a, b, w, scale, initial_state,
                output_final_state, cu_seqlens, cu_seqlens_cpu)
