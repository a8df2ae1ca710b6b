"""Fused-recurrent delta rules: one pass over time, the state held in registers.

Three ops share one forward kernel and one backward kernel; a ``tl.constexpr`` gate
switch selects the decay (contract: docs/ops.md):

* ``fused_recurrent_delta_rule``:       ``S_t = (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T``
* ``fused_recurrent_gated_delta_rule``: ``S_t = e^{g_t} (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T``
* ``fused_recurrent_kda``:              ``S' = diag(e^{g_t}) S_{t-1}``,
  ``S_t = (I - β_t k_t k_t^T) S' + β_t k_t v_t^T``

and ``o_t = S_t^T (scale q_t)``. The scalar gate commutes with ``I - β k k^T``, so all
three are one step: decay ``S' = D_t S_{t-1}`` (``D_t`` = 1, ``e^{g_t}`` or
``diag(e^{g_t})``), then the delta write, regrouped so that it never forms a K x K matrix::

    p_t = S'^T k_t                 (what the state currently recalls for k_t)
    r_t = v_t - p_t                (the residual the write corrects)
    u_t = β_t r_t
    S_t = S' + k_t u_t^T
    o_t = S_t^T q~_t,  q~_t = scale * q_t   (q_t, k_t L2-normalised first when asked)

The kernel folds D_t into the vectors, p_t = S_{t-1}^T (D_t k_t) and
o_t = S_{t-1}^T (D_t q~_t) + u_t (k_t · q~_t), so that a token's two reductions over K read
the same tile side by side and o_t needs no second pass over the updated one: the
dependent chain per token is one reduction and one update, which is what bounds a
recurrent kernel once T is more than a few tokens.

Grouped value heads: q, k have H heads, v, beta, g have HV = G * H; value head j reads
query/key head j // G. Columns of S are independent given k and β, so the forward splits
V across programs: one program owns a [K, BV] tile of one value head's state, for one
sequence, and walks its tokens in order, with the next two tokens' loads in flight. Grid:
``N * HV * cdiv(V, BV)`` on axis 0 (never axis 1 or 2, capped at 65535); offsets are
64-bit.

Backward
--------
The adjoint of one step, with dS the gradient w.r.t. S_t (the future's, plus
``q~_t do_t^T`` from o_t)::

    dq~_t = S_t do_t
    du    = dS^T k_t          dv_t = β_t du          dβ_t = du · r_t
    dp    = -β_t du
    dk_t  = dS u_t + S' dp
    dS'   = dS + k_t dp^T     (= (I - β_t k_t k_t^T) dS)
    dg_t  = Σ_ij dS'_ij S'_ij  (scalar gate)   or   Σ_j dS'_ij S'_ij  (per channel i)
    dS_{t-1} = D_t dS'

It walks time backwards and needs S_{t-1} at each step. The transition
``D_t (I - β k k^T)`` is singular at β = 1 with a unit k, and undoing ``e^{g}`` under
strong decay multiplies the rounding error by ``e^{-g}`` (up to e^500 per step with the
stress gates), so states are never reconstructed backwards. Instead:

* the forward, when a gradient is needed, stores a checkpoint of the state every C steps
  (the state before the chunk's first token);
* the backward walks the chunks last to first; for each it reloads the chunk's
  checkpoint, replays the chunk's steps forward with the forward's own step function,
  writing each S_{t-1} to a per-program scratch area in global memory, then walks the
  chunk backwards reading them back (one tile ahead, to hide the latency).

Every state the backward uses is a forward-direction recomputation from a stored
forward state, so the backward's rounding is that of the forward plus that of the
adjoint recurrence, whatever β and g are: nothing is divided, nothing is amplified.

Memory, per value head: checkpoints ``(T/C + 1) K V`` floats (held from forward to
backward) and scratch ``C K V`` floats (backward only); C ~ sqrt(mean sequence length), a
power of two in 16..128, minimises their sum (at T = 4096: 2 x 64 states instead of 4096).
Compute: one replayed forward step per backward step. Traffic: the scratch tile is
written and read once per step (8 bytes per state element per token), which is what
the backward's time is made of at long T; it is the price of never inverting a step.

The gradients of q, k, β and g sum over the V columns (and over the G value heads that
share a query/key head). Each program writes its partial sums to its own slice of an
fp32 buffer ``[NV, tokens, HV, ...]``; a second kernel adds the slices in a fixed order,
then applies the L2-norm backward ``dx = (dy - y (y · dy)) / sqrt(Σx² + eps)``. No
atomics: two runs are bitwise equal.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch, _validate
from .. import _library as library
from .._arch import RECURRENT_OPTIONS
from .._utils import cdiv, contiguous, empty, shapes_only
from .._sequence import first_state_slot, longest_sequence, sequence_bounds, state_slots

GATE_NONE = 0  # delta rule
GATE_HEAD = 1  # one scalar log decay per value head and step (gated delta rule)
GATE_CHANNEL = 2  # one log decay per key channel (kda)

L2NORM_EPS = tl.constexpr(1e-6)  # y = x / sqrt(Σx² + eps) (docs/ops.md)
MAX_KEY_HEAD_DIM, MAX_VALUE_HEAD_DIM = 256, 512  # K is one tile of a program; V splits over programs


# --------------------------------------------------------------------------- kernels


@triton.jit
def _load_token(q, k, v, g, beta, tok, valid, i_h, i_hv, o_k, o_v, m_k, m_v,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                GATE: tl.constexpr):
    """Token tok's raw q, k, v, beta and gate (all zero where not ``valid``).

    Split from their use so that the loop can issue the next token's loads before it
    computes the current one: the memory latency then hides behind a step's arithmetic.
    """
    m_k = tl.where(valid, m_k, False)
    b_q = tl.load(q + (tok * H + i_h) * K + o_k, mask=m_k, other=0.0)
    b_k = tl.load(k + (tok * H + i_h) * K + o_k, mask=m_k, other=0.0)
    b_v = tl.load(v + (tok * HV + i_hv) * V + o_v, mask=tl.where(valid, m_v, False), other=0.0)
    b_beta = tl.load(beta + tok * HV + i_hv, mask=valid, other=0.0)
    if GATE == 1:
        b_g = tl.load(g + tok * HV + i_hv, mask=valid, other=0.0)
    elif GATE == 2:
        b_g = tl.load(g + (tok * HV + i_hv) * K + o_k, mask=m_k, other=0.0)
    else:
        b_g = b_beta  # unused
    return b_q, b_k, b_v, b_beta, b_g


@triton.jit
def _unit(x, L2NORM: tl.constexpr):
    """x in fp32, L2-normalised when asked: x / sqrt(Σx² + eps)."""
    x = x.to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, 0) + L2NORM_EPS)
    return x


@triton.jit
def _prepare(b_q, b_k, b_g, scale, L2NORM: tl.constexpr, GATE: tl.constexpr):
    """A token's vectors as a step reads the state with them, from its raw loads.

    Returns k (unit when asked), q~ = scale * q, the decay d (e^g: a scalar, a [BK]
    vector, or 1), kd = D k, qd = D q~ and k · q~. None of it depends on the state, so
    the loop computes it for the next token while the current step's reductions run.
    """
    b_q = _unit(b_q, L2NORM) * scale
    b_k = _unit(b_k, L2NORM)
    if GATE == 0:
        b_d = tl.full([1], 1.0, tl.float32)
        b_kd = b_k
        b_qd = b_q
    else:
        b_d = tl.exp(b_g.to(tl.float32))
        b_kd = b_k * b_d
        b_qd = b_q * b_d
    return b_k, b_q, b_d, b_kd, b_qd, tl.sum(b_k * b_q, 0)


@triton.jit
def _decay(S, b_d, GATE: tl.constexpr):
    """S' = D_t S on a [BK, BV] tile: e^{g_t}, or diag(e^{g_t}) over the key rows."""
    if GATE == 1:
        S = S * b_d
    elif GATE == 2:
        S = S * b_d[:, None]
    return S


