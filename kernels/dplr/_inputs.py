"""Argument checks shared by the four DPLR entry points (docs/ops.md, "Invalid input").

``dplr_delta_rule(q, k, v, a, b, gk)`` and ``rwkv7(r, w, k, v, a, b)`` are one recurrence
under two sets of names; every message names the argument as the caller spelled it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import _validate as val

# Head dims the kernels are built and compile-checked for (RWKV-7 and DPLR models use 64
# and 128): the chunk kernels' score and level tiles are sized for them.
MAX_HEAD_DIM = 128


@dataclass
class DplrInputs:
    """The validated problem: sizes, the sequence count, the host copy of the offsets."""

    B: int
    T: int
    H: int
    K: int
    V: int
    N: int
    scale: float
    offsets_host: torch.Tensor | None


def check_dplr_inputs(op: str, names: dict, q, k, v, a, b, gk, scale, initial_state,
                      output_final_state, cu_seqlens, cu_seqlens_cpu) -> DplrInputs:
    """Validate; ``names`` maps the roles ``q`` and ``gk`` to the caller's names (``r``, ``w``).

    q, k, v, a, b share one dtype; the log gate may have any float dtype (float32 gates
    with bf16 activations are common); its gradient comes back in its own dtype.
    """
    nq, ng = names.get("q", "q"), names.get("gk", "gk")
    for name, t in ((nq, q), ("k", k), ("v", v), ("a", a), ("b", b), (ng, gk)):
        val.check_tensor(op, name, t)
    val.check_same_dtype(op, **{nq: q, "k": k, "v": v, "a": a, "b": b})
    val.check_scale(op, scale)
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{op}: `output_final_state` must be a bool, got {type(output_final_state).__name__}")
    device = val.check_devices(op, **{nq: q, "k": k, "v": v, "a": a, "b": b, ng: gk,
                                      "initial_state": initial_state, "cu_seqlens": cu_seqlens})

    val.check_ndim(op, nq, q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    val.check_heads(op, nq, H, "[B, T, H, K]")
    for name, t in (("k", k), ("a", a), ("b", b), (ng, gk)):
        val.check_shape(op, name, t, (B, T, H, K), "[B, T, H, K]")
    val.check_ndim(op, "v", v, 4, "[B, T, H, V]")
    V = v.shape[-1]
    val.check_shape(op, "v", v, (B, T, H, V), "[B, T, H, V]")
    val.check_range(op, f"key head dim K ({nq}.shape[-1])", K, 1, MAX_HEAD_DIM)
    val.check_range(op, "value head dim V (v.shape[-1])", V, 1, MAX_HEAD_DIM)

    offsets = val.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    val.check_initial_state(op, initial_state, (N, H, K, V))
    return DplrInputs(B, T, H, K, V, N, float(K ** -0.5 if scale is None else scale), offsets)

