"""Argument checks shared by the gated linear recurrences (linear_attn, simple_gla,
retention, gla, rwkv6): one place that knows their shapes, so every entry point raises the
same clear errors before any launch (docs/ops.md, "Invalid input")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _validate as val
from .._utils import device_cache

# Head dims the kernels support: the state tile [K, BV] and the chunk tiles [BT, K] must
# fit one program (registers and shared memory) on every target arch.
MIN_HEAD_DIM = 1
MAX_HEAD_DIM = 256


@dataclass
class GatedInputs:
    """The validated problem: sizes, the host copy of the offsets, the sequence count."""

    B: int
    T: int
    H: int
    K: int
    V: int
    N: int  # number of sequences: B, or len(cu_seqlens) - 1
    scale: float
    offsets_host: torch.Tensor | None


def check_gated_inputs(
    op: str,
    q,
    k,
    v,
    *,
    g=None,
    g_gamma=None,
    gk=None,
    u=None,
    scale=None,
    initial_state=None,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    gk_name: str = "gk",
    q_name: str = "q",
) -> GatedInputs:
    """Validate the arguments of a gated linear recurrence; see docs/ops.md for the layouts.

    ``g`` is a scalar log gate ``[B, T, H]``, ``g_gamma`` a constant log gate ``[H]``,
    ``gk`` a per-channel log gate ``[B, T, H, K]``, ``u`` rwkv6's bonus ``[H, K]``; each
    may be absent. Gates and the bonus may have a floating dtype other than q's (float32
    with bf16 activations is common). ``q_name`` is what the op calls q (rwkv6: ``r``).
    """
    for name, t in ((q_name, q), ("k", k), ("v", v)):
        val.check_tensor(op, name, t)
    val.check_same_dtype(op, **{q_name: q, "k": k, "v": v})
    for name, t in (("g", g), ("g_gamma", g_gamma), (gk_name, gk), ("u", u)):
        if t is not None:
            val.check_tensor(op, name, t)
    val.check_scale(op, scale)
    # later pairs win: for gla the per-channel gate takes the name `g` of the (absent) scalar one
    tensors = dict([(q_name, q), ("k", k), ("v", v), ("g", g), ("g_gamma", g_gamma), (gk_name, gk), ("u", u),
                    ("initial_state", initial_state), ("cu_seqlens", cu_seqlens)])
    device = val.check_devices(op, **tensors)

    val.check_ndim(op, q_name, q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    val.check_heads(op, q_name, H, "[B, T, H, K]")
    val.check_shape(op, "k", k, (B, T, H, K), "[B, T, H, K]")
    val.check_ndim(op, "v", v, 4, "[B, T, H, V]")
    V = v.shape[-1]
    val.check_shape(op, "v", v, (B, T, H, V), "[B, T, H, V]")
    if g is not None:
        val.check_shape(op, "g", g, (B, T, H), "[B, T, H]")
    if g_gamma is not None:
        val.check_shape(op, "g_gamma", g_gamma, (H,), "[H]")
    if gk is not None:
        val.check_shape(op, gk_name, gk, (B, T, H, K), "[B, T, H, K]")
    if u is not None:
        val.check_shape(op, "u", u, (H, K), "[H, K]")
    val.check_range(op, f"key head dim K ({q_name}.shape[-1])", K, MIN_HEAD_DIM, MAX_HEAD_DIM)
    val.check_range(op, "value head dim V (v.shape[-1])", V, MIN_HEAD_DIM, MAX_HEAD_DIM)

    offsets_host = val.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    val.check_initial_state(op, initial_state, (N, H, K, V))
    return GatedInputs(B, T, H, K, V, N, K**-0.5 if scale is None else float(scale), offsets_host)


_retention_gammas = device_cache()


def retention_gamma(H: int, device) -> torch.Tensor:
    """RetNet's per-head decay in log space: ``g_gamma[h] = log(1 - 2^(-5-h))``.

    Cached per (H, device): a fresh host-to-device copy on every call would stall the
    host on the stream.
    """
    if torch.compiler.is_compiling():
        # traced into the graph, on the device, and never cached: a cached graph output
        # could live in a CUDA graph's memory pool
        heads = torch.arange(H, dtype=torch.float64, device=device)
        return torch.log1p(-torch.pow(2.0, -5.0 - heads)).to(torch.float32)
    key = (H, str(device))
    gamma = _retention_gammas.get(key)
    if gamma is None:
        heads = torch.arange(H, dtype=torch.float64)
        gamma = torch.log1p(-torch.pow(2.0, -5.0 - heads)).to(device=device, dtype=torch.float32)
        _retention_gammas[key] = gamma
    return gamma
