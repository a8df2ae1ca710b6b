"""Normalisations over the last dimension: ``l2norm``, ``rms_norm``, ``rms_norm_gated``.

All three are one computation on each row ``x`` of length ``D``::

    r    = 1 / sqrt(S / c + eps),   S = sum_j x_j^2,   c = 1 (l2norm) or D (rms)
    xh   = x * r
    z    = xh * weight + bias          (weight, bias optional, shape [D])
    y    = z * act(g)                  (gated form only; act = swish or sigmoid)

Backward, with ``dz = dy * act(g)`` (or ``dy``) and ``dxh = dz * weight`` (or ``dz``)::

    dg      = dy * z * act'(g)
    dweight = sum over rows of dz * xh,    dbias = sum over rows of dz
    dx      = r * (dxh - xh * (sum_j dxh_j xh_j) / c)

where the last line follows from ``d r / d x_k = -r^3 x_k / c``:
``dx_k = r dxh_k - r^3 x_k / c * sum_j dxh_j x_j``. The backward recomputes ``r`` from
``x`` instead of saving it (one read of ``x`` either way, no extra buffer).

Kernels: one forward and one backward row kernel. Rows (every leading index, flattened)
go on grid axis 0 in blocks of ``BLOCK_R`` rows when rows are short, so that a block holds
about a thousand values (forward; the gated form 512 on fewer warps) or one to eight
thousand, 32 a thread (backward: ``_backward_tile``); each row is held whole in registers
(``D <= MAX_DIM``). The forward's programs loop over row blocks (one each at the default
``FWD_PROGRAMS_PER_SM``).
The backward runs a fixed number of programs that loop over row blocks and keep their
share of ``dweight`` / ``dbias`` in registers, written once to a ``[P, D]`` buffer and
summed by ``_partials.column_sum`` (deterministic, no atomics). Accumulation is float32.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import _library as library
from . import _partials, _utils
from ._arch import COMPILE_OPTIONS
from ._chunk import _INTERPRETING
from . import _validate as V

# Longest row held in registers by one program (16 warps, 32 float32 values a thread
# per operand).
MAX_DIM = 16384

GATE_NONE, GATE_SWISH, GATE_SIGMOID = 0, 1, 2
_GATES = {"swish": GATE_SWISH, "silu": GATE_SWISH, "sigmoid": GATE_SIGMOID}


@triton.jit
def _sigmoid(g):
    """``1 / (1 + 2^(-g log2(e)))`` through the flush-to-zero approximate exp2 and divide
    (``ex2.approx.ftz``, ``div.approx.ftz``): tl.sigmoid's forms that keep denormals cost
    seven more instructions an element (offline SASS, sm90), in kernels that issue an
    instruction on three cycles of four. Only results below 2^-126 differ (flushed to 0),
    and a divisor past 2^126 (g < -87) gives 0, as the sigmoid's value there rounds to. The
    interpreter has no libdevice."""
    if _INTERPRETING:
        return tl.sigmoid(g)
    return libdevice.fast_dividef(1.0, _one_plus_exp_neg(g))


@triton.jit
def _one_plus_exp_neg(g):
    """``1 + e^(-g)`` as ``1 + 2^(-g log2(e))``, the flush-to-zero approximate exp2."""
    return 1.0 + libdevice.exp2(-1.4426950408889634 * g)


@triton.jit
def _gate(g, GATE: tl.constexpr):
    """act(g) alone, for the forward: swish as ``g / (1 + 2^(-g log2(e)))``, one approximate
    divide where ``g * sigmoid(g)`` took a reciprocal, its flush and a multiply (one
    instruction an element fewer, offline SASS, sm90). g < -87 gives -0 (the divisor is
    past 2^126), as swish's value there rounds to."""
    if GATE == 1:
        if _INTERPRETING:
            return g * tl.sigmoid(g)
        return libdevice.fast_dividef(g, _one_plus_exp_neg(g))
    else:
        return _sigmoid(g)


@triton.jit
def _gate_and_slope(g, GATE: tl.constexpr):
    """act(g) and act'(g): swish g*s(g) -> s (1 + g (1 - s)); sigmoid s -> s (1 - s)."""
    s = _sigmoid(g)
    if GATE == 1:
        return g * s, s * (1.0 + g * (1.0 - s))
    else:
        return s, s * (1.0 - s)


