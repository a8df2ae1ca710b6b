"""Argument checks and launch configs shared by HGRN's chunked and fused-recurrent ops."""

from __future__ import annotations

import functools

import torch

from .. import _arch, _utils
from .. import _validate as val


def check_hgrn_inputs(op: str, x, g, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
    """x, g ``[B, T, D]`` with ``D >= 1`` (g of any float dtype), initial_state float32 ``[N, D]``
    (docs/ops.md).
    Returns the validated host offsets (None without ``cu_seqlens``).

    The call of a training step (no packed sequences, arguments as the op wants them) passes
    attribute checks alone; anything else, and every error, goes through the full checks,
    whose errors name the argument."""
    if (cu_seqlens is None and cu_seqlens_cpu is None and type(output_final_state) is bool
            and isinstance(x, torch.Tensor) and isinstance(g, torch.Tensor)
            and x.dtype in val.FLOAT_DTYPES and g.dtype in val.FLOAT_DTYPES and x.dim() == 3 and g.shape == x.shape
            and x.shape[2] > 0 and g.device == x.device and val.kernel_device(x.device)
            and (initial_state is None or _state_fits(initial_state, x))):
        return None
    return _checked_offsets(op, x, g, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu)


def _state_fits(initial_state, x) -> bool:
    """An initial state ``check_initial_state`` takes, ``[B, D]`` on x's device."""
    return (isinstance(initial_state, torch.Tensor) and initial_state.dtype in val.STATE_DTYPES
            and initial_state.dim() == 2 and initial_state.shape[0] == x.shape[0]
            and initial_state.shape[1] == x.shape[2] and initial_state.device == x.device)


def _checked_offsets(op: str, x, g, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
    val.check_tensor(op, "x", x)
    val.check_tensor(op, "g", g)
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{op}: `output_final_state` must be a bool, got {type(output_final_state).__name__}")
    if initial_state is not None:  # a tensor before its device is asked for
        val.check_tensor(op, "initial_state", initial_state, val.STATE_DTYPES)
    device = val.check_devices(op, x=x, g=g, initial_state=initial_state, cu_seqlens=cu_seqlens)
    val.check_ndim(op, "x", x, 3, "[B, T, D]")
    B, T, D = x.shape
    val.check_shape(op, "g", g, (B, T, D), "[B, T, D]")
    val.check_range(op, "the channel dim D (x.shape[-1])", D, 1)
    offsets_host = val.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    # from cu_seqlens, not the host offsets: while torch.compile traces there are none
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    val.check_initial_state(op, initial_state, (N, D), "[N, D]")
    return offsets_host


def configs(D: int, arch: int | None = None) -> dict:
    """The launch configs for ``D`` channels on ``arch`` (default: the target arch;
    ``_configs``), worked out once per arch and size (a symbolic size, while torch.compile
    traces, each time)."""
    arch = _arch.target_arch() if arch is None else arch
    return _cached_configs(arch, D) if isinstance(D, int) else _configs(arch, D)


def _configs(arch: int, D: int) -> dict:
    """Tiles of ``[BT, BD]`` tokens x channels, from the target's shared memory. Each level
    of a tile scan gathers rows across warps through shared memory (two fp32 tiles), and
    the kernels are memory-bound: 64 channels a tile (4 warps, several programs resident
    per SM to keep loads in flight) where the target has 100 KB or more, 32 on sm75's
    64 KB. The fused kernel takes narrower blocks so that more programs share the GPU (one
    per sequence and block walks the whole sequence)."""
    wide = 64 if _arch.shared_memory_limit(arch) >= 100_000 else 32
    BD = min(wide, _utils.block_size(D, 16))
    return {
        "chunk": dict(BD=BD, num_warps=4),
        "carry": dict(NC=8),  # chunk maps a step of the summary's in-launch scan (8: fewest registers, fastest of 8, 16 and 64 on the H100)
        "fused": dict(BD=min(32, BD), num_warps=2),
    }


_cached_configs = functools.lru_cache(maxsize=None)(_configs)
