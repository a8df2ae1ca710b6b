"""``token_cumsum``: the running sum of ``x [B, T, D]`` over tokens, per sequence.

``y_t = h_0 + x_0 + ... + x_t``, with ``h_0`` the sequence's ``initial_state`` row (or
zero); packed sequences (``cu_seqlens``, B = 1) restart at their own ``h_0``. The
backward is the same scan run backwards over the upstream gradient. One Triton kernel
does both: a program per (sequence, block of channels), on grid axis 0 only, with
64-bit offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .alloc import empty

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_D = 65536


@triton.jit
def _scan_kernel(inp, out, start_state, end_state, cu_seqlens, T, D,
                 HAS_START: tl.constexpr, HAS_END: tl.constexpr, VARLEN: tl.constexpr,
                 REVERSE: tl.constexpr, BLOCK_D: tl.constexpr):
    """``acc = start; for each token (backwards if REVERSE): acc += inp_t; out_t = acc``;
    then ``end = acc``. One program per (sequence n, channel block)."""
    pid = tl.program_id(0).to(tl.int64)
    blocks = tl.cdiv(D, BLOCK_D)
    n, block = pid // blocks, pid % blocks
    cols = block * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < D
    if VARLEN:  # sequence n is tokens [bos, eos) of the one packed batch row
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.load(cu_seqlens + n + 1).to(tl.int64)
        base = n * 0
    else:  # sequence n is batch row n
        bos = n * 0
        eos = bos + T
        base = n * T
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_START:
        acc += tl.load(start_state + n * D + cols, mask=mask, other=0.0).to(tl.float32)
    for i in range(0, eos - bos):
        if REVERSE:
            t = eos - 1 - i
        else:
            t = bos + i
        offset = (base + t) * D + cols
        acc += tl.load(inp + offset, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + offset, acc.to(out.dtype.element_ty), mask=mask)
    if HAS_END:
        tl.store(end_state + n * D + cols, acc, mask=mask)


def _scan(inp, start, cu_seqlens, N, reverse, want_end):
    B, T, D = inp.shape
    out = empty(inp.shape, inp.dtype, inp.device)
    end = empty((N, D), torch.float32, inp.device) if want_end else None
    block = min(triton.next_power_of_2(D), 1024)
    grid = (N * triton.cdiv(D, block),)
    _scan_kernel[grid](inp, out, start, end, cu_seqlens, T, D,
                       HAS_START=start is not None, HAS_END=want_end, VARLEN=cu_seqlens is not None,
                       REVERSE=reverse, BLOCK_D=block)
    return out, end


class _TokenCumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, initial_state, cu_seqlens, N, output_final_state):
        y, final = _scan(x.contiguous(), initial_state, cu_seqlens, N, reverse=False, want_end=output_final_state)
        ctx.save_for_backward(cu_seqlens)
        ctx.N, ctx.has_state = N, initial_state is not None
        return y, final

    @staticmethod
    def backward(ctx, dy, dfinal):
        (cu_seqlens,) = ctx.saved_tensors
        start = None if dfinal is None else dfinal.float().contiguous()
        dx, dh0 = _scan(dy.contiguous(), start, cu_seqlens, ctx.N, reverse=True, want_end=ctx.has_state)
        return dx, dh0, None, None, None


_validated: dict = {}  # id(cu_seqlens) -> (tensor, version): offsets checked once, then trusted


def _check_cu_seqlens(x, cu_seqlens, cu_seqlens_cpu) -> int:
    """The number of sequences; every rule on the offsets, with one device-to-host copy
    per offsets tensor (none with ``cu_seqlens_cpu``)."""
    op = "token_cumsum"
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: `cu_seqlens` must have dtype int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{op}: `cu_seqlens` must be 1-D [N + 1], got shape {list(cu_seqlens.shape)}")
    if cu_seqlens.device != x.device:
        raise ValueError(f"{op}: `cu_seqlens` is on {cu_seqlens.device} but `x` is on {x.device}")
    if x.shape[0] != 1:
        raise ValueError(f"{op}: with `cu_seqlens` the batch size must be 1, got {x.shape[0]}")
    seen = _validated.get(id(cu_seqlens))
    if cu_seqlens_cpu is None and seen is not None and seen[0] is cu_seqlens and seen[1] == cu_seqlens._version:
        return cu_seqlens.numel() - 1
    host = (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens.cpu()).tolist()
    if host[0] != 0:
        raise ValueError(f"{op}: `cu_seqlens` must start at 0, got {host[0]}")
    if any(b < a for a, b in zip(host[:-1], host[1:])):
        raise ValueError(f"{op}: `cu_seqlens` must be non-decreasing, got {host}")
    if host[-1] != x.shape[1]:
        raise ValueError(f"{op}: `cu_seqlens` must end at T = {x.shape[1]}, got {host[-1]}")
    if cu_seqlens_cpu is None:
        _validated.clear()
        _validated[id(cu_seqlens)] = (cu_seqlens, cu_seqlens._version)
    return len(host) - 1


def token_cumsum(x, initial_state=None, output_final_state=False, cu_seqlens=None, cu_seqlens_cpu=None):
    """``(y, final_state)``: the running sum of ``x [B, T, D]`` over tokens.

    ``initial_state [N, D]`` float32 starts each sequence (N = B, or the number of packed
    sequences); ``final_state`` (float32, only if asked for) is each sequence's last sum.
    Every bad argument raises a ``TypeError`` / ``ValueError`` naming it, before any launch.
    """
    op = "token_cumsum"
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: `x` must be a float32, bfloat16 or float16 tensor, got dtype {getattr(x, 'dtype', None)}")
    if x.dim() != 3:
        raise ValueError(f"{op}: `x` must be [B, T, D], got shape {list(x.shape)}")
    if not 1 <= x.shape[-1] <= MAX_D:
        raise ValueError(f"{op}: D = {x.shape[-1]} is outside the supported range [1, {MAX_D}]")
    N = x.shape[0] if cu_seqlens is None else _check_cu_seqlens(x, cu_seqlens, cu_seqlens_cpu)
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or initial_state.dtype != torch.float32:
            raise TypeError(f"{op}: `initial_state` must be a float32 tensor, got dtype {getattr(initial_state, 'dtype', None)}")
        if initial_state.device != x.device:
            raise ValueError(f"{op}: `initial_state` is on {initial_state.device} but `x` is on {x.device}")
        if tuple(initial_state.shape) != (N, x.shape[-1]):
            raise ValueError(f"{op}: `initial_state` must have shape [N, D] = [{N}, {x.shape[-1]}], "
                             f"got {list(initial_state.shape)}")
        initial_state = initial_state.contiguous()
    return _TokenCumsum.apply(x, initial_state, cu_seqlens, N, output_final_state)