@triton.jit
def _row_tile(base, rows, stride, D, row_start, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    """Pointers and mask of the ``[BLOCK_R, BLOCK_D]`` tile starting at row ``row_start``."""
    r = row_start + tl.arange(0, BLOCK_R).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    ptrs = base + r[:, None] * stride + c[None, :]
    if EVEN_D:
        mask = (r < rows)[:, None]
    else:
        mask = (r < rows)[:, None] & (c < D)[None, :]
    return ptrs, mask


@triton.jit
def _param_tile(p, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    c = tl.arange(0, BLOCK_D)[None, :] + tl.zeros([BLOCK_R, 1], dtype=tl.int32)
    return tl.load(p + c, mask=c < D, other=0.0).to(tl.float32)


@triton.jit
def _norm_fwd_kernel(
    x, g, weight, bias, y,
    rows, D, stride_x, stride_g, inv_D, eps,
    MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, GATE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
):
    """Program ``p`` handles row blocks p, p + P, ... (one each when P covers them all).
    ``inv_D``: 1 / D in float32, from the host (a divide in every program was eight
    instructions, offline SASS, sm90)."""
    # the parameters as whole [BLOCK_R, BLOCK_D] tiles, every row a copy: loaded in the row
    # tiles' own layout (cached reads), where a [BLOCK_D] vector broadcast over the rows went
    # through shared memory and a barrier in every program
    if HAS_WEIGHT:
        w = _param_tile(weight, D, BLOCK_R, BLOCK_D)
    if HAS_BIAS:
        b = _param_tile(bias, D, BLOCK_R, BLOCK_D)
    for block in range(tl.program_id(0), tl.cdiv(rows, BLOCK_R), tl.num_programs(0)):
        row_start = block * BLOCK_R  # rows < 2**31; _row_tile widens to int64
        x_ptrs, mask = _row_tile(x, rows, stride_x, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
        xv = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        if GATE != 0:
            # g's loads issued with x's, before the row sums: written after them, ptxas left
            # one of the six 16-byte loads behind the shuffles (offline SASS, sm90), and the
            # kernel took 0.189 ms against 0.184 (H200, 1048576 rows of 128, bf16, 2026-11-29,
            # benchmarks/results/sweeps/norm_forward_h200.json)
            g_ptrs, _ = _row_tile(g, rows, stride_g, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
            act = _gate(tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32), GATE)
        ss = tl.sum(xv * xv, axis=1)
        if MEAN:
            ss = ss * inv_D
        z = xv * tl.math.rsqrt(ss + eps)[:, None]
        if HAS_WEIGHT:
            z = z * w
        if HAS_BIAS:
            z = z + b
        if GATE != 0:
            z = z * act
        y_ptrs, _ = _row_tile(y, rows, D, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
        tl.store(y_ptrs, z.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    x, g, weight, bias, dy, dx, dg, dparams,
    rows, D, stride_x, stride_g, stride_dy, eps,
    MEAN: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, GATE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
):
    """Program ``p`` handles row blocks p, p + P, p + 2P, ...; ``dparams`` is float32
    ``[P, n, D]`` holding its share of dweight (slot 0) and dbias (last slot)."""
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    c = tl.arange(0, BLOCK_D)
    if HAS_WEIGHT:
        w = tl.load(weight + c, mask=c < D, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        b = tl.load(bias + c, mask=c < D, other=0.0).to(tl.float32)[None, :]
    acc_dw = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    acc_db = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for block in range(pid, tl.cdiv(rows, BLOCK_R), num_programs):
        row_start = block * BLOCK_R  # rows < 2**31; _row_tile widens to int64
        x_ptrs, mask = _row_tile(x, rows, stride_x, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
        dy_ptrs, _ = _row_tile(dy, rows, stride_dy, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
        xv = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
        dz = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
        ss = tl.sum(xv * xv, axis=1)
        if MEAN:
            ss = ss / D
        rstd = tl.math.rsqrt(ss + eps)[:, None]
        xh = xv * rstd
        if GATE != 0:
            g_ptrs, _ = _row_tile(g, rows, stride_g, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
            act, slope = _gate_and_slope(tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32), GATE)
            z = xh
            if HAS_WEIGHT:
                z = z * w
            if HAS_BIAS:
                z = z + b
            dg_ptrs, _ = _row_tile(dg, rows, D, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
            tl.store(dg_ptrs, (dz * z * slope).to(dg.dtype.element_ty), mask=mask)
            dz = dz * act
        dxh = dz
        if HAS_WEIGHT:
            acc_dw += dz * xh
            dxh = dz * w
        if HAS_BIAS:
            acc_db += dz
        dot = tl.sum(dxh * xh, axis=1)
        if MEAN:
            dot = dot / D
        dx_ptrs, _ = _row_tile(dx, rows, D, D, row_start, BLOCK_R, BLOCK_D, EVEN_D)
        tl.store(dx_ptrs, (rstd * (dxh - xh * dot[:, None])).to(dx.dtype.element_ty), mask=mask)
    if HAS_WEIGHT or HAS_BIAS:
        row = dparams + pid.to(tl.int64) * (HAS_WEIGHT + HAS_BIAS) * D + c
        if HAS_WEIGHT:
            tl.store(row, tl.sum(acc_dw, axis=0), mask=c < D)
        if HAS_BIAS:
            tl.store(row + HAS_WEIGHT * D, tl.sum(acc_db, axis=0), mask=c < D)


# The backward's row tile with a parameter gradient to sum (whole rows; config_sweep.py
# times others): about BWD_TILE_ELEMENTS values (the gated form: BWD_TILE_ELEMENTS_GATED by
# row width) on the warps that give each thread
# BWD_VALUES_PER_THREAD of them, the programs looping over row blocks. On the H200 (bf16,
# 1048576 rows of 128 or 262144 of 512, forward+backward as CUDA-graph replays, 7 rounds,
# 2026-11-29, benchmarks/results/sweeps/norm_backward_h200.json), against 8192 values on 16
# warps (8 a thread), the tile before: rms_norm 0.338 ms against 0.410 (1024 values on 1
# warp 0.361, 16384 on 16 warps 0.383, twice the programs 0.432); rms_norm_gated 0.526 at
# 4096 on 4 warps against 0.569 (2048 on 2 warps 0.530, 8192 on 8 warps 0.644: the gate's
# operands on top spill); at rows of 512, 1024 on 1 warp 0.572 against 0.674 (4096 on 4
# warps 0.617). On the H100 (rms_norm_gated, 262144 rows of 128) 8192 values had taken the
# kernel from 0.47 ms at 2048 (4 warps) to 0.32. The row loop software-pipelined (tl.range
# num_stages=2: the next blocks' loads issued ahead) was slower on the H200 (rms_norm_gated's
# kernel 0.416 ms against 0.371, rms_norm 0.284 against 0.274; 2026-11-29, with the tile before)
BWD_TILE_ELEMENTS = 8192
# The gated form's tile by padded row width, each width timed on its own (the same sweep at
# rows of 256 and 1024, 2026-11-29, sweeps/norm_backward_h200.json): at 256,
# 2048 values on 2 warps 0.528 ms against 0.584 on 1024 values (1 warp); at 1024, 2048 on 2
# warps 0.573 against 0.603. Rows up to 128 take 4096, wider than 512 2048 (at 2048 and wider
# one row a tile either way).
BWD_TILE_ELEMENTS_GATED = {128: 4096, 256: 2048, 512: 1024}
BWD_TILE_ELEMENTS_GATED_WIDEST = 2048
BWD_VALUES_PER_THREAD = 32
# The same with no parameter gradient to sum (l2norm, norms without weight or bias): one
# row block a program. On the H100 (l2norm, bf16, 262144 rows of 128, forward+backward,
# fastest of 7 rounds, 2026-11-27): 2048 0.4469 ms, 4096 0.4472, 1024 0.4479, 8192 0.4494,
# 16384 0.4496 (the medians were host-bound; benchmarks/results/, that day's l2norm sweep)
BWD_TILE_ELEMENTS_NO_PARAMS = 2048
# Values per row tile of the forward (config_sweep.py times others), looping over row
# blocks. On the H100 (bf16, 262144 rows of 128, 7 rounds, 2026-11-27): as one block a
# program without the loop, 1024-16384 within 0.3% of each other (4096 the fastest);
# in the loop form 1024 (4 warps) took rms_norm_gated 0.267 ms where 4096 (16 warps)
# took 0.293 and the loop-free 2048 0.269; l2norm 0.182 against 0.183
# (benchmarks/results/, the sweeps of 2026-11-27). Cache hints for data read once
# (evict-first loads, streaming stores) were slower: 0.303 and 0.188 ms
FWD_TILE_ELEMENTS = 1024
# The gated form's forward (three streams, a sigmoid an element): 512 values a program on
# one warp a row tile of 128, 16 values a thread. On the H200 (bf16, 1048576 rows of 128,
# 7-9 rounds, two runs, 2026-11-29): 0.195 ms where 1024 on 4 warps took 0.213 (the
# peer's 0.193); 512 on 2 warps 0.212, 1024 on 1 warp 0.252, 256 on 1 warp 0.321; looping
# programs, 8 an SM, each loading its next row block before normalising this one, 0.202.
# At D = 512 (GatedDeltaNet's default value head, one row a tile) 0.189 ms against 0.226 for
# 1024 values on 4 warps (2 warps 0.212). The ungated forms lose with it (rms_norm 0.164
# against 0.131 ms). Not yet timed on an H100 (benchmarks/results/sweeps/norm_forward_h200.json)
FWD_TILE_ELEMENTS_GATED = 512
FWD_VALUES_PER_THREAD_GATED = 16
# Forward programs a multiprocessor, each looping over row blocks; 0: one row block a
# program. 4 and 8 a multiprocessor were slower in the same sweep (rms_norm_gated 0.322,
# 0.289 ms; l2norm 0.193, 0.192)
FWD_PROGRAMS_PER_SM = 0


def _tile_config(D: int, elements: int, values_per_thread: int | None = None):
    """(BLOCK_R, BLOCK_D, num_warps): whole rows, about ``elements`` values a program; 4 to 16
    warps (8 values a thread at 1024), or ``values_per_thread`` on 1 to 16 warps."""
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_R = max(1, elements // BLOCK_D)
    if values_per_thread:
        num_warps = min(16, max(1, BLOCK_R * BLOCK_D // (32 * values_per_thread)))
    else:
        num_warps = min(16, max(4, BLOCK_R * BLOCK_D // 256))
    return BLOCK_R, BLOCK_D, num_warps


def _forward_tile(D: int, gated: bool = False):
    if gated:
        return _tile_config(D, FWD_TILE_ELEMENTS_GATED, FWD_VALUES_PER_THREAD_GATED)
    return _tile_config(D, FWD_TILE_ELEMENTS)


def _backward_tile(D: int, param_grads: bool, gated: bool = False):
    if not param_grads:
        return _tile_config(D, BWD_TILE_ELEMENTS_NO_PARAMS)
    if gated:
        elements = BWD_TILE_ELEMENTS_GATED.get(max(128, triton.next_power_of_2(D)), BWD_TILE_ELEMENTS_GATED_WIDEST)
    else:
        elements = BWD_TILE_ELEMENTS
    return _tile_config(D, elements, BWD_VALUES_PER_THREAD)


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, D]`` with unit column stride, copying only when no such view exists."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 or t2.shape[-1] == 1 else t2.contiguous()


def _row_stride(t2: torch.Tensor) -> int:
    return t2.stride(0) if t2.shape[0] > 1 else t2.shape[1]


def _forward(x, g, weight, bias, eps, mean, gate):
    D = x.shape[-1]
    x2 = _rows_view(x)
    g2 = _rows_view(g) if g is not None else None
    rows = x2.shape[0]
    y = _utils.empty((rows, D), x.dtype, x.device)
    if rows > 0:
        BLOCK_R, BLOCK_D, num_warps = _forward_tile(D, gate != GATE_NONE)
        programs = _utils.cdiv(rows, BLOCK_R)
        if FWD_PROGRAMS_PER_SM:
            programs = min(programs, FWD_PROGRAMS_PER_SM * _partials.multiprocessor_count(x.device))
        _norm_fwd_kernel[(programs,)](
            x2, g2, weight, bias, y,
            rows, D, _row_stride(x2), _row_stride(g2) if g2 is not None else 0, 1.0 / D, eps,
            MEAN=mean, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, GATE=gate,
            BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, EVEN_D=BLOCK_D == D, num_warps=num_warps, **COMPILE_OPTIONS,
        )
    return y.view(x.shape)


def _backward(x, g, weight, bias, dy, eps, mean, gate):
    D = x.shape[-1]
    x2, dy2 = _rows_view(x), _rows_view(dy)
    g2 = _rows_view(g) if g is not None else None
    rows = x2.shape[0]
    dx = _utils.empty((rows, D), x.dtype, x.device)
    dg = _utils.empty((rows, D), g.dtype, g.device) if g is not None else None
    slots = (weight is not None) + (bias is not None)
    BLOCK_R, BLOCK_D, num_warps = _backward_tile(D, slots > 0, gate != GATE_NONE)
    blocks = _utils.cdiv(rows, BLOCK_R)
    # one row block a program when there is no parameter gradient to sum
    programs = _partials.partial_programs(x.device, blocks, num_warps) if slots else max(1, blocks)
    dparams = _utils.empty((programs, slots * D), torch.float32, x.device) if slots else None
    if rows > 0:
        _norm_bwd_kernel[(programs,)](
            x2, g2, weight, bias, dy2, dx, dg, dparams,
            rows, D, _row_stride(x2), _row_stride(g2) if g2 is not None else 0, _row_stride(dy2), eps,
            MEAN=mean, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, GATE=gate,
            BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, EVEN_D=BLOCK_D == D, num_warps=num_warps, **COMPILE_OPTIONS,
        )
    elif slots:
        dparams.zero_()
    dweight = dbias = None
    if slots == 1:  # summed straight into the parameter's dtype: no cast launched after it
        summed = _partials.column_sum(dparams, (weight if weight is not None else bias).dtype)
        dweight, dbias = (summed, None) if weight is not None else (None, summed)
    elif slots:
        sums = _partials.column_sum(dparams, torch.float32)
        dweight, dbias = sums[:D].to(weight.dtype), sums[D:].to(bias.dtype)
    return dx.view(x.shape), (dg.view(g.shape) if dg is not None else None), dweight, dbias


def _op_forward(x: torch.Tensor, g: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float, gate: int, *, mean):
    return (_forward(x, g, weight, bias, eps, mean, gate),), ()


def _op_backward(grads, saved, x, g, weight, bias, eps, gate, *, mean):
    dx, dg, dweight, dbias = _backward(x, g, weight, bias, grads[0], eps, mean, gate)
    return dict(x=dx, g=dg, weight=dweight, bias=dbias)


L2NORM = library.register("l2norm", _op_forward, _op_backward, outputs=1, mean=False)
RMS_NORM = library.register("rms_norm", _op_forward, _op_backward, outputs=1, mean=True)
RMS_NORM_GATED = library.register("rms_norm_gated", _op_forward, _op_backward, outputs=1, mean=True)


def _validate(op, x, g, weight, bias, eps):
    V.check_tensor(op, "x", x)
    if g is not None:
        V.check_tensor(op, "g", g)
        V.check_same_dtype(op, x=x, g=g)
    if weight is not None:
        V.check_tensor(op, "weight", weight)
    if bias is not None:
        V.check_tensor(op, "bias", bias)
    V.check_devices(op, x=x, g=g, weight=weight, bias=bias)
    if x.dim() < 1:
        raise ValueError(f"{op}: `x` must have at least 1 dimension [..., D], got a 0-d tensor")
    D = x.shape[-1]
    if g is not None:
        V.check_shape(op, "g", g, x.shape, "the shape of x")
    if weight is not None:
        V.check_shape(op, "weight", weight, (D,), "[D]")
    if bias is not None:
        V.check_shape(op, "bias", bias, (D,), "[D]")
    V.check_range(op, "the normalised dim D (x.shape[-1])", D, 1, MAX_DIM)
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"{op}: `eps` must be a number >= 0, got {eps!r}")


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``y = x / sqrt(sum(x^2) + eps)`` over the last dim. Any leading shape, ``D <= 16384``."""
    _validate("l2norm", x, None, None, None, eps)
    return L2NORM(x, None, None, None, float(eps), GATE_NONE)[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
             eps: float = 1e-6) -> torch.Tensor:
    """``y = x / sqrt(mean(x^2) + eps) * weight + bias`` over the last dim (weight, bias ``[D]``)."""
    _validate("rms_norm", x, None, weight, bias, eps)
    return RMS_NORM(x, None, weight, bias, float(eps), GATE_NONE)[0]


def rms_norm_gated(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor | None = None,
                   eps: float = 1e-6, activation: str = "swish") -> torch.Tensor:
    """``y = x / sqrt(mean(x^2) + eps) * weight * act(g)``; ``activation`` is ``'swish'``
    (alias ``'silu'``: ``g * sigmoid(g)``) or ``'sigmoid'``. ``g`` has the shape and dtype of ``x``."""
    op = "rms_norm_gated"
    if activation not in _GATES:
        raise ValueError(f"{op}: `activation` must be 'swish', 'silu' or 'sigmoid', got {activation!r}")
    if g is None:
        raise TypeError(f"{op}: `g` must be a torch.Tensor with the shape of x, got None")
    _validate(op, x, g, weight, None, eps)
    return RMS_NORM_GATED(x, g, weight, None, float(eps), _GATES[activation])[0]