@triton.jit
def _step(S, b_k, b_d, b_kd, b_qd, b_kq, b_v, b_beta, GATE: tl.constexpr):
    """One token: S_{t-1} -> S_t, and o_t.

    With S' = D S_{t-1} folded into the vectors, both reductions read S_{t-1} and run side
    by side, and o_t needs no second pass over the updated tile:
        p   = S'^T k = S_{t-1}^T (D k)
        u   = β (v - p)
        o_t = S_t^T q~ = S_{t-1}^T (D q~) + u (k · q~)
        S_t = D S_{t-1} + k u^T
    """
    b_p = tl.sum(S * b_kd[:, None], 0)
    b_oq = tl.sum(S * b_qd[:, None], 0)
    b_u = b_beta * (b_v - b_p)
    S = _decay(S, b_d, GATE) + b_k[:, None] * b_u[None, :]
    return S, b_oq + b_u * b_kq


@triton.jit
def fused_recurrent_delta_fwd_kernel(
    q, k, v, g, beta, o, h0, ht, ckpt, cu_seqlens,
    scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    GATE: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr,
    USE_H0: tl.constexpr, STORE_HT: tl.constexpr, SAVE_CKPT: tl.constexpr,
):
    """One program: value columns [i_v*BV, i_v*BV + BV) of head i_hv of sequence i_n.

    Tensors are flattened over (batch, time): q, k [B*T, H, K]; v, o [B*T, HV, V];
    beta [B*T, HV]; g [B*T, HV] or [B*T, HV, K]; states [N, HV, K, V]; ckpt
    [state_slots(...), HV, K, V], chunk c of sequence n in row first_state_slot(n) + c.
    """
    NV: tl.constexpr = (V + BV - 1) // BV
    G: tl.constexpr = HV // H
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // G
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

    # Two tokens in flight: token t+1's loads have landed and are prepared while step t
    # runs; token t+2's loads are issued at the top of step t.
    b_q, b_k, b_v, b_beta, b_g = _load_token(q, k, v, g, beta, bos, seq_len > 0, i_h, i_hv, o_k, o_v, m_k, m_v,
                                             H, HV, K, V, GATE)
    b_k, b_q, b_d, b_kd, b_qd, b_kq = _prepare(b_q, b_k, b_g, scale, L2NORM, GATE)
    nq, nk, nv, nbeta, ng = _load_token(q, k, v, g, beta, bos + 1, seq_len > 1, i_h, i_hv, o_k, o_v, m_k, m_v,
                                        H, HV, K, V, GATE)
    for t in range(0, seq_len):
        tok = bos + t
        mq, mk, mv, mbeta, mg = _load_token(q, k, v, g, beta, tok + 2, t + 2 < seq_len, i_h, i_hv,
                                            o_k, o_v, m_k, m_v, H, HV, K, V, GATE)
        if SAVE_CKPT:
            if t % C == 0:
                slot = first_slot + t // C
                tl.store(ckpt + (slot * HV + i_hv) * K * V + o_kv, S, mask=m_kv)
        S, b_o = _step(S, b_k, b_d, b_kd, b_qd, b_kq, b_v.to(tl.float32), b_beta.to(tl.float32), GATE)
        tl.store(o + (tok * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        b_k, b_q, b_d, b_kd, b_qd, b_kq = _prepare(nq, nk, ng, scale, L2NORM, GATE)
        b_v, b_beta = nv, nbeta
        nq, nk, nv, nbeta, ng = mq, mk, mv, mbeta, mg

    if STORE_HT:
        tl.store(ht + i_nh * K * V + o_kv, S, mask=m_kv)


@triton.jit
def _replay_chunk(q, k, v, g, beta, S, p_scratch, start, chunk_len, scale, i_h, i_hv, o_k, o_v, m_k, m_v,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr):
    """Replay a chunk (tokens ``start ..``) forward from its checkpoint ``S`` with the
    forward's arithmetic, storing every S_{t-1} in the program's scratch tiles."""
    nq, nk, nv, nbeta, ng = _load_token(q, k, v, g, beta, start, True, i_h, i_hv, o_k, o_v, m_k, m_v,
                                        H, HV, K, V, GATE)
    for i in range(0, chunk_len):
        b_q, b_k, b_v, b_beta, b_g = nq, nk, nv, nbeta, ng
        nq, nk, nv, nbeta, ng = _load_token(q, k, v, g, beta, start + i + 1, i + 1 < chunk_len, i_h, i_hv,
                                            o_k, o_v, m_k, m_v, H, HV, K, V, GATE)
        tl.store(p_scratch + i * BK * BV, S)
        b_k, b_q, b_d, b_kd, b_qd, b_kq = _prepare(b_q, b_k, b_g, scale, L2NORM, GATE)
        S, _ = _step(S, b_k, b_d, b_kd, b_qd, b_kq, b_v.to(tl.float32), b_beta.to(tl.float32), GATE)


@triton.jit
def _reverse_chunk(q, k, v, g, beta, do, dS, p_scratch, dq_part, dk_part, dv, dbeta_part, dg_part,
                   start, chunk_len, scale, NTOK, i_v, i_h, i_hv, o_k, o_v, m_k, m_v,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, L2NORM: tl.constexpr):
    """Walk a replayed chunk backwards from dS (the gradient of its last state): stores each
    token's dv and partial dq, dk, dbeta, dg; returns dS of the state before the chunk.
    Each iteration loads the previous token's inputs and state."""
    whole_tile = tl.full([BK, BV], True, tl.int1)
    tok = start + chunk_len - 1
    nq, nk, nv, nbeta, ng = _load_token(q, k, v, g, beta, tok, True, i_h, i_hv, o_k, o_v, m_k, m_v,
                                        H, HV, K, V, GATE)
    ndo = tl.load(do + (tok * HV + i_hv) * V + o_v, mask=m_v, other=0.0)
    nS = tl.load(p_scratch + (chunk_len - 1) * BK * BV)
    for i_rev in range(0, chunk_len):
        i = chunk_len - 1 - i_rev
        tok = start + i
        b_q, b_k, b_v, b_beta, b_g, b_do, S = nq, nk, nv, nbeta, ng, ndo, nS  # S = S_{t-1}
        nq, nk, nv, nbeta, ng = _load_token(q, k, v, g, beta, tok - 1, i > 0, i_h, i_hv,
                                            o_k, o_v, m_k, m_v, H, HV, K, V, GATE)
        ndo = tl.load(do + ((tok - 1) * HV + i_hv) * V + o_v, mask=tl.where(i > 0, m_v, False), other=0.0)
        nS = tl.load(p_scratch + (i - 1) * BK * BV, mask=tl.where(i > 0, whole_tile, False), other=0.0)
        b_k, b_q, b_d, b_kd, b_qd, b_kq = _prepare(b_q, b_k, b_g, scale, L2NORM, GATE)
        b_v = b_v.to(tl.float32)
        b_do = b_do.to(tl.float32)
        b_beta = b_beta.to(tl.float32)
        Sp = _decay(S, b_d, GATE)  # S'_t = D_t S_{t-1}
        b_r = b_v - tl.sum(Sp * b_k[:, None], 0)
        b_u = b_beta * b_r
        # dq~_t = S_t do_t with S_t = S' + k u^T
        b_dq = tl.sum(Sp * b_do[None, :], 1) + b_k * tl.sum(b_u * b_do, 0)
        dS += b_q[:, None] * b_do[None, :]
        b_du = tl.sum(dS * b_k[:, None], 0)
        b_dp = -b_beta * b_du
        b_dk = tl.sum(dS * b_u[None, :] + Sp * b_dp[None, :], 1)
        dS += b_k[:, None] * b_dp[None, :]  # dS'
        p_part = (i_v * NTOK + tok) * HV + i_hv
        tl.store(dq_part + p_part * K + o_k, b_dq * scale, mask=m_k)
        tl.store(dk_part + p_part * K + o_k, b_dk, mask=m_k)
        tl.store(dbeta_part + p_part, tl.sum(b_du * b_r, 0))
        tl.store(dv + (tok * HV + i_hv) * V + o_v, (b_beta * b_du).to(dv.dtype.element_ty), mask=m_v)
        if GATE == 1:
            tl.store(dg_part + p_part, tl.sum(tl.sum(dS * Sp, 1), 0))
        elif GATE == 2:
            tl.store(dg_part + p_part * K + o_k, tl.sum(dS * Sp, 1), mask=m_k)
        dS = _decay(dS, b_d, GATE)  # dS_{t-1} = D_t dS'
    return dS


@triton.jit
def fused_recurrent_delta_bwd_kernel(
    q, k, v, g, beta, do, dht, ckpt, scratch, cu_seqlens,
    dq_part, dk_part, dv, dbeta_part, dg_part, dh0,
    scale, T, NTOK,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    GATE: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr,
    USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
):
    """Reverse pass of one program (same tiling as the forward), chunk by chunk.

    Writes dv (final: the program owns its value columns), dh0, and its partial sums over
    its value columns: dq_part, dk_part [NV, B*T, HV, K] (gradients w.r.t. the scaled,
    normalised q~ and normalised k), dbeta_part [NV, B*T, HV] and dg_part
    [NV, B*T, HV] or [NV, B*T, HV, K].
    """
    NV: tl.constexpr = (V + BV - 1) // BV
    G: tl.constexpr = HV // H
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // G
    bos, seq_len = sequence_bounds(cu_seqlens, i_n, T, VARLEN)
    first_slot = first_state_slot(bos, i_n, T, C, VARLEN)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]
    # this program's scratch: C tiles [BK, BV], written and read back by the same program
    p_scratch = scratch + pid * C * BK * BV + o_k[:, None] * BV + tl.arange(0, BV)[None, :]

    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + i_nh * K * V + o_kv, mask=m_kv, other=0.0)

    n_chunks = (seq_len + C - 1) // C
    for c_rev in range(0, n_chunks):
        c = n_chunks - 1 - c_rev
        t0 = c * C
        chunk_len = tl.minimum(seq_len - t0, C)
        slot = first_slot + c
        S = tl.load(ckpt + (slot * HV + i_hv) * K * V + o_kv, mask=m_kv, other=0.0)
        _replay_chunk(q, k, v, g, beta, S, p_scratch, bos + t0, chunk_len, scale, i_h, i_hv, o_k, o_v, m_k, m_v,
                      H, HV, K, V, BK, BV, GATE, L2NORM)
        tl.debug_barrier()
        dS = _reverse_chunk(q, k, v, g, beta, do, dS, p_scratch, dq_part, dk_part, dv, dbeta_part, dg_part,
                            bos + t0, chunk_len, scale, NTOK, i_v, i_h, i_hv, o_k, o_v, m_k, m_v,
                            H, HV, K, V, BK, BV, GATE, L2NORM)
        tl.debug_barrier()  # the next chunk overwrites the scratch tiles read above

    if STORE_DH0:
        tl.store(dh0 + i_nh * K * V + o_kv, dS.to(dh0.dtype.element_ty), mask=m_kv)


