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

Kernels. The long kernels stream: program ``(b * ranges + r, c)`` owns channel block ``c``
(2 channels a thread forward, 4 backward) and rows ``[r * ROWS, (r + 1) * ROWS)`` of batch
row ``b`` and walks them one row at a time, keeping the last ``W - 1`` inputs (and,
backward, the last ``W - 1`` values of ``da``) in registers. Rows are loaded ``AHEAD`` at a
time, the next group's loads issued before the current group is computed, so every input
row is read from memory once (plus ``W - 1`` halo rows a range) and no tile is re-read
through the cache. Under ``cu_seqlens`` a range may cross sequences: the program finds
the sequence of its first row by bisection and steps to the next one when a row reaches
its end, refilling the window from that sequence's initial state (or zeros). No host
table is built and the grid depends on ``B``, ``T`` and ``D`` alone.

* ``_conv_fwd_kernel``: grid ``(B * cdiv(T, ROWS) * cdiv(D, BLOCK_D),)``, the channel blocks of
  a row range side by side (``FWD_CHANNELS_FASTEST``; else ``(B * cdiv(T, ROWS), cdiv(D, BLOCK_D))``).
* ``_conv_final_state_kernel``: grid ``(N, cdiv(D, BLOCK_D))``.
* ``_conv_bwd_kernel``: grid ``(B * cdiv(T, ROWS), cdiv(D, BLOCK_D))``; each program writes ``dx`` for its
  rows and one row of dweight/dbias partial sums (``da`` of its rows times the window),
  which ``_partials.column_sum`` adds up in a fixed order (deterministic, no atomics).
* ``_conv_initial_state_grad_kernel``: grid ``(N, cdiv(D, BLOCK_D))``, the first
  ``W - 1`` tokens of each sequence.

The state tensors are read as ``[N, W - 1, D]`` (a transposed copy of the small
``[N, D, W - 1]`` state), so a state row loads like a row of ``x``.
``x`` and ``dy`` are read through their strides (a channel slice of a wider projection,
or a gradient that arrives as a slice of a concat, needs no copy); only a unit stride
along ``D`` is required, and anything else is copied first.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import _library as library
from . import _partials, _utils
from ._arch import COMPILE_OPTIONS
from . import _validate as V
from ._sequence import search_steps

MIN_WIDTH, MAX_WIDTH = 2, 4
_ACTIVATIONS = (None, "silu", "swish")


@triton.jit
def _silu_slope(a):
    s = tl.sigmoid(a)
    return s * (1.0 + a * (1.0 - s))


@triton.jit
def _shift_in(items, new, LENGTH: tl.constexpr):
    """``items[1:] + (new,)`` for a tuple of ``LENGTH`` tensors."""
    out = ()
    for k in tl.static_range(1, LENGTH):
        out = out + (items[k],)
    return out + (new,)


@triton.jit
def _load_row(base, row, stride, d, ok):
    return tl.load(base + row * stride + d, mask=ok, other=0.0)  # rows are int64 here


@triton.jit
def _load_rows(base, first, stop, stride, d, d_ok, COUNT: tl.constexpr):
    """Rows ``first .. first + COUNT - 1`` (zero from ``stop`` on) as a tuple, loaded as they
    are: the streaming loops take their rows a group of ``COUNT`` at a time, issuing the next
    group's loads before computing the current one. (A queue shifted by one row an iteration
    compiles to register moves that wait on the load just issued, one row in flight a thread.)"""
    rows = ()
    for k in tl.static_range(COUNT):
        rows = rows + (_load_row(base, first + k, stride, d, tl.where(first + k < stop, d_ok, False)),)
    return rows


