"""Gradient of the log gates of a gated linear recurrence, from dq and dk.

The recurrence ``S_t = diag(e^{g_t}) S_{t-1} + k_t v_t^T`` (scalar gates: the same g for
every row), ``o_t = S_t^T (scale q_t)``, depends on the gates only through the cumulative
gate ``B_t = sum_{s<=t} g_s``:

    S_t = e^{B_t} S_0 + sum_{s<=t} e^{B_t - B_s} k_s v_s^T        (per row k for gk)

Every term of the loss ``L = sum_t do_t . o_t + <dS_T, S_T>`` carries ``e^{B_t - B_s}``
and so has derivative ``+term`` in ``B_t`` and ``-term`` in ``B_s``. Summing the ``+``
parts over s gives ``q_t (.) dq_t`` and the ``-`` parts over t gives ``k_s (.) dk_s``,
where dq and dk are the ordinary gradients of q and k (scale included, initial-state
and final-state paths included). The final state adds ``<dS_T, S_T>`` at the last token.
So, per channel (sum over channels for a scalar gate)

    dL/dB_t = q_t (.) dq_t - k_t (.) dk_t  +  [t = last] sum_v dS_T[:, v] (.) S_T[:, v]
    dL/dg_t = sum_{u >= t} dL/dB_u                    (reverse cumsum within a sequence)

No division by a decay appears, so strong decay (``g = logsigmoid(x) / 0.01``) is safe.
This module does the reverse cumsum; the callers produce ``dL/dB`` (without the
final-state term, which is added here from ``dS_T`` and ``S_T``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._utils import block_size, empty
from .indexing import sequence_span


@triton.jit
def gate_grad_reverse_cumsum_kernel(
    dB,
    dg,
    dht,
    ht,
    cu_seqlens,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    FINAL_TERM: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """One program per (sequence, head): walk the sequence backwards in blocks of BT,
    carrying the sum of everything after the block."""
    i_nh = tl.program_id(0).to(tl.int64)
    i_n = i_nh // H
    i_h = i_nh % H
    bos, T_seq = sequence_span(cu_seqlens, i_n, T, IS_VARLEN)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    state_base = i_nh * K * V

    if PER_CHANNEL:
        carry = tl.zeros([BK], dtype=tl.float32)
    else:
        carry = tl.zeros([BT], dtype=tl.float32)
    if FINAL_TERM:
        # <dS_T, S_T>: summed over V per channel, and over K too for a scalar gate
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_kv = m_k[:, None] & (o_v < V)[None, :]
            offs = state_base + o_k[:, None] * V + o_v[None, :]
            prod = tl.load(dht + offs, mask=m_kv, other=0.0) * tl.load(ht + offs, mask=m_kv, other=0.0)
            if PER_CHANNEL:
                carry += tl.sum(prod, 1)
            else:
                carry += tl.sum(tl.sum(prod, 1), 0)

    NT = tl.cdiv(T_seq, BT)
    for i in range(NT):
        t = (NT - 1 - i) * BT + o_t
        m_t = t < T_seq
        if PER_CHANNEL:
            offs = ((bos + t[:, None]) * H + i_h) * K + o_k[None, :]
            m = m_t[:, None] & m_k[None, :]
            x = tl.load(dB + offs, mask=m, other=0.0)
            tl.store(dg + offs, (tl.cumsum(x, 0, reverse=True) + carry[None, :]).to(dg.dtype.element_ty), mask=m)
            carry += tl.sum(x, 0)
        else:
            offs = (bos + t) * H + i_h
            x = tl.load(dB + offs, mask=m_t, other=0.0)
            tl.store(dg + offs, (tl.cumsum(x, 0, reverse=True) + carry).to(dg.dtype.element_ty), mask=m_t)
            carry += tl.sum(x, 0)


def gate_grad(dB, dht, ht, cu_seqlens, N: int, K: int, V: int, dtype) -> torch.Tensor:
    """``dL/dg`` (``[B, T, H]`` or ``[B, T, H, K]``, like dB) from ``dL/dB`` in float32.

    ``dht`` and ``ht`` (``[N, H, K, V]`` float32, or both None) add the final-state term.
    """
    T, H = dB.shape[1], dB.shape[2]
    per_channel = dB.dim() == 4
    dg = empty(dB.shape, dtype, dB.device)
    final_term = dht is not None and ht is not None
    BK = block_size(K)
    gate_grad_reverse_cumsum_kernel[(N * H,)](
        dB,
        dg,
        dht if final_term else dB,
        ht if final_term else dB,
        cu_seqlens,
        T,
        H=H,
        K=K,
        V=V,
        BT=32 if per_channel else 64,
        BK=BK,
        BV=max(16, min(block_size(V), 4096 // BK)),
        PER_CHANNEL=per_channel,
        FINAL_TERM=final_term,
        IS_VARLEN=cu_seqlens is not None,
        num_warps=4,
    )
    return dg
