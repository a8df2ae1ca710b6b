"""``chunk_rwkv6`` and ``fused_recurrent_rwkv6``: validation, then GLA's kernels with the bonus.

    o_t = (S_{t-1} + diag(u) k_t v_t^T)^T (scale r_t)
    S_t = diag(e^{w_t}) S_{t-1} + k_t v_t^T

r, k, w ``[B, T, H, K]``; v ``[B, T, H, V]``; u ``[H, K]``; state float32 ``[N, H, K, V]``.
The chunked form is ``kernels.gla.chunk`` with BONUS: intra-chunk scores strictly below
the diagonal with the query's gate exclusive of its own token, the diagonal
``scale r_t . (u k_t)`` (see that module's "RWKV-6" section); the fused form is
``kernels.gated_recurrent.fused_recurrent`` with BONUS. Both are registered as custom ops
(``torch.ops.fla.chunk_rwkv6``, ``fused_recurrent_rwkv6``) beside gla's, from the same launches.
"""

from __future__ import annotations

import torch

from .. import _arch
from ..gated_recurrent.fused_recurrent import fused_recurrent
from ..gated_recurrent.inputs import check_gated_inputs
from ..gla.chunk import OPS as CHUNK_OPS


def chunk_rwkv6(
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
):
    """RWKV-6, chunked. r, k, v of one dtype; w (log decay) and u (bonus) of any float
    dtype, their gradients in it. ``scale`` defaults to ``K ** -0.5``. With ``cu_seqlens``
    (``B == 1``) the N packed sequences run independently; pass ``cu_seqlens_cpu`` to
    validate without a device-to-host copy. Returns ``(o, final_state)``, ``final_state``
    float32 ``[N, H, K, V]`` or None. K and V up to 256.
    """
    op = "chunk_rwkv6"
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{op}: `output_final_state` must be a bool, got {type(output_final_state).__name__}")
    shapes = check_gated_inputs(op, r, k, v, gk=w, u=u, scale=scale, initial_state=initial_state,
                                cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, gk_name="w", q_name="r")
    _arch.require_arch(op, 80, _arch.SM75_TILES)
    return CHUNK_OPS[op](r, k, v, w, u, initial_state, cu_seqlens, cu_seqlens_cpu, shapes.scale, output_final_state,
                         offsets=shapes.offsets_host)


def fused_recurrent_rwkv6(
    r: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
):
    """RWKV-6, one pass over T (for decoding). Arguments and results as :func:`chunk_rwkv6`."""
    return fused_recurrent("fused_recurrent_rwkv6", r, k, v, None, None, w, scale, initial_state,
                           output_final_state, cu_seqlens, cu_seqlens_cpu, gk_name="w", u=u, q_name="r")