@triton.jit
def _history_rows(x_b, stride_xt, state, first, start, end, n, d, d_ok, D,
                  COUNT: tl.constexpr, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """``v_q`` for ``q = first .. first + COUNT - 1`` as a tuple of float32 ``[BLOCK_D]`` rows:
    ``x`` inside the sequence ``[start, end)``, its initial state (``n``) before it, zero after."""
    rows = ()
    for k in tl.static_range(COUNT):
        q = first + k
        v = _load_row(x_b, q, stride_xt, d, tl.where((q >= start) & (q < end), d_ok, False)).to(tl.float32)
        if HAS_STATE:
            v += tl.load(state + (n * (W - 1) + q - start + W - 1) * D + d, mask=tl.where(q < start, d_ok, False),
                         other=0.0).to(tl.float32)
        rows = rows + (v,)
    return rows


@triton.jit
def _sequence_at(cu_seqlens, t, N, steps):
    """``(n, end)`` of the sequence holding packed row ``t``: the largest ``n`` with
    ``cu[n] <= t`` (skipping empty sequences), by bisection."""
    lo = t * 0
    hi = lo + N
    for _ in range(steps):
        mid = (lo + hi) // 2
        right = tl.load(cu_seqlens + mid) <= t
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo, tl.load(cu_seqlens + lo + 1).to(tl.int64)


@triton.jit
def _program_blocks(D, BLOCK_D: tl.constexpr, CHANNELS_FASTEST: tl.constexpr):
    """``(row block, channel block)`` of this program. CHANNELS_FASTEST: a 1-d grid whose
    neighbouring programs take the channel blocks of one row block, so the programs in
    flight read whole rows of memory; else axis 0 the row block, axis 1 the channel block."""
    if CHANNELS_FASTEST:
        blocks = tl.cdiv(D, BLOCK_D)
        return tl.program_id(0) // blocks, tl.program_id(0) % blocks
    else:
        return tl.program_id(0), tl.program_id(1)


@triton.jit
def _stream_setup(weight, bias, cu_seqlens, T, D, N, steps, ranges,
                  W: tl.constexpr, HAS_BIAS: tl.constexpr, VARLEN: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK_D: tl.constexpr, CHANNELS_FASTEST: tl.constexpr = False):
    """What a streaming program owns: batch row ``b``, rows ``[r0, r1)``, channels ``d``,
    its weight taps and bias as float32, and the sequence ``n`` (with its ``start`` and
    ``end``) holding row ``r0``."""
    pid, c = _program_blocks(D, BLOCK_D, CHANNELS_FASTEST)
    b = pid // ranges
    r0 = ((pid % ranges) * ROWS).to(tl.int64)
    r1 = tl.minimum(r0 + ROWS, T)
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    w = ()
    for i in tl.static_range(W):
        w = w + (tl.load(weight + d * W + i, mask=d_ok, other=0.0).to(tl.float32),)
    bias_row = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias_row += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)
    if VARLEN:
        n, end = _sequence_at(cu_seqlens, r0, N, steps)
        start = tl.load(cu_seqlens + n).to(tl.int64)
    else:
        n = b.to(tl.int64)
        start = r0 * 0
        end = start + T
    return b, r0, r1, d, d_ok, w, bias_row, n, start, end


@triton.jit
def _advance(cu_seqlens, row, n, end):
    """Step ``(n, end)`` on to the sequence holding ``row``, past any empty ones."""
    while row >= end:
        n += 1
        end = tl.load(cu_seqlens + n + 1).to(tl.int64)
    return n, end