@triton.jit
def _l2norm_bwd(x_ptr, offs, mask, dy):
    """dx for y = x / sqrt(Σx² + eps): dx = (dy - y (y · dy)) / sqrt(Σx² + eps), row-wise."""
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 1) + L2NORM_EPS)
    y = x * rstd[:, None]
    return (dy - y * tl.sum(y * dy, 1)[:, None]) * rstd[:, None]


@triton.jit
def fused_recurrent_delta_reduce_kernel(
    q, k, dq_part, dk_part, dq, dk, dbeta_part, dbeta, dg_part, dg, NTOK,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, NV: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr,
    GATE: tl.constexpr, L2NORM: tl.constexpr,
):
    """Sum the per-program partial gradients, in a fixed order, for BT tokens of head i_h.

    dq, dk sum over the NV value blocks of each of the G value heads sharing query/key
    head i_h; dbeta, dg over the NV value blocks. Then the L2-norm backward for q, k.
    """
    G: tl.constexpr = HV // H
    pid = tl.program_id(0).to(tl.int64)
    i_h = pid % H
    o_t = (pid // H) * BT + tl.arange(0, BT).to(tl.int64)
    o_k = tl.arange(0, BK)
    m_t = o_t < NTOK
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    for j in range(0, G):
        i_hv = i_h * G + j
        b_dbeta = tl.zeros([BT], dtype=tl.float32)
        b_dg_head = tl.zeros([BT], dtype=tl.float32)
        b_dg_chan = tl.zeros([BT, BK], dtype=tl.float32)
        for i_v in range(0, NV):
            p_part = (i_v * tl.cast(NTOK, tl.int64) + o_t) * HV + i_hv
            o_part = p_part[:, None] * K + o_k[None, :]
            b_dq += tl.load(dq_part + o_part, mask=m_tk, other=0.0)
            b_dk += tl.load(dk_part + o_part, mask=m_tk, other=0.0)
            b_dbeta += tl.load(dbeta_part + p_part, mask=m_t, other=0.0)
            if GATE == 1:
                b_dg_head += tl.load(dg_part + p_part, mask=m_t, other=0.0)
            elif GATE == 2:
                b_dg_chan += tl.load(dg_part + o_part, mask=m_tk, other=0.0)
        p_tok = o_t * HV + i_hv
        tl.store(dbeta + p_tok, b_dbeta.to(dbeta.dtype.element_ty), mask=m_t)
        if GATE == 1:
            tl.store(dg + p_tok, b_dg_head.to(dg.dtype.element_ty), mask=m_t)
        elif GATE == 2:
            tl.store(dg + p_tok[:, None] * K + o_k[None, :], b_dg_chan.to(dg.dtype.element_ty), mask=m_tk)

    o_qk = (o_t * H + i_h)[:, None] * K + o_k[None, :]
    if L2NORM:
        b_dq = _l2norm_bwd(q, o_qk, m_tk, b_dq)
        b_dk = _l2norm_bwd(k, o_qk, m_tk, b_dk)
    tl.store(dq + o_qk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + o_qk, b_dk.to(dk.dtype.element_ty), mask=m_tk)


# --------------------------------------------------------------------------- configs


# Sequences at most this long are "decoding": the pass is mostly the state's load and store.
DECODE_LEN = 4


def forward_config(K: int, V: int, max_len: int, n_heads: int) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the forward for the target arch.

    Decoding (a few tokens per sequence): the state's load and store dominate, so wide
    [BK, 32] tiles over 4 warps, whose 16-byte accesses cover whole 128-byte lines.

    Longer sequences: each token is a dependent chain (reduce the tile over K, update it),
    so one warp per program -- the K reductions are then register shuffles with no
    barrier -- and tiles of BK * BV <= 2048 (<= 64 fp32 registers per lane for the tile).
    BV halves (down to 8) while that leaves too few programs to fill the GPU: about 24
    SMs' worth of warp slots (64 per SM on sm80/sm90, 48 on sm86/sm89). Measured on an
    H200 at K = V = 128: T = 64, 256 heads: BV 16 beats 8 and 32; T = 4096, 64 heads: BV 8
    beats 16 by 10%.

    Registers (cubin, sm80..sm90): at most 254 per thread, no spills, for every K <= 256
    (the worst case is K = 256, BV = 8, one warp, per-channel gate; V sets the number of
    programs, never the tile, so V = 512 takes the tiles of V = 256); the 255-register cap
    and 64K-register file are the same on every target, so only the fill threshold
    depends on the arch.
    """
    arch = _arch.target_arch()
    BK = max(triton.next_power_of_2(K), 16)
    V_pow2 = max(triton.next_power_of_2(V), 8)
    if max_len <= DECODE_LEN:
        return BK, min(V_pow2, 32), 4
    BV = min(max(2048 // BK, 8), 32, V_pow2)
    warp_slots = 48 if arch in (86, 89) else 64
    while BV > 8 and n_heads * cdiv(V, BV) < 24 * warp_slots and not _arch.is_interpreter():
        BV //= 2  # the interpreter runs programs one after another: more of them only cost
    return BK, BV, 1


def backward_config(K: int, V: int) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the backward's reverse pass.

    It holds three [BK, BV] tiles (dS, the replayed state, the next state in flight). On an
    H200 at K = V = 128 the reverse pass ran equally fast at BV 16 / 2 warps and BV 32 / 4
    warps (and slower at 8 / 1 and 16 / 4); the wider tile halves the partial-gradient
    buffers ([NV, tokens, HV, K] fp32 for dq and dk), so BK * BV = 4096 over 4 warps, and
    over 8 warps at K = 256, where 4 warps sit at the 255-register cap; BV <= 32 (a [64, 64]
    tile over 4 warps also reaches the cap); small tiles get a warp per 512 elements.
    """
    BK = max(triton.next_power_of_2(K), 16)
    BV = min(max(4096 // BK, 8), 32, max(triton.next_power_of_2(V), 8))
    return BK, BV, 8 if BK > 128 else max(1, min(4, BK * BV // 512))


def checkpoint_interval(tokens: int, sequences: int) -> int:
    """C ~ sqrt(mean sequence length), a power of two in 16..128.

    Checkpoints take ``tokens / C + sequences`` states and scratch ``C`` states per
    program (one per sequence and value tile), so their sum is smallest at C = sqrt of
    the mean length. Written as comparisons on the sizes rather than a square root, so
    that under ``torch.compile(dynamic=True)`` two lengths in one bucket share a graph.
    """
    mean = tokens // max(sequences, 1)
    for c, below in ((16, 17 * 17), (32, 33 * 33), (64, 65 * 65)):  # isqrt(mean) <= c
        if mean < below:
            return c
    return 128


# --------------------------------------------------------------------------- launches


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, l2norm: bool,
             *, gate, keep, offsets):
    """The forward launch; returns ``((o, final state or None), (checkpoints or None,))``."""
    q, k, v, g, beta, initial_state = contiguous(q, k, v, g, beta, initial_state)
    save_checkpoints = keep
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C = checkpoint_interval(B * T, N)
    o = empty((B, T, HV, V), v.dtype, q.device)
    ht = empty((N, HV, K, V), torch.float32, q.device) if output_final_state else None
    ckpt = None
    if save_checkpoints:
        ckpt = empty((state_slots(B, T, N, C, cu_seqlens is not None), HV, K, V), torch.float32, q.device)
    if shapes_only():  # no launch: tile sizes from symbolic sizes cost sympy minutes under tracing
        return (o, ht), (ckpt,)
    BK, BV, num_warps = forward_config(K, V, longest_sequence(offsets, T), N * HV)
    grid = (N * HV * cdiv(V, BV),)
    if grid[0] > 0:
        fused_recurrent_delta_fwd_kernel[grid](
            q, k, v, g, beta, o, initial_state, ht, ckpt, cu_seqlens,
            scale, T,
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, C=C,
            GATE=gate, L2NORM=l2norm, VARLEN=cu_seqlens is not None,
            USE_H0=initial_state is not None, STORE_HT=output_final_state,
            SAVE_CKPT=save_checkpoints,
            num_warps=num_warps, num_stages=1, **RECURRENT_OPTIONS,
        )
    return (o, ht), (ckpt,)


def _backward(grads, saved, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, l2norm, *, gate):
    """The backward launches: gradients of the tensor arguments."""
    (ckpt,) = saved
    q, k, v, g, beta, initial_state, do, dht = contiguous(q, k, v, g, beta, initial_state, *grads)
    device = q.device
    result = dict(q=empty(q.shape, q.dtype, device), k=empty(k.shape, k.dtype, device),
                  v=empty(v.shape, v.dtype, device), g=empty(g.shape, g.dtype, device) if gate != GATE_NONE else None,
                  beta=empty(beta.shape, beta.dtype, device),
                  initial_state=empty(initial_state.shape, initial_state.dtype, device) if initial_state is not None else None)
    if shapes_only():  # the gradients' shapes are the inputs'; no tile sizes (see _forward)
        return result
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    C = checkpoint_interval(B * T, N)
    NTOK = B * T
    BK, BV, num_warps = backward_config(K, V)
    NV = cdiv(V, BV)
    n_programs = N * HV * NV

    scratch = empty((n_programs, C, BK, BV), torch.float32, device)
    dq_part = empty((NV, NTOK, HV, K), torch.float32, device)
    dk_part = empty((NV, NTOK, HV, K), torch.float32, device)
    dbeta_part = empty((NV, NTOK, HV), torch.float32, device)
    dg_part = None
    if gate != GATE_NONE:
        dg_part = empty((NV, NTOK, *g.shape[2:]), torch.float32, device)
    dv, dh0 = result["v"], result["initial_state"]
    if n_programs > 0:
        fused_recurrent_delta_bwd_kernel[(n_programs,)](
            q, k, v, g, beta, do, dht, ckpt, scratch, cu_seqlens,
            dq_part, dk_part, dv, dbeta_part, dg_part, dh0,
            scale, T, NTOK,
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, C=C,
            GATE=gate, L2NORM=l2norm, VARLEN=cu_seqlens is not None,
            USE_DHT=dht is not None, STORE_DH0=dh0 is not None,
            num_warps=num_warps, num_stages=1, **RECURRENT_OPTIONS,
        )

    dq, dk, dbeta, dg = result["q"], result["k"], result["beta"], result["g"]
    BT = max(2048 // BK, 1)
    n_blocks = cdiv(NTOK, BT) * H
    if n_blocks > 0:
        fused_recurrent_delta_reduce_kernel[(n_blocks,)](
            q, k, dq_part, dk_part, dq, dk, dbeta_part, dbeta, dg_part, dg, NTOK,
            H=H, HV=HV, K=K, NV=NV, BK=BK, BT=BT, GATE=gate, L2NORM=l2norm,
            num_warps=4, **RECURRENT_OPTIONS,
        )
    return result


OPS = {
    name: library.register(name, _forward, _backward, gate=gate)
    for name, gate in (("fused_recurrent_delta_rule", GATE_NONE), ("fused_recurrent_gated_delta_rule", GATE_HEAD),
                       ("fused_recurrent_kda", GATE_CHANNEL))
}


# --------------------------------------------------------------------------- validation


def _validate_inputs(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                     use_qk_l2norm_in_kernel, gate):
    _validate.check_tensor(op, "q", q)
    _validate.check_tensor(op, "k", k)
    _validate.check_tensor(op, "v", v)
    _validate.check_same_dtype(op, q=q, k=k, v=v)
    _validate.check_tensor(op, "beta", beta)
    if gate != GATE_NONE:
        _validate.check_tensor(op, "g", g)
    _validate.check_scale(op, scale)
    if not isinstance(use_qk_l2norm_in_kernel, bool):
        raise TypeError(f"{op}: `use_qk_l2norm_in_kernel` must be a bool, got "
                        f"{type(use_qk_l2norm_in_kernel).__name__}")
    device = _validate.check_devices(op, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)

    _validate.check_ndim(op, "q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    _validate.check_shape(op, "k", k, (B, T, H, K), "[B, T, H, K]")
    _validate.check_ndim(op, "v", v, 4, "[B, T, HV, V]" if gate != GATE_NONE else "[B, T, H, V]")
    HV, V = v.shape[2], v.shape[3]
    _validate.check_heads(op, "q", H, "[B, T, H, K]")
    _validate.check_heads(op, "v", HV, "[B, T, HV, V]")
    if gate == GATE_NONE:
        _validate.check_shape(op, "v", v, (B, T, H, V), "[B, T, H, V]")
    else:
        _validate.check_shape(op, "v", v, (B, T, HV, V), "[B, T, HV, V]")
        if HV % H != 0:
            raise ValueError(
                f"{op}: `v` has HV = {HV} heads, which must be a multiple of the H = {H} heads of "
                "`q` and `k` (grouped value heads)")
    _validate.check_shape(op, "beta", beta, (B, T, HV), "[B, T, HV]")
    if gate == GATE_HEAD:
        _validate.check_shape(op, "g", g, (B, T, HV), "[B, T, HV]")
    elif gate == GATE_CHANNEL:
        _validate.check_shape(op, "g", g, (B, T, HV, K), "[B, T, HV, K]")
    _validate.check_range(op, "the key head dim K (q.shape[-1])", K, 1, MAX_KEY_HEAD_DIM)
    _validate.check_range(op, "the value head dim V (v.shape[-1])", V, 1, MAX_VALUE_HEAD_DIM)

    offsets = _validate.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    _validate.check_initial_state(op, initial_state, (N, HV, K, V), "[N, HV, K, V]")
    return offsets


def _run(op, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu,
         use_qk_l2norm_in_kernel, gate):
    offsets = _validate_inputs(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                               use_qk_l2norm_in_kernel, gate)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return OPS[op](q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, bool(output_final_state),
                   use_qk_l2norm_in_kernel, offsets=offsets)


# --------------------------------------------------------------------------- public ops


def fused_recurrent_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """Delta rule, one pass over time: ``S_t = (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T``.

    q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; ``o_t = S_t^T (scale q_t)``, scale
    defaulting to K^-0.5. initial_state [N, H, K, V] float32; returns (o, final_state or
    None). ``cu_seqlens`` (with ``cu_seqlens_cpu`` to skip the host sync) packs N sequences
    into B = 1. ``use_qk_l2norm_in_kernel`` L2-normalises q and k first (eps 1e-6).
    """
    return _run("fused_recurrent_delta_rule", q, k, v, None, beta, scale, initial_state,
                output_final_state, cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, GATE_NONE)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None,
                                     use_qk_l2norm_in_kernel=False):
    """Gated delta rule: ``S_t = e^{g_t} (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T``.

    q, k [B, T, H, K]; v [B, T, HV, V]; g (log decay), beta [B, T, HV]; HV % H == 0 and
    value head j reads query/key head j // (HV // H). State [N, HV, K, V]; o [B, T, HV, V].
    Other arguments as in :func:`fused_recurrent_delta_rule`.
    """
    return _run("fused_recurrent_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                output_final_state, cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, GATE_HEAD)


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """Kimi delta attention: ``S' = diag(e^{g_t}) S_{t-1}``, ``S_t = (I - β_t k_t k_t^T) S' + β_t k_t v_t^T``.

    g [B, T, HV, K] (per-channel log decay); otherwise as
    :func:`fused_recurrent_gated_delta_rule`.
    """
    return _run("fused_recurrent_kda", q, k, v, g, beta, scale, initial_state,
                output_final_state, cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel, GATE_CHANNEL)
