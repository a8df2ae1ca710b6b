"""Fused-recurrent HGRN: ``fused_recurrent_hgrn``, one pass over time, forward and backward.

One program per (sequence, channel block) walks the sequence: forward chunk by chunk
from the first token, backward from the last, carrying the state (or ``e^{g} dh``) in
registers from one chunk to the next. Inside a chunk the steps are one scan over a
``[BT, BD]`` tile (``kernels.hgrn.scan``, shared with the chunked kernels), so a step
costs no memory round trip. Grid: ``N * cdiv(D, BD)`` on axis 0.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _library as library
from .. import _utils
from .._arch import COMPILE_OPTIONS
from .._sequence import sequence_bounds
from .inputs import check_hgrn_inputs, configs
from .scan import backward_chunk, channel_block, forward_chunk

OP = "fused_recurrent_hgrn"
BT = 32  # tokens per scanned tile


@triton.jit
def _sequence_of_program(cu_seqlens, T, D, BD: tl.constexpr, IS_VARLEN: tl.constexpr):
    ND = tl.cdiv(D, BD)
    pid = tl.program_id(0).to(tl.int64)
    i_n = pid // ND
    bos, T_seq = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    return i_n, bos, T_seq, (pid % ND) * BD


@triton.jit
def _fused_fwd(x, g, o, h0, ht, cu_seqlens, T, D, BT: tl.constexpr, BD: tl.constexpr,
               USE_H0: tl.constexpr, STORE_HT: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_n, bos, T_seq, d0 = _sequence_of_program(cu_seqlens, T, D, BD, IS_VARLEN)
    cols, m_d = channel_block(d0, D, BD)
    h = tl.zeros([BD], dtype=tl.float32)
    if USE_H0:
        h += tl.load(h0 + i_n * D + cols, mask=m_d, other=0.0).to(tl.float32)
    for c in range(0, tl.cdiv(T_seq, BT)):
        n_rows = tl.minimum(T_seq - c * BT, BT)
        h = forward_chunk(x, g, o, bos + c * BT, n_rows, d0, D, h, BT, BD)
    if STORE_HT:
        tl.store(ht + i_n * D + cols, h, mask=m_d)


@triton.jit
def _fused_bwd(g, o, h0, do, dht, dx, dg, dh0, cu_seqlens, T, D, BT: tl.constexpr, BD: tl.constexpr,
               USE_H0: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr):
    i_n, bos, T_seq, d0 = _sequence_of_program(cu_seqlens, T, D, BD, IS_VARLEN)
    cols, m_d = channel_block(d0, D, BD)
    carry = tl.zeros([BD], dtype=tl.float32)
    if USE_DHT:
        carry += tl.load(dht + i_n * D + cols, mask=m_d, other=0.0)
    n = tl.cdiv(T_seq, BT)
    for cc in range(0, n):
        c = n - 1 - cc
        n_rows = tl.minimum(T_seq - c * BT, BT)
        carry = backward_chunk(g, o, h0, do, dx, dg, i_n, bos + c * BT, n_rows, c == 0, d0, D, carry,
                               USE_H0, BT, BD)
    if STORE_DH0:
        tl.store(dh0 + i_n * D + cols, carry.to(dh0.dtype.element_ty), mask=m_d)


def _forward(x: torch.Tensor, g: torch.Tensor, initial_state: Optional[torch.Tensor],
             cu_seqlens: Optional[torch.Tensor], cu_seqlens_cpu: Optional[torch.Tensor], output_final_state: bool):
    """One pass forward; the backward reads the output (``h_{t-1}``), nothing else."""
    x, g, initial_state = _utils.contiguous(x, g, initial_state)
    B, T, D = x.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    cfg = configs(D)["fused"]
    o = _utils.empty_like(x)
    final_state = _utils.empty((N, D), torch.float32, x.device) if output_final_state else None
    _fused_fwd[(N * _utils.cdiv(D, cfg["BD"]),)](
        x, g, o, initial_state, final_state, cu_seqlens, T, D, BT=BT, BD=cfg["BD"],
        USE_H0=initial_state is not None, STORE_HT=output_final_state, IS_VARLEN=cu_seqlens is not None,
        num_warps=cfg["num_warps"], **COMPILE_OPTIONS,
    )
    return (o, final_state), ()


def _backward(grads, saved, x, g, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state,
              *, needs_grad, outputs):
    (o, _), (do, dht) = outputs, grads
    g, initial_state, do, dht = _utils.contiguous(g, initial_state, do, dht)
    if do is None:  # only the final state was used
        do = torch.zeros_like(o)
    B, T, D = o.shape
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    cfg = configs(D)["fused"]
    need_dh0 = initial_state is not None and needs_grad["initial_state"]
    dx = _utils.empty(o.shape, x.dtype, o.device)
    dg = _utils.empty_like(g)
    dh0 = _utils.empty((N, D), initial_state.dtype, o.device) if need_dh0 else None
    _fused_bwd[(N * _utils.cdiv(D, cfg["BD"]),)](
        g, o, initial_state, do, dht, dx, dg, dh0, cu_seqlens, T, D, BT=BT, BD=cfg["BD"],
        USE_H0=initial_state is not None, USE_DHT=dht is not None, STORE_DH0=need_dh0,
        IS_VARLEN=cu_seqlens is not None, num_warps=cfg["num_warps"], **COMPILE_OPTIONS,
    )
    return dict(x=dx, g=dg, initial_state=dh0)


FUSED_RECURRENT_HGRN = library.register(OP, _forward, _backward)


def fused_recurrent_hgrn(x: torch.Tensor, g: torch.Tensor, initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                         cu_seqlens_cpu: torch.Tensor | None = None):
    """HGRN, one pass over time: ``h_t = e^{g_t} ⊙ h_{t-1} + x_t``, ``o_t = h_t``.

    Arguments and results as :func:`kernels.chunk_hgrn`.
    """
    offsets = check_hgrn_inputs(OP, x, g, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)
    return FUSED_RECURRENT_HGRN(x, g, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state,
                                offsets=offsets)