@triton.jit
def _enter_sequence(cu_seqlens, x_b, stride_xt, state, row, n, end, d, d_ok, D, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """At ``row``, the first row of a sequence after ``n``: that sequence's ``(n, end)`` and the
    window before its first row (its initial state, or zeros)."""
    n, end = _advance(cu_seqlens, row, n, end)
    window = _history_rows(x_b, stride_xt, state, row - (W - 1), row, end, n, d, d_ok, D, W - 1, W, HAS_STATE)
    return n, end, window


@triton.jit
def _preactivation(bias_row, w, window, x_row, W: tl.constexpr):
    """``a_t = bias + sum_i w_i v_{t - W + 1 + i}`` from the window before row ``t`` and its input."""
    acc = bias_row + w[W - 1] * x_row
    for i in tl.static_range(W - 1):
        acc += w[i] * window[i]
    return acc


@triton.jit
def _conv_fwd_kernel(
    x, weight, bias, state, cu_seqlens, y,
    T, D, stride_xb, stride_xt, N, steps, ranges,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr,
    SILU: tl.constexpr, ROWS: tl.constexpr, AHEAD: tl.constexpr, BLOCK_D: tl.constexpr,
    CHANNELS_FASTEST: tl.constexpr,
):
    """Program ``(b * ranges + r, c)`` streams rows ``[r * ROWS, (r + 1) * ROWS)`` of batch row
    ``b`` for channel block ``c``: the ``W - 1`` previous inputs stay in registers as a
    sliding window, and the next ``AHEAD`` rows are being loaded while ``AHEAD`` are computed."""
    b, r0, r1, d, d_ok, w, bias_row, n, start, end = _stream_setup(
        weight, bias, cu_seqlens, T, D, N, steps, ranges, W, HAS_BIAS, VARLEN, ROWS, BLOCK_D, CHANNELS_FASTEST)
    x_b = x + b.to(tl.int64) * stride_xb
    y_b = y + b.to(tl.int64) * T * D
    window = _history_rows(x_b, stride_xt, state, r0 - (W - 1), start, end, n, d, d_ok, D, W - 1, W, HAS_STATE)
    group = _load_rows(x_b, r0, r1, stride_xt, d, d_ok, AHEAD)
    for t0 in range(r0, r1, AHEAD):
        # the next group's loads go out before this group is computed (see _load_rows)
        ahead = _load_rows(x_b, t0 + AHEAD, r1, stride_xt, d, d_ok, AHEAD)
        for k in tl.static_range(AHEAD):
            t = t0 + k
            if VARLEN:
                if (t >= end) & (t < r1):  # the first row of a new sequence
                    n, end, window = _enter_sequence(cu_seqlens, x_b, stride_xt, state, t, n, end, d, d_ok, D, W, HAS_STATE)
            xt = group[k].to(tl.float32)
            acc = _preactivation(bias_row, w, window, xt, W)
            if SILU:
                acc = acc * tl.sigmoid(acc)
            tl.store(y_b + t * D + d, acc.to(y.dtype.element_ty), mask=tl.where(t < r1, d_ok, False))
            window = _shift_in(window, xt, W - 1)
        group = ahead


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
    W: tl.constexpr, HAS_STATE: tl.constexpr, VARLEN: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``final[n, :, k] = v_{end - W + 1 + k}``."""
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    b, start, end = _sequence_bounds(cu_seqlens, n, T, VARLEN)
    rows = _history_rows(x + b * stride_xb, stride_xt, state, end - (W - 1), start, end, n, d, d_ok, D,
                         W - 1, W, HAS_STATE)
    for k in tl.static_range(W - 1):
        tl.store(final + (n * D + d) * (W - 1) + k, rows[k], mask=d_ok)


@triton.jit
def _conv_bwd_kernel(
    x, weight, bias, state, cu_seqlens, dy, dfinal, dx, dparams,
    T, D, stride_xb, stride_xt, stride_dyb, stride_dyt, N, steps, ranges,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, HAS_DFINAL: tl.constexpr,
    VARLEN: tl.constexpr, SILU: tl.constexpr, ROWS: tl.constexpr, AHEAD: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program ``(b * ranges + r, c)`` writes ``dx`` for rows ``q`` in ``[r0, r1)`` of batch
    row ``b`` (channel block ``c``) and its share of dweight/dbias (``da`` of those rows) to
    ``dparams[b * ranges + r, slot, d]`` (slots 0..W-1 dweight, W dbias).

    It streams rows ``j`` from ``r0`` to ``r1 + W - 2``: ``da_j`` from ``dy_j`` (and, for silu,
    ``a_j`` recomputed from the window ``v_{j-W+1} .. v_j``), then
    ``dx_q = sum_i w_i da_{j-i}`` for ``q = j - W + 1``, dropping ``da_t`` of rows past the end
    of ``q``'s sequence. The window and the last ``W`` values of ``da`` slide in registers;
    ``x`` and ``dy`` rows are loaded a group of ``AHEAD`` ahead.
    """
    b, r0, r1, d, d_ok, w, bias_row, n_j, start_j, end_j = _stream_setup(
        weight, bias, cu_seqlens, T, D, N, steps, ranges, W, HAS_BIAS, VARLEN, ROWS, BLOCK_D)
    last = tl.minimum(r1 + W - 1, T)  # rows j past r1 only feed dx of the range's last rows
    x_b = x + b.to(tl.int64) * stride_xb
    dy_b = dy + b.to(tl.int64) * stride_dyb
    dx_b = dx + b.to(tl.int64) * T * D
    acc_dw = ()
    for i in tl.static_range(W):
        acc_dw = acc_dw + (tl.zeros([BLOCK_D], dtype=tl.float32),)
    acc_db = tl.zeros([BLOCK_D], dtype=tl.float32)
    # (n_j, end_j): sequence of the row j being read; (n_q, end_q): of the row q being written
    n_q = n_j
    end_q = end_j
    window = _history_rows(x_b, stride_xt, state, r0 - (W - 1), start_j, end_j, n_j, d, d_ok, D, W - 1, W, HAS_STATE)
    history = ()  # da of the W - 1 rows before j; rows before r0 never reach a dx written here
    for k in tl.static_range(W - 1):
        history = history + (tl.zeros([BLOCK_D], dtype=tl.float32),)
    x_group = _load_rows(x_b, r0, last, stride_xt, d, d_ok, AHEAD)
    dy_group = _load_rows(dy_b, r0, last, stride_dyt, d, d_ok, AHEAD)
    for j0 in range(r0, r1 + W - 1, AHEAD):
        x_ahead = _load_rows(x_b, j0 + AHEAD, last, stride_xt, d, d_ok, AHEAD)
        dy_ahead = _load_rows(dy_b, j0 + AHEAD, last, stride_dyt, d, d_ok, AHEAD)
        for k in tl.static_range(AHEAD):
            # rows j past the loop's end (the group's tail) load zeros and write nothing
            j = j0 + k
            if VARLEN:
                if (j >= end_j) & (j < last):  # the first row of a new sequence
                    n_j, end_j, window = _enter_sequence(cu_seqlens, x_b, stride_xt, state, j, n_j, end_j, d, d_ok, D,
                                                         W, HAS_STATE)
            xj = x_group[k].to(tl.float32)
            g = dy_group[k].to(tl.float32)  # zero for rows j >= T
            if SILU:
                g = g * _silu_slope(_preactivation(bias_row, w, window, xj, W))
            if j < r1:
                new_dw = ()
                for i in tl.static_range(W - 1):
                    new_dw = new_dw + (acc_dw[i] + g * window[i],)
                acc_dw = new_dw + (acc_dw[W - 1] + g * xj,)
                acc_db += g
            q = j - (W - 1)
            if (q >= r0) & (q < r1):
                if VARLEN:
                    n_q, end_q = _advance(cu_seqlens, q, n_q, end_q)
                # dx_q = sum_i w_i da_{q + W - 1 - i}; history[k] = da_{q + k}, da_j = g
                grad = tl.where(j < end_q, w[0] * g, 0.0)
                for m in tl.static_range(W - 1):
                    grad += tl.where(q + m < end_q, w[W - 1 - m] * history[m], 0.0)
                if HAS_DFINAL:
                    k_final = q - (end_q - (W - 1))
                    grad += tl.load(dfinal + (n_q * (W - 1) + k_final) * D + d, mask=tl.where(k_final >= 0, d_ok, False), other=0.0)
                tl.store(dx_b + q * D + d, grad.to(dx.dtype.element_ty), mask=d_ok)
            history = _shift_in(history, g, W - 1)
            window = _shift_in(window, xj, W - 1)
        x_group = x_ahead
        dy_group = dy_ahead
    row = dparams + tl.program_id(0).to(tl.int64) * (W + 1) * D + d
    for i in tl.static_range(W):
        tl.store(row + i * D, acc_dw[i], mask=d_ok)
    tl.store(row + W * D, acc_db, mask=d_ok)


@triton.jit
def _conv_initial_state_grad_kernel(
    x, weight, bias, state, cu_seqlens, dy, dfinal, dstate,
    T, D, stride_xb, stride_xt, stride_dyb, stride_dyt,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DFINAL: tl.constexpr,
    VARLEN: tl.constexpr, SILU: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``dinitial_k = sum_{m <= k} weight[k - m] da_{s+m}`` over the first ``W - 1`` tokens of
    sequence ``n``, plus the final-state gradient of entries carried over from the initial
    state (sequences shorter than ``W - 1``)."""
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    b, start, end = _sequence_bounds(cu_seqlens, n, T, VARLEN)
    w = ()
    for i in tl.static_range(W):
        w = w + (tl.load(weight + d * W + i, mask=d_ok, other=0.0).to(tl.float32),)
    if SILU:
        # v_{s-W+1} .. v_{s+W-2}: the inputs of a_s .. a_{s+W-2}
        v = _history_rows(x + b * stride_xb, stride_xt, state, start - (W - 1), start, end, n, d, d_ok, D,
                          2 * W - 2, W, True)
    da = ()
    for m in tl.static_range(W - 1):
        g = _load_row(dy + b * stride_dyb, start + m, stride_dyt, d, tl.where(start + m < end, d_ok, False)).to(tl.float32)
        if SILU:
            a = tl.zeros([BLOCK_D], dtype=tl.float32)
            if HAS_BIAS:
                a += tl.load(bias + d, mask=d_ok, other=0.0).to(tl.float32)
            for i in tl.static_range(W):
                a += w[i] * v[m + i]
            g = g * _silu_slope(a)
        da = da + (g,)
    for k in tl.static_range(W - 1):
        grad = tl.zeros([BLOCK_D], dtype=tl.float32)
        for m in tl.static_range(k + 1):
            grad += w[k - m] * da[m]
        if HAS_DFINAL:
            k_final = k - (end - start)
            grad += tl.load(dfinal + (n * (W - 1) + k_final) * D + d, mask=tl.where(k_final >= 0, d_ok, False), other=0.0)
        tl.store(dstate + (n * D + d) * (W - 1) + k, grad.to(dstate.dtype.element_ty), mask=d_ok)


def _as_rows(state: torch.Tensor | None) -> torch.Tensor | None:
    """A state ``[N, D, W - 1]`` as ``[N, W - 1, D]``: the kernels read it like rows of x."""
    return None if state is None else state.transpose(1, 2).contiguous()


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _row_strides(t: torch.Tensor):
    return t.stride(0), t.stride(1)


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], output_final_state: bool, silu: bool):
    """The forward launches; returns ``((y, final state or None), ())``."""
    B, T, D = x.shape
    num_sequences = B if cu_seqlens is None else cu_seqlens.numel() - 1
    W = weight.shape[1]
    x = _unit_last_stride(x)
    weight = weight.contiguous()
    varlen = cu_seqlens is not None
    state_rows = _as_rows(initial_state)
    y = _utils.empty((B, T, D), x.dtype, x.device)
    ROWS, AHEAD, BLOCK_D, num_warps = _fwd_config(D)
    if B * T > 0 and D > 0:
        ranges = _utils.cdiv(T, ROWS)
        args = (x, weight, bias, state_rows, cu_seqlens, y,
                T, D, *_row_strides(x), num_sequences, search_steps(num_sequences), ranges)
        meta = dict(W=W, HAS_BIAS=bias is not None, HAS_STATE=initial_state is not None, VARLEN=varlen,
                    SILU=silu, ROWS=ROWS, BLOCK_D=BLOCK_D, CHANNELS_FASTEST=FWD_CHANNELS_FASTEST,
                    num_warps=num_warps)
        blocks = _utils.cdiv(D, BLOCK_D)
        grid = (B * ranges * blocks,) if FWD_CHANNELS_FASTEST else (B * ranges, blocks)
        _conv_fwd_kernel[grid](*args, AHEAD=AHEAD, **meta, **COMPILE_OPTIONS)
    final_state = None
    if output_final_state:
        final_state = _utils.empty((num_sequences, D, W - 1), torch.float32, x.device)
        if num_sequences > 0 and D > 0:
            BLOCK_DS = min(128, triton.next_power_of_2(D))
            _conv_final_state_kernel[(num_sequences, _utils.cdiv(D, BLOCK_DS))](
                x, state_rows, cu_seqlens, final_state,
                T, D, *_row_strides(x),
                W=W, HAS_STATE=initial_state is not None, VARLEN=varlen, BLOCK_D=BLOCK_DS, num_warps=4, **COMPILE_OPTIONS,
            )
    return (y, final_state), ()


def _backward(grads, saved, x, weight, bias, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state, silu,
              *, needs_grad):
    dy, dfinal = grads
    x = _unit_last_stride(x)
    weight = weight.contiguous()
    state_rows = _as_rows(initial_state)
    B, T, D = x.shape
    W = weight.shape[1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    varlen = cu_seqlens is not None
    dy = _unit_last_stride(dy)
    dfinal_rows = _as_rows(dfinal)
    dx = _utils.empty((B, T, D), x.dtype, x.device)
    ROWS, AHEAD, BLOCK_D, num_warps = _bwd_config(D, W)
    ranges = _utils.cdiv(T, ROWS)
    dparams = _utils.empty((max(1, B * ranges), (W + 1) * D), torch.float32, x.device)
    if B * T > 0 and D > 0:
        _conv_bwd_kernel[(B * ranges, _utils.cdiv(D, BLOCK_D))](
            x, weight, bias, state_rows, cu_seqlens, dy, dfinal_rows, dx, dparams,
            T, D, *_row_strides(x), *_row_strides(dy), N, search_steps(N), ranges,
            W=W, HAS_BIAS=bias is not None, HAS_STATE=state_rows is not None,
            HAS_DFINAL=dfinal_rows is not None, VARLEN=varlen, SILU=silu,
            ROWS=ROWS, AHEAD=AHEAD, BLOCK_D=BLOCK_D, num_warps=num_warps, **COMPILE_OPTIONS,
        )
    else:
        dparams.zero_()
    sums = _partials.column_sum(dparams, torch.float32)
    dweight = sums[: W * D].view(W, D).t().to(weight.dtype).contiguous()
    dbias = sums[W * D:].to(bias.dtype) if bias is not None else None
    dstate = None
    if state_rows is not None and needs_grad["initial_state"]:
        dstate = _utils.empty((N, D, W - 1), initial_state.dtype, x.device)
        if N > 0 and D > 0:
            BLOCK_DS = min(128, triton.next_power_of_2(D))
            _conv_initial_state_grad_kernel[(N, _utils.cdiv(D, BLOCK_DS))](
                x, weight, bias, state_rows, cu_seqlens, dy, dfinal_rows, dstate,
                T, D, *_row_strides(x), *_row_strides(dy),
                W=W, HAS_BIAS=bias is not None, HAS_DFINAL=dfinal_rows is not None, VARLEN=varlen,
                SILU=silu, BLOCK_D=BLOCK_DS, num_warps=4, **COMPILE_OPTIONS,
            )
    return dict(x=dx, weight=dweight, bias=dbias, initial_state=dstate)


CAUSAL_CONV1D = library.register("causal_conv1d", _forward, _backward)


# the forward's program order (_program_blocks): the channel blocks of a row block side by
# side. On the H100 (B=8 T=4096 D=4096 W=4 bf16, config_sweep.py) forward 0.234 ms against
# 0.243 with the row blocks side by side; a tile form (each tap's shifted [ROWS, BLOCK_D]
# tile one load), 0.241-0.430 in either order, was not faster and was dropped
# (H100, 2026-11-26)
FWD_CHANNELS_FASTEST = True


def _fwd_config(D: int):
    """(ROWS, AHEAD, BLOCK_D, num_warps): 2 channels a thread, 64 rows a program, taken 16
    at a time (the next 16 rows' loads in flight while 16 are computed: enough bytes in flight to
    cover DRAM latency). On the H100 at the bench size, 0.195 ms against 0.200 with 4 channels
    and 4 rows a group, 0.233 with a queue of 4 rows (benchmarks/results/README.md)."""
    num_warps = 4 if D >= 256 else 1
    return 64, 16, min(2 * 32 * num_warps, triton.next_power_of_2(D)), num_warps


def _bwd_config(D: int, W: int):
    """(ROWS, AHEAD, BLOCK_D, num_warps): longer ranges than the forward, since each
    program also writes a row of dweight/dbias partial sums."""
    num_warps = 4 if D >= 512 else 1
    return 128, 4, min(4 * 32 * num_warps, triton.next_power_of_2(D)), num_warps


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

    x ``[B, T, D]`` with ``D >= 1``; weight ``[D, W]`` with ``2 <= W <= 4``; bias ``[D]``;
    activation None or ``'silu'`` (alias ``'swish'``); initial_state float32 ``[N, D, W - 1]``
    (oldest input first); final_state float32 ``[N, D, W - 1]`` when ``output_final_state``.
    y has x's dtype, each gradient its input's dtype. See the module docstring for the math.
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
    V.check_range(op, "the channel dim D (x.shape[-1])", D, 1)
    V.check_range(op, "the kernel width W (weight.shape[1])", W, MIN_WIDTH, MAX_WIDTH)
    V.check_shape(op, "weight", weight, (D, W), "[D, W]")
    if bias is not None:
        V.check_shape(op, "bias", bias, (D,), "[D]")
    offsets = V.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    V.check_initial_state(op, initial_state, (N, D, W - 1), "[N, D, W - 1]")
    return CAUSAL_CONV1D(x, weight, bias, initial_state, cu_seqlens, cu_seqlens_cpu, bool(output_final_state),
                         activation is not None, offsets=offsets)
