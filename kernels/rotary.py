"""Rotary position embedding: ``RotaryEmbedding``, ``apply_rotary``, ``rotary_embedding``.

For ``x`` ``[B, T, H, D]`` and rotary width ``R`` (even, ``R <= D``), channel pair ``i``
(``i < R/2``) of the token at position ``pos`` turns by the angle ``theta_i(pos)``::

    (a, b) -> (a cos theta - b sin theta,  a sin theta + b cos theta)

The pair is ``(x_i, x_{i + R/2})`` (half split, GPT-NeoX) or, with ``interleaved``,
``(x_{2i}, x_{2i+1})`` (GPT-J). Channels ``[R, D)`` pass through unchanged.
``pos = t + offset[n]``: ``t`` counts from 0 in every sequence (every batch row, or every
``cu_seqlens`` sequence), and the offset is one int or one value per sequence ``[N]``.

Where the angles come from:

* ``apply_rotary(x, dim, base)`` and ``RotaryEmbedding``: ``theta_i = pos * base^(-2i/R)``,
  computed in the kernel: the product and its reduction modulo 2 pi in float64, then
  cos/sin in float32 of an angle in ``[-pi, pi]``. No table, so every position is valid
  and nothing needs sizing from ``max_seqlen`` or the offsets' values.
* ``rotary_embedding(x, cos, sin)``: ``cos[pos, i]`` and ``sin[pos, i]`` from tables
  ``[max_pos, R/2]`` (any float dtype, read as float32). Every position must lie in
  ``[0, max_pos)``; that is checked on the host before the launch (for an offsets tensor,
  from a host copy made once per tensor and version). The tables get no gradient.

The backward of a rotation is the rotation by ``-theta``: the same kernel with ``sin``
negated. ``apply_rotary`` and ``rotary_embedding`` are registered as
``torch.ops.fla.apply_rotary`` and ``torch.ops.fla.rotary_embedding`` (``kernels/_library.py``):
under ``torch.compile`` the graph holds one opaque node per tensor. The Python wrappers
validate first.

Kernel: one launch per tensor, grid ``(B * cdiv(T, BLOCK_T), cdiv(H, BLOCK_H))``: a
program owns ``BLOCK_T`` tokens times ``BLOCK_H`` heads (about 8K elements), computes
the angles once per token and applies them to every head. Under ``cu_seqlens`` each
token finds its sequence by bisection in the kernel (``_sequence.token_sequence``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from . import _library as library
from . import _utils
from ._arch import COMPILE_OPTIONS
from . import _validate as V
from ._sequence import search_steps, tile_origin, token_sequence

MAX_HEAD_DIM = 1024
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _rotary_kernel(
    x, cos, sin, base_hi, base_lo, offsets, cu_seqlens, y,
    T, H, stride_xb, stride_xt, stride_xh, offset, N, steps, max_pos, stride_table,
    D: tl.constexpr, HALF: tl.constexpr, TABLE: tl.constexpr, PER_SEQUENCE_OFFSET: tl.constexpr,
    VARLEN: tl.constexpr, INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
    b, t0 = tile_origin(tl.program_id(0), T, BLOCK_T)
    r = tl.arange(0, BLOCK_T)
    t = t0 + r
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = t < T
    n, start, _ = token_sequence(t, b, cu_seqlens, T, N, steps, VARLEN, BLOCK_T)
    if PER_SEQUENCE_OFFSET:
        pos = t - start + tl.load(offsets + n, mask=t_ok, other=0).to(tl.int64)
    else:
        pos = t - start + offset
    i = tl.arange(0, BLOCK_HALF)
    i_ok = i < HALF
    if TABLE:
        # positions were checked on the host; a stray one reads NaN rather than memory
        pos_ok = t_ok & (pos >= 0) & (pos < max_pos)
        table_offs = pos[:, None] * stride_table + i[None, :]
        table_mask = pos_ok[:, None] & i_ok[None, :]
        c = tl.load(cos + table_offs, mask=table_mask, other=float("nan")).to(tl.float32)
        s = tl.load(sin + table_offs, mask=table_mask, other=float("nan")).to(tl.float32)
    else:
        # base^(-2i/R) in float64, here rather than from a tensor made per call (three more
        # launches a call, twice the rotary's time in a forward+backward on the H100) or
        # cached (a CUDA-graph tree rejects a cached tensor made during its warm-up)
        log_base = tl.log(tl.zeros([1], tl.float64) + base_hi + base_lo)  # float32 scalars, exact in float64
        freq = tl.exp(i.to(tl.float64) * (-2.0 / (2 * HALF)) * log_base)
        angle = pos.to(tl.float64)[:, None] * freq[None, :]
        turns = tl.floor(angle * 0.15915494309189535 + 0.5)  # 1 / (2 pi)
        reduced = (angle - turns * 6.283185307179586).to(tl.float32)
        c = tl.cos(reduced)
        s = tl.sin(reduced)
    if INVERSE:
        s = -s
    c = c[:, None, :]
    s = s[:, None, :]

    src = (x + b.to(tl.int64) * stride_xb + t0.to(tl.int64) * stride_xt
           + (r * stride_xt)[:, None, None] + (h * stride_xh)[None, :, None])
    dst = y + (b.to(tl.int64) * T + t0) * H * D + (r * H * D)[:, None, None] + (h * D)[None, :, None]
    rows_ok = t_ok[:, None, None] & (h < H)[None, :, None]
    if INTERLEAVED:
        j = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
        mask = rows_ok & (j < 2 * HALF)
        pairs = tl.load(src + j, mask=mask, other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(pairs, [BLOCK_T, BLOCK_H, BLOCK_HALF, 2]))
        out = tl.reshape(tl.join(a * c - b * s, a * s + b * c), [BLOCK_T, BLOCK_H, 2 * BLOCK_HALF])
        tl.store(dst + j, out.to(y.dtype.element_ty), mask=mask)
    else:
        k = i[None, None, :]
        mask = rows_ok & (k < HALF)
        a = tl.load(src + k, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(src + HALF + k, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst + k, (a * c - b * s).to(y.dtype.element_ty), mask=mask)
        tl.store(dst + HALF + k, (a * s + b * c).to(y.dtype.element_ty), mask=mask)
    if BLOCK_PASS > 0:
        k = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, None, :]
        mask = rows_ok & (k < D)
        tl.store(dst + k, tl.load(src + k, mask=mask), mask=mask)


def _tile_config(H: int, width: int, elements: int = 8192):
    """(BLOCK_T, BLOCK_H, num_warps): all heads of a token if they fit, about ``elements``
    values a program; ``width`` is the padded head dim."""
    BLOCK_H = min(triton.next_power_of_2(H), max(1, elements // width))
    BLOCK_T = triton.next_power_of_2(max(1, elements // (BLOCK_H * width)) + 1) // 2  # a power of 2
    num_warps = 8 if BLOCK_T * BLOCK_H * width >= 8192 else 4
    return BLOCK_T, BLOCK_H, num_warps


def _base_parts(base: float) -> tuple[float, float]:
    """``base`` as two float32 values whose float64 sum is ``base`` to about 48 bits: a
    Python float reaches a kernel as float32, too coarse for ``log(base)`` (at position
    4096 a relative error of 6e-8 in the log turns the fastest pair by 2.5e-4)."""
    hi = float(np.float32(base))
    return hi, float(np.float32(base - hi))


def _launch(x, cos, sin, offsets, cu_seqlens, rotary_dim, base, offset, interleaved, inverse):
    B, T, H, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = _utils.empty((B, T, H, D), x.dtype, x.device)
    # shapes alone (a fake implementation): no launch, so no block sizes either; computed
    # from symbolic sizes they cost sympy minutes per call under dynamic-shape tracing
    if y.numel() == 0 or _utils.shapes_only():
        return y
    half = rotary_dim // 2
    table = cos is not None
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    BLOCK_HALF = triton.next_power_of_2(half)
    BLOCK_PASS = triton.next_power_of_2(D - rotary_dim) if D > rotary_dim else 0
    BLOCK_T, BLOCK_H, num_warps = _tile_config(H, 2 * BLOCK_HALF + BLOCK_PASS)
    _rotary_kernel[(B * _utils.cdiv(T, BLOCK_T), _utils.cdiv(H, BLOCK_H))](
        x, cos, sin, *_base_parts(base), offsets, cu_seqlens, y,
        T, H, x.stride(0), x.stride(1), x.stride(2), offset, N, search_steps(N),
        cos.shape[0] if table else 0, cos.stride(0) if table else 0,
        D=D, HALF=half, TABLE=table, PER_SEQUENCE_OFFSET=offsets is not None,
        VARLEN=cu_seqlens is not None, INTERLEAVED=interleaved, INVERSE=inverse,
        BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF, BLOCK_PASS=BLOCK_PASS,
        num_warps=num_warps, **COMPILE_OPTIONS,
    )
    return y


def _op_forward(x: torch.Tensor, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor],
                seqlen_offsets: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
                cu_seqlens_cpu: Optional[torch.Tensor], rotary_dim: int, base: float, offset: int, interleaved: bool):
    """Rotate ``x`` by the table (``cos``/``sin`` given) or by ``pos * base^(-2i/rotary_dim)``;
    positions offset per sequence (``seqlen_offsets``) or by ``offset``."""
    return (_launch(x, cos, sin, seqlen_offsets, cu_seqlens, rotary_dim, base, offset, interleaved, False),), ()


def _op_backward(grads, saved, x, cos, sin, seqlen_offsets, cu_seqlens, cu_seqlens_cpu, rotary_dim, base, offset,
                 interleaved):
    (dy,) = grads
    return dict(x=_launch(dy, cos, sin, seqlen_offsets, cu_seqlens, rotary_dim, base, offset, interleaved, True))


def _check_table_values(x, cos, sin, seqlen_offsets, cu_seqlens, cu_seqlens_cpu, rotary_dim, base, offset, interleaved,
                        *, offsets):
    """Under torch.compile, the position check the wrapper could not trace."""
    if cos is not None:
        _check_table_positions("rotary_embedding", x, cos, seqlen_offsets, offset, offsets)


APPLY_ROTARY = library.register("apply_rotary", _op_forward, _op_backward, outputs=1)
ROTARY_EMBEDDING = library.register("rotary_embedding", _op_forward, _op_backward, outputs=1,
                                    check_values=_check_table_values)


# ----------------------------------------------------------------------------- validation


def _check_rotary_dim(op: str, rotary_dim, D: int) -> None:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"{op}: the rotary dim must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > D:
        raise ValueError(
            f"{op}: rotary dim {rotary_dim} must be even and at most the head dim D = {D} "
            f"(x.shape[-1]); it is the rotary width per head, not the model width"
        )


def _validate(op, x, seqlen_offset, cu_seqlens, cu_seqlens_cpu, cos=None, sin=None, offset_name="seqlen_offset"):
    """Checks shared by the wrappers; returns ``(N, offsets tensor or None, int offset,
    host offsets or None)``."""
    V.check_tensor(op, "x", x)
    offsets = seqlen_offset if isinstance(seqlen_offset, torch.Tensor) else None
    if offsets is not None:
        V.check_tensor(op, offset_name, offsets, INDEX_DTYPES)
    elif isinstance(seqlen_offset, bool) or not isinstance(seqlen_offset, int):
        raise TypeError(f"{op}: `{offset_name}` must be an int or an int tensor [N], got {type(seqlen_offset).__name__}")
    device = V.check_devices(op, x=x, cos=cos, sin=sin, **{offset_name: offsets},
                             cu_seqlens=cu_seqlens if isinstance(cu_seqlens, torch.Tensor) else None)
    V.check_ndim(op, "x", x, 4, "[B, T, H, D]")
    B, T, H, D = x.shape
    V.check_heads(op, "x", H, "[B, T, H, D]")
    V.check_range(op, "the head dim D (x.shape[-1])", D, 2, MAX_HEAD_DIM)
    host = V.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if offsets is not None:
        V.check_shape(op, offset_name, offsets, (N,), "[N] (one offset per sequence)")
    return N, offsets, 0 if offsets is not None else int(seqlen_offset), host


def _check_table_positions(op, x, cos, offsets, offset, host_cu):
    """Every position ``t + offset[n]`` indexes the table: ``0 <= pos < max_pos``."""
    B, T = x.shape[:2]
    max_pos = cos.shape[0]
    if host_cu is not None:
        lengths = host_cu[1:] - host_cu[:-1]
    else:
        lengths = torch.full((B,), T, dtype=torch.int64)
    if offsets is None:
        lo, hi = offset, offset + (int(lengths.max()) if lengths.numel() else 0)
    else:
        if offsets.device.type == "meta":
            raise ValueError(f"{op}: a `seqlen_offsets` tensor on the meta device cannot be range-checked")
        values = V.host_copy(offsets)
        nonempty = lengths > 0
        lo = int(values[nonempty].min()) if nonempty.any() else 0
        hi = int((values + lengths)[nonempty].max()) if nonempty.any() else 0
    if lo < 0 or hi > max_pos:
        raise ValueError(
            f"{op}: positions reach [{lo}, {hi}) but the cos/sin tables hold positions [0, {max_pos}); "
            "make the tables longer or the offsets smaller"
        )


# ----------------------------------------------------------------------------- public API


def apply_rotary(
    x: torch.Tensor,
    dim: int,
    base: float = 10000.0,
    interleaved: bool = False,
    seqlen_offset: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate channels ``[0, dim)`` of ``x`` ``[B, T, H, D]`` by ``pos * base^(-2i/dim)``.

    ``seqlen_offset``: int, or an int32/int64 tensor ``[N]`` on x's device (one offset per
    batch row, or per ``cu_seqlens`` sequence). Returns a new contiguous tensor.
    """
    return _apply_rotary("apply_rotary", x, dim, base, interleaved, seqlen_offset, cu_seqlens, cu_seqlens_cpu)


