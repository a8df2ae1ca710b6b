"""Argument checks of softmax attention: every bad input a clear error before any launch
(docs/ops.md, "Invalid input")."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .. import _validate as val

# Head dims the kernels take: a [BM, D] query tile and [BN, D] key tiles per program.
MIN_HEAD_DIM = 1
MAX_HEAD_DIM = 256


@dataclass
class AttentionInputs:
    B: int
    T: int
    H: int
    HKV: int
    D: int
    DV: int
    scale: float
    offsets_host: torch.Tensor | None  # validated host copy of cu_seqlens


def check_attention_inputs(op, q, k, v, scale, causal, window_size, cu_seqlens, cu_seqlens_cpu) -> AttentionInputs:
    for name, t in (("q", q), ("k", k), ("v", v)):
        val.check_tensor(op, name, t)
    val.check_same_dtype(op, q=q, k=k, v=v)
    val.check_scale(op, scale)
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: `causal` must be a bool, got {type(causal).__name__}")
    if window_size is not None:
        if not isinstance(window_size, numbers.Integral) or isinstance(window_size, bool):
            raise TypeError(f"{op}: `window_size` must be an int or None, got {type(window_size).__name__}")
        if window_size < 1:
            raise ValueError(f"{op}: `window_size` must be at least 1 (every query sees itself), got {window_size}")
    device = val.check_devices(op, q=q, k=k, v=v, cu_seqlens=cu_seqlens)

    val.check_ndim(op, "q", q, 4, "[B, T, H, D]")
    B, T, H, D = q.shape
    val.check_heads(op, "q", H, "[B, T, H, D]")
    val.check_ndim(op, "k", k, 4, "[B, T, HKV, D]")
    HKV = k.shape[2]
    val.check_shape(op, "k", k, (B, T, HKV, D), "[B, T, HKV, D]")
    val.check_ndim(op, "v", v, 4, "[B, T, HKV, DV]")
    DV = v.shape[3]
    val.check_shape(op, "v", v, (B, T, HKV, DV), "[B, T, HKV, DV]")
    if HKV == 0 or H % HKV != 0:
        raise ValueError(
            f"{op}: the query heads H = {H} must be a multiple of the key/value heads HKV = {HKV} "
            f"(`k` and `v` have HKV heads; query head h reads kv head h // (H // HKV))")
    val.check_range(op, "head dim D (q.shape[-1])", D, MIN_HEAD_DIM, MAX_HEAD_DIM)
    val.check_range(op, "value head dim DV (v.shape[-1])", DV, MIN_HEAD_DIM, MAX_HEAD_DIM)
    offsets = val.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    return AttentionInputs(B, T, H, HKV, D, DV, D ** -0.5 if scale is None else float(scale), offsets)
