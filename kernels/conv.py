"""Depthwise causal 1-d convolution with a carried input history (the "short conv").

For each channel ``d`` and token ``t`` of a sequence starting at ``s``::

    a_t = bias + sum_{i < W} weight[d, i] * v_{t - W + 1 + i},    y_t = act(a_t)

where ``v_q = x_q`` for ``q >= s`` and, before the sequence starts, ``v_q`` is
``initial_state[n, d, q - s + W - 1]`` (oldest first) or zero. The final state is
``v_{e-W+1} .. v_{e-1}`` for a sequence ending at ``e``: its last ``W - 1`` inputs, filled
in from the initial state when the sequence is shorter than that.

Backward, with ``da_t = dy_t * act'(a_t)`` (``act' = s (1 + a (1 - s))`` for silu,
``s = sigmoid(a)``) and zero outside the sequence::

    dx_q       = sum_i weight[d, i] * da_{q + W - 1 - i}  (+ dfinal where x_q is in the final state)
    dweight_i  = sum_t da_t * v_{t - W + 1 + i},      dbias = sum_t da_t
    dinitial_k = sum_{m <= k} weight[d, k - m] * da_{s + m}  (+ dfinal where it was carried over)

Kernels (token tiles never straddle batch rows; under ``cu_seqlens`` a tile may straddle
sequences and each token finds its own in the kernel, ``_sequence.sequence_span``, so no
host table is built; only tiles that hold one of a sequence's first ``W - 1`` tokens
read the initial state):

* ``_conv_fwd_kernel``: grid ``(B * cdiv(T, BLOCK_T), cdiv(D, BLOCK_D))``; ``W`` shifted
  loads of the tile (the overlap comes from L1/L2).
* ``_conv_final_state_kernel``: grid ``(N, cdiv(D, BLOCK_D))``.
* ``_conv_bwd_kernel``: a fixed number of programs on axis 0, each looping over token
  tiles; it loads the ``2W - 1`` shifted inputs and ``W`` shifted ``dy`` once a tile,
  recomputes ``a`` for silu, writes ``dx`` and keeps its share of ``dweight``/``dbias``
  in registers, reduced afterwards by ``_partials.column_sum`` (deterministic).
* ``_conv_initial_state_grad_kernel``: grid ``(N, cdiv(D, BLOCK_D))``, the first
  ``W - 1`` tokens of each sequence.

``x`` and ``dy`` are read through their strides (a channel slice of a wider projection,
or a gradient that arrives as a slice of a concat, needs no copy); only a unit stride
along ``D`` is required, and anything else is copied first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _partials, _utils
from . import _validate as V
from ._sequence import search_steps, sequence_span, tile_origin

MIN_WIDTH, MAX_WIDTH = 2, 4
_ACTIVATIONS = (None, "silu", "swish")


@triton.jit
def _inputs(x_tile, stride_xt, state, rel, t, t_ok, start, end, n, d, d_ok, D,
            W: tl.constexpr, HAS_STATE: tl.constexpr, near_start):
    """``v_q`` as float32 ``[BLOCK_T, BLOCK_D]`` for ``q = t + rel``: ``x`` when ``start <= q < end``
    (``x_tile`` points at the tile's first row), else the initial state of sequence ``n``
    (or zero). Only tiles ``near_start`` of a sequence read the state."""
    q = t + rel
    r = tl.arange(0, t.shape[0]) + rel
    v = tl.load(
        x_tile + r[:, None] * stride_xt + d[None, :],
        mask=(t_ok & (q >= start) & (q < end))[:, None] & d_ok[None, :], other=0.0,
    ).to(tl.float32)
    if HAS_STATE:
        if near_start:
            # ``state`` is laid out [N, W - 1, D] here, so this load is as coalesced as x's
            v += tl.load(
                state + (n * (W - 1) + (q - start + W - 1))[:, None] * D + d[None, :],
                mask=(t_ok & (q < start))[:, None] & d_ok[None, :], other=0.0,
            )
    return v


@triton.jit
def _near_start(t, t_ok, start, W: tl.constexpr):
    """Whether any token of the tile is among the first ``W - 1`` of its sequence."""
    return tl.min(tl.where(t_ok, t - start, W), axis=0) < W - 1


@triton.jit
def _silu_slope(a):
    s = tl.sigmoid(a)
    return s * (1.0 + a * (1.0 - s))


@triton.jit
def _conv_fwd_kernel(
    x, weight, bias, state, cu_seqlens, y,
    T, D, stride_xb, stride_xt, N, steps,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr,
    SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b, t0 = tile_origin(tl.program_id(0), T, BLOCK_T)
    t = t0 + tl.arange(0, BLOCK_T)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    t_ok = t < T
    d_ok = d < D
    n, start, end = sequence_span(t, b, cu_seqlens, T, N, steps, VARLEN, BLOCK_T)
    near_start = _near_start(t, t_ok, start, W)
    x_tile = x + b.to(tl.int64) * stride_xb + t0.to(tl.int64) * stride_xt
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    for i in tl.static_range(W):
        w_i = tl.load(weight + d * W + i, mask=d_ok, other=0.0).to(tl.float32)
        acc += w_i[None, :] * _inputs(x_tile, stride_xt, state, i - (W - 1), t, t_ok, start, end, n, d, d_ok, D,
                                      W, HAS_STATE, near_start)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    y_tile = y + (b.to(tl.int64) * T + t0) * D
    r = tl.arange(0, BLOCK_T)
    tl.store(y_tile + r[:, None] * D + d[None, :], acc.to(y.dtype.element_ty), mask=t_ok[:, None] & d_ok[None, :])


@triton.jit
def _sequence_bounds(cu_seqlens, n, T, VARLEN: tl.constexpr):
    """``(row offset scale b, start, end)`` of sequence ``n`` as scalars."""
    if VARLEN:
        return 0, tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64)
    else:
        return n, n * 0, n * 0 + T


@triton.jit
def _conv_final_state_kernel(
    x, state, cu_seqlens, final,
    T, D, stride_xb, stride_xt,
    W: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Rows of the tile are final-state entries ``k``: inputs ``end - W + 1 + k``."""
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    b, start, end = _sequence_bounds(cu_seqlens, n, T, VARLEN)
    k = tl.arange(0, BLOCK_W)
    zero = tl.zeros([BLOCK_W], dtype=tl.int64)
    first = end - (W - 1)
    v = _inputs(x + b * stride_xb + first * stride_xt, stride_xt, state, 0, first + k, k < W - 1,
                zero + start, zero + end, zero + n, d, d_ok, D, W, HAS_STATE, True)
    tl.store(final + n * D * (W - 1) + d[None, :] * (W - 1) + k[:, None], v, mask=(k < W - 1)[:, None] & d_ok[None, :])


@triton.jit
def _conv_bwd_kernel(
    x, weight, bias, state, cu_seqlens, dy, dfinal, dx, dparams,
    T, D, stride_xb, stride_xt, stride_dyb, stride_dyt, N, steps, num_tiles,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, HAS_DFINAL: tl.constexpr,
    VARLEN: tl.constexpr, SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program ``(j, c)`` handles token tiles j, j + P, ... of channel block c and writes its
    share of dweight (slots 0..W-1) and dbias (slot W) to ``dparams[j, slot, d]``.

    Per tile: ``da_{t+m}`` for ``m < W`` from ``dy`` (and, for silu, from the recomputed
    ``a_{t+m}``, which needs the input window ``v_{t+m-W+1} .. v_{t+m}``, slid one row at
    a time so that only ``W`` input tiles are live), then ``dx_t = sum_i w_i da_{t+W-1-i}``.
    """
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    r = tl.arange(0, BLOCK_T)
    w = ()
    acc_dw = ()
    for i in tl.static_range(W):
        w = w + (tl.load(weight + d * W + i, mask=d_ok, other=0.0).to(tl.float32)[None, :],)
        acc_dw = acc_dw + (tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32),)
    bias_row = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias_row += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    acc_db = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for tile in range(pid, num_tiles, num_programs):
        b, t0 = tile_origin(tile, T, BLOCK_T)
        t = t0 + r
        t_ok = t < T
        n, start, end = sequence_span(t, b, cu_seqlens, T, N, steps, VARLEN, BLOCK_T)
        near_start = _near_start(t, t_ok, start, W)
        x_tile = x + b.to(tl.int64) * stride_xb + t0.to(tl.int64) * stride_xt
        dy_tile = dy + b.to(tl.int64) * stride_dyb + t0.to(tl.int64) * stride_dyt
        window = ()  # window[i] = v_{t + m - W + 1 + i}
        for i in tl.static_range(W):
            window = window + (_inputs(x_tile, stride_xt, state, i - (W - 1), t, t_ok, start, end, n, d, d_ok, D,
                                       W, HAS_STATE, near_start),)
        da = ()
        for m in tl.static_range(W):
            if SILU and m > 0:
                slid = ()
                for i in tl.static_range(1, W):
                    slid = slid + (window[i],)
                window = slid + (_inputs(x_tile, stride_xt, state, m, t, t_ok, start, end, n, d, d_ok, D,
                                         W, HAS_STATE, near_start),)
            g = tl.load(
                dy_tile + (r + m)[:, None] * stride_dyt + d[None, :],
                mask=(t_ok & (t + m < end))[:, None] & d_ok[None, :], other=0.0,
            ).to(tl.float32)
            if SILU:
                a = bias_row
                for i in tl.static_range(W):
                    a = a + w[i] * window[i]
                g = g * _silu_slope(a)
            if m == 0:
                new_dw = ()
                for i in tl.static_range(W):
                    new_dw = new_dw + (acc_dw[i] + g * window[i],)
                acc_dw = new_dw
                acc_db += g
            da = da + (g,)
        grad = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for i in tl.static_range(W):
            grad += w[i] * da[W - 1 - i]
        k_final = t - (end - (W - 1))  # entry of the final state that x_t became
        if HAS_DFINAL and tl.max(tl.where(t_ok, k_final, -1), axis=0) >= 0:
            grad += tl.load(
                dfinal + (n * (W - 1) + k_final)[:, None] * D + d[None, :],
                mask=(t_ok & (k_final >= 0))[:, None] & d_ok[None, :], other=0.0,
            )
        dx_tile = dx + (b.to(tl.int64) * T + t0) * D
        tl.store(dx_tile + r[:, None] * D + d[None, :], grad.to(dx.dtype.element_ty),
                 mask=t_ok[:, None] & d_ok[None, :])
    row = dparams + pid.to(tl.int64) * (W + 1) * D + d
    for i in tl.static_range(W):
        tl.store(row + i * D, tl.sum(acc_dw[i], axis=0), mask=d_ok)
    tl.store(row + W * D, tl.sum(acc_db, axis=0), mask=d_ok)


@triton.jit
def _conv_initial_state_grad_kernel(
    x, weight, bias, state, cu_seqlens, dy, dfinal, dstate,
    T, D, stride_xb, stride_xt, stride_dyb, stride_dyt,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DFINAL: tl.constexpr,
    VARLEN: tl.constexpr, SILU: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``dinitial_k = sum_{m <= k} weight[k - m] da_{s+m}`` plus the final-state gradient
    of entries carried over from the initial state (sequences shorter than ``W - 1``).
    Rows of the tile are the ``W - 1`` first tokens ``s + m`` of sequence ``n``."""
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    b, start, end = _sequence_bounds(cu_seqlens, n, T, VARLEN)
    m = tl.arange(0, BLOCK_W)
    zero = tl.zeros([BLOCK_W], dtype=tl.int64)
    t = start + m
    t_ok = (m < W - 1) & (t < end)
    da = tl.load(
        dy + b * stride_dyb + t[:, None] * stride_dyt + d[None, :],
        mask=t_ok[:, None] & d_ok[None, :], other=0.0,
    ).to(tl.float32)
    if SILU:
        a = tl.zeros([BLOCK_W, BLOCK_D], dtype=tl.float32)
        if HAS_BIAS:
            a += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        x_tile = x + b * stride_xb + start * stride_xt
        for i in tl.static_range(W):
            w_i = tl.load(weight + d * W + i, mask=d_ok, other=0.0).to(tl.float32)
            a += w_i[None, :] * _inputs(x_tile, stride_xt, state, i - (W - 1), t, t_ok, zero + start, zero + end,
                                        zero + n, d, d_ok, D, W, True, True)
        da = da * _silu_slope(a)
    for k in tl.static_range(W - 1):
        # weight[k - m] picks row m of da; rows m > k do not reach entry k
        taps = tl.load(weight + d[None, :] * W + (k - m)[:, None], mask=(m <= k)[:, None] & d_ok[None, :], other=0.0)
        grad = tl.sum(taps.to(tl.float32) * da, axis=0)
        if HAS_DFINAL:
            k_final = k - (end - start)
            grad += tl.load(dfinal + (n * (W - 1) + k_final) * D + d, mask=d_ok & (k_final >= 0), other=0.0)
        tl.store(dstate + n * D * (W - 1) + d * (W - 1) + k, grad, mask=d_ok)


def _as_rows(state: torch.Tensor | None) -> torch.Tensor | None:
    """A state ``[N, D, W - 1]`` as ``[N, W - 1, D]``: the kernels read it like rows of x."""
    return None if state is None else state.transpose(1, 2).contiguous()


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _row_strides(t: torch.Tensor):
    return t.stride(0), t.stride(1)


class _CausalConv1dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, output_final_state, cu_seqlens, num_sequences, silu):
        B, T, D = x.shape
        W = weight.shape[1]
        x = _unit_last_stride(x)
        weight = weight.contiguous()
        varlen = cu_seqlens is not None
        state_rows = _as_rows(initial_state)
        y = _utils.empty((B, T, D), x.dtype, x.device)
        BLOCK_T, BLOCK_D, num_warps = _fwd_config(D)
        if B * T > 0 and D > 0:
            _conv_fwd_kernel[(B * _utils.cdiv(T, BLOCK_T), _utils.cdiv(D, BLOCK_D))](
                x, weight, bias, state_rows, cu_seqlens, y,
                T, D, *_row_strides(x), num_sequences, search_steps(num_sequences),
                W=W, HAS_BIAS=bias is not None, HAS_STATE=initial_state is not None, VARLEN=varlen,
                SILU=silu, BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, num_warps=num_warps,
            )
        final_state = None
        if output_final_state:
            final_state = _utils.empty((num_sequences, D, W - 1), torch.float32, x.device)
            if num_sequences > 0 and D > 0:
                BLOCK_DS = min(128, triton.next_power_of_2(D))
                _conv_final_state_kernel[(num_sequences, _utils.cdiv(D, BLOCK_DS))](
                    x, state_rows, cu_seqlens, final_state,
                    T, D, *_row_strides(x),
                    W=W, HAS_STATE=initial_state is not None, VARLEN=varlen,
                    BLOCK_W=triton.next_power_of_2(W - 1), BLOCK_D=BLOCK_DS, num_warps=4,
                )
        ctx.save_for_backward(x, weight, bias, state_rows, cu_seqlens)
        ctx.num_sequences = num_sequences
        ctx.silu = silu
        return y, final_state

    @staticmethod
    def backward(ctx, dy, dfinal):
        x, weight, bias, state_rows, cu_seqlens = ctx.saved_tensors
        B, T, D = x.shape
        W = weight.shape[1]
        N = ctx.num_sequences
        varlen = cu_seqlens is not None
        dy = _unit_last_stride(dy)
        dfinal_rows = _as_rows(dfinal)
        dx = _utils.empty((B, T, D), x.dtype, x.device)
        BLOCK_T, BLOCK_D, num_warps = _bwd_config(D, W)
        tiles = B * _utils.cdiv(T, BLOCK_T)
        d_blocks = _utils.cdiv(D, BLOCK_D)
        programs = _partials.partial_programs(x.device, max(1, tiles), num_warps, other_programs=d_blocks)
        dparams = _utils.empty((programs, (W + 1) * D), torch.float32, x.device)
        if B * T > 0 and D > 0:
            _conv_bwd_kernel[(programs, d_blocks)](
                x, weight, bias, state_rows, cu_seqlens, dy, dfinal_rows, dx, dparams,
                T, D, *_row_strides(x), *_row_strides(dy), N, search_steps(N), tiles,
                W=W, HAS_BIAS=bias is not None, HAS_STATE=state_rows is not None,
                HAS_DFINAL=dfinal_rows is not None, VARLEN=varlen, SILU=ctx.silu,
                BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, num_warps=num_warps,
            )
        else:
            dparams.zero_()
        sums = _partials.column_sum(dparams, torch.float32)
        dweight = sums[: W * D].view(W, D).t().to(weight.dtype).contiguous()
        dbias = sums[W * D:].to(bias.dtype) if bias is not None else None
        dstate = None
        if state_rows is not None and ctx.needs_input_grad[3]:
            dstate = _utils.empty((N, D, W - 1), torch.float32, x.device)
            if N > 0 and D > 0:
                BLOCK_DS = min(128, triton.next_power_of_2(D))
                _conv_initial_state_grad_kernel[(N, _utils.cdiv(D, BLOCK_DS))](
                    x, weight, bias, state_rows, cu_seqlens, dy, dfinal_rows, dstate,
                    T, D, *_row_strides(x), *_row_strides(dy),
                    W=W, HAS_BIAS=bias is not None, HAS_DFINAL=dfinal_rows is not None, VARLEN=varlen,
                    SILU=ctx.silu, BLOCK_W=triton.next_power_of_2(W - 1), BLOCK_D=BLOCK_DS, num_warps=4,
                )
        return dx, dweight, dbias, dstate, None, None, None, None


def _fwd_config(D: int):
    """(BLOCK_T, BLOCK_D, num_warps): about 8K outputs a program, channels contiguous."""
    BLOCK_D = min(128, triton.next_power_of_2(D))
    return max(16, 4096 // BLOCK_D), BLOCK_D, 8


def _bwd_config(D: int, W: int):
    """Smaller tiles than the forward: a tile keeps 2W - 1 inputs, W gradients and W + 1
    accumulators in registers."""
    BLOCK_D = min(128, triton.next_power_of_2(D))
    return max(8, 2048 // BLOCK_D), BLOCK_D, 8


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
):
    """Depthwise causal conv over time; returns ``(y, final_state)``.

    x ``[B, T, D]``; weight ``[D, W]`` with ``2 <= W <= 4``; bias ``[D]``; activation None
    or ``'silu'`` (alias ``'swish'``); initial_state float32 ``[N, D, W - 1]`` (oldest input
    first); final_state float32 ``[N, D, W - 1]`` when ``output_final_state``. y has
    x's dtype, each gradient its input's dtype. See the module docstring for the math.
    """
    op = "causal_conv1d"
    V.check_tensor(op, "x", x)
    V.check_tensor(op, "weight", weight)
    if bias is not None:
        V.check_tensor(op, "bias", bias)
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{op}: `activation` must be None, 'silu' or 'swish', got {activation!r}")
    device = V.check_devices(op, x=x, weight=weight, bias=bias, initial_state=initial_state,
                             cu_seqlens=cu_seqlens if isinstance(cu_seqlens, torch.Tensor) else None)
    V.check_ndim(op, "x", x, 3, "[B, T, D]")
    V.check_ndim(op, "weight", weight, 2, "[D, W]")
    B, T, D = x.shape
    W = weight.shape[1]
    V.check_range(op, "the kernel width W (weight.shape[1])", W, MIN_WIDTH, MAX_WIDTH)
    V.check_shape(op, "weight", weight, (D, W), "[D, W]")
    if bias is not None:
        V.check_shape(op, "bias", bias, (D,), "[D]")
    offsets = V.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    V.check_initial_state(op, initial_state, (N, D, W - 1), "[N, D, W - 1]")
    del offsets  # validated; the kernels find each token's sequence on the device
    return _CausalConv1dFunction.apply(
        x, weight, bias, initial_state, bool(output_final_state), cu_seqlens, N, activation is not None
    )