def _apply_rotary(op, x, dim, base, interleaved, seqlen_offset, cu_seqlens, cu_seqlens_cpu):
    _, offsets, offset, _ = _validate(op, x, seqlen_offset, cu_seqlens, cu_seqlens_cpu)
    _check_rotary_dim(op, dim, x.shape[-1])
    if not isinstance(base, (int, float)) or not base > 0:
        raise ValueError(f"{op}: `base` must be a number > 0, got {base!r}")
    return APPLY_ROTARY(x, None, None, offsets, cu_seqlens, cu_seqlens_cpu, dim, float(base), offset,
                        bool(interleaved))[0]


def rotary_embedding(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    seqlen_offsets: int | torch.Tensor = 0,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, H, D]`` by angles read from tables ``cos``, ``sin`` ``[max_pos, R/2]``.

    Channel pair ``i`` of the token at position ``pos = t + seqlen_offsets[n]`` becomes
    ``(a cos[pos, i] - b sin[pos, i], a sin[pos, i] + b cos[pos, i])``; the rotary width is
    ``R = 2 * cos.shape[1]`` and channels ``[R, D)`` pass through. Every position must lie
    in ``[0, max_pos)`` (checked). ``max_seqlen`` is accepted for API compatibility and
    not needed. The tables get no gradient: pass tensors that do not require one.
    """
    op = "rotary_embedding"
    for name, t in (("cos", cos), ("sin", sin)):
        V.check_tensor(op, name, t)
    N, offsets, offset, host_cu = _validate(op, x, seqlen_offsets, cu_seqlens, cu_seqlens_cpu, cos, sin,
                                            offset_name="seqlen_offsets")
    V.check_ndim(op, "cos", cos, 2, "[max_pos, R/2]")
    V.check_shape(op, "sin", sin, cos.shape, "the shape of cos")
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    _check_rotary_dim(op, 2 * cos.shape[1], x.shape[-1])
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError(f"{op}: `cos` and `sin` get no gradient here; pass them detached")
    if not torch.compiler.is_compiling():  # values: checked by the op itself under torch.compile
        _check_table_positions(op, x, cos, offsets, offset, host_cu)
    return ROTARY_EMBEDDING(x, cos, sin, offsets, cu_seqlens, cu_seqlens_cpu, 2 * cos.shape[1], 0.0, offset,
                            bool(interleaved), offsets=host_cu)[0]


class RotaryEmbedding(torch.nn.Module):
    """Rotary embedding of query and key heads; ``dim`` is the rotary width *per head*.

    ``forward(q, k, seqlen_offset=0, cu_seqlens=None, max_seqlen=None, cu_seqlens_cpu=None)``
    rotates channels ``[0, dim)`` of q ``[B, T, H, D]`` and k ``[B, T, HK, D]`` (k may have
    fewer heads) by ``pos * base^(-2i/dim)`` and returns new ``(q, k)``. The angles are
    computed in the kernel, so there is no table to size: ``max_seqlen`` is accepted for
    API compatibility and ignored, and any offset is valid.
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        self.dim = dim
        self.base = base
        self.interleaved = interleaved

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"

    def forward(self, q, k, seqlen_offset=0, cu_seqlens=None, max_seqlen=None, cu_seqlens_cpu=None):
        op = "RotaryEmbedding"
        for name, t in (("q", q), ("k", k)):
            V.check_tensor(op, name, t)
            V.check_ndim(op, name, t, 4, "[B, T, H, D]")
        if k.shape[0] != q.shape[0] or k.shape[1] != q.shape[1] or k.shape[3] != q.shape[3]:
            raise ValueError(
                f"{op}: `k` must have shape [B, T, HK, D] = [{q.shape[0]}, {q.shape[1]}, HK, {q.shape[3]}] "
                f"like q, got {list(k.shape)}"
            )
        V.check_devices(op, q=q, k=k)
        args = (self.dim, self.base, self.interleaved, seqlen_offset, cu_seqlens, cu_seqlens_cpu)
        return _apply_rotary(op, q, *args), _apply_rotary(op, k, *args)
