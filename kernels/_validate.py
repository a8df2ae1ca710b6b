"""Input validation shared by every op: clear errors before any launch.

Every public op validates its arguments here before it launches anything, and each
error names the op, the argument and what was expected, e.g.::

    ValueError: chunk_simple_gla: `g` must have shape [B, T, H] = [2, 64, 4], got [2, 64, 4, 16]

Device-to-host syncs. Checking the *values* of ``cu_seqlens`` (starts at 0,
non-decreasing, ends at T) needs them on the host. That costs one sync per distinct
``cu_seqlens`` tensor, never per call:

* pass ``cu_seqlens_cpu`` (a CPU copy of the same offsets) and no sync happens at all:
  the CPU copy is validated, the device tensor's dtype, device and length are checked
  from metadata only, and the two are trusted to agree;
* otherwise the first call copies ``cu_seqlens`` to the host, validates it, and caches
  the host copy against that tensor object and its version counter, so later calls with
  the same (unmodified) tensor cost nothing. Modifying the tensor in place bumps its
  version and forces a fresh check.
"""

from __future__ import annotations

import math
import numbers
import weakref

import torch

from . import _arch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
STATE_DTYPES = FLOAT_DTYPES


def _dtype_names(dtypes) -> str:
    names = [str(d).replace("torch.", "") for d in dtypes]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_tensor(op: str, name: str, t, dtypes=FLOAT_DTYPES) -> None:
    """``t`` is a tensor of one of ``dtypes`` (``TypeError`` otherwise)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: `{name}` must have dtype {_dtype_names(dtypes)}, got {t.dtype}")


def check_same_dtype(op: str, **tensors) -> None:
    """All given tensors share one dtype (``None`` entries are skipped)."""
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(
                f"{op}: `{name}` has dtype {t.dtype} but `{first_name}` has {first.dtype}; they must match"
            )


def check_shape(op: str, name: str, t: torch.Tensor, expected, dims: str) -> None:
    """``t.shape == expected``; ``dims`` spells the expected shape symbolically, e.g. ``'[B, T, H]'``."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(
            f"{op}: `{name}` must have shape {dims} = {_shape_str(expected)}, got {_shape_str(t.shape)}"
        )


def check_ndim(op: str, name: str, t: torch.Tensor, ndim: int, dims: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{op}: `{name}` must be {ndim}-D {dims}, got shape {_shape_str(t.shape)}")


def check_scale(op: str, scale) -> None:
    """``scale`` is None (the op's default) or a finite real number: a NaN or infinite
    scale would make every output NaN, so it is refused like any other bad argument.
    While ``torch.compile`` traces, a float argument may be a symbol with no value to test
    (dynamo leaves floats unspecialised): only its type is checked then."""
    if scale is None:
        return
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool):
        raise TypeError(f"{op}: `scale` must be a float or None, got {type(scale).__name__}")
    if not torch.compiler.is_compiling() and not math.isfinite(scale):
        raise ValueError(f"{op}: `scale` must be finite, got {scale}")


def check_heads(op: str, name: str, heads: int, dims: str) -> None:
    """``name`` has at least one head. Zero heads is a model configuration mistake (a head
    count rounded down to 0), never data: refused, not answered with an empty output."""
    if heads < 1:
        raise ValueError(f"{op}: `{name}` must have at least one head, got {heads} heads in {dims}")


def check_range(op: str, what: str, value: int, lo: int, hi: int | None = None) -> None:
    """``lo <= value <= hi`` for a size such as a head dim or a channel count (``hi`` None:
    no upper bound). Every width has ``lo >= 1``: a width of 0 is configuration gone wrong,
    refused like one past the top (docs/ops.md, "Zero widths")."""
    if value < lo or (hi is not None and value > hi):
        span = f"{lo}..{hi}" if hi is not None else f"{lo} and above"
        raise ValueError(f"{op}: {what} = {value} is outside the supported range {span}")


def check_devices(op: str, **tensors) -> torch.device:
    """All given tensors are on one device that the kernels can run on; returns it.

    CUDA devices run the compiled kernels, the CPU runs them under
    ``TRITON_INTERPRET=1``, and ``meta`` tensors are accepted so that a launch can be
    captured (for offline compilation) without running it.
    """
    items = [(n, t) for n, t in tensors.items() if t is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(
                f"{op}: `{name}` is on {t.device} but `{first_name}` is on {first.device}; "
                "every tensor argument must be on the same device"
            )
    device = first.device
    if kernel_device(device):
        return device
    if device.type == "cpu":
        raise ValueError(
            f"{op}: `{first_name}` and the other tensors are on the CPU; the kernels run on a CUDA device "
            "(or on the CPU under TRITON_INTERPRET=1)"
        )
    raise ValueError(f"{op}: `{first_name}` and the other tensors are on {device}; expected a CUDA device")


def kernel_device(device: torch.device) -> bool:
    """Whether the kernels run on ``device`` (``check_devices``): a CUDA device, the CPU under
    ``TRITON_INTERPRET=1`` or while launches are captured, ``meta`` while captured. The
    question a validation fast path asks, with no error to build."""
    kind = device.type
    if kind == "cuda":
        return True
    if kind == "cpu":
        return _arch.CAPTURING_LAUNCHES or _arch.is_interpreter()
    return kind == "meta" and _arch.CAPTURING_LAUNCHES


def check_initial_state(op: str, initial_state, expected, dims: str = "[N, H, K, V]") -> None:
    """``initial_state`` is None or a float32, bfloat16 or float16 tensor of the expected
    shape. The kernels read it as float32 whatever its dtype (a state cache kept in the
    activations' dtype is passed as it is, with no copy) and write its gradient in its
    own dtype; the final state is float32."""
    if initial_state is None:
        return
    check_tensor(op, "initial_state", initial_state, STATE_DTYPES)
    check_shape(op, "initial_state", initial_state, expected, dims)


# id(tensor) -> (weakref to it, its version counter when checked, validated host copy)
_checked_offsets: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def _tensor_version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter: never cache them
        return None


def _cached_host_offsets(cu_seqlens: torch.Tensor, cache=_checked_offsets):
    entry = cache.get(id(cu_seqlens))
    if entry is None:
        return None
    ref, version, host = entry
    if ref() is cu_seqlens and version is not None and version == _tensor_version(cu_seqlens):
        return host
    return None


def _remember_host_offsets(cu_seqlens: torch.Tensor, host: torch.Tensor, cache=_checked_offsets) -> None:
    version = _tensor_version(cu_seqlens)
    if version is None:
        return
    if len(cache) > 256:  # drop entries whose tensors are gone
        for key in [k for k, (ref, _, _) in cache.items() if ref() is None]:
            del cache[key]
    cache[id(cu_seqlens)] = (weakref.ref(cu_seqlens), version, host)


def _check_offset_values(op: str, name: str, host: torch.Tensor, T: int) -> None:
    if host.numel() < 2:
        raise ValueError(f"{op}: `{name}` must hold at least 2 offsets [0, ..., T], got {host.numel()}")
    if host[0].item() != 0:
        raise ValueError(f"{op}: `{name}` must start at 0, got {name}[0] = {host[0].item()}")
    steps = host[1:] - host[:-1]
    if (steps < 0).any():
        i = int(torch.nonzero(steps < 0)[0].item())
        raise ValueError(
            f"{op}: `{name}` must be non-decreasing, got {name}[{i}] = {host[i].item()} > "
            f"{name}[{i + 1}] = {host[i + 1].item()}"
        )
    if host[-1].item() != T:
        raise ValueError(
            f"{op}: `{name}` must end at T = {T} (the packed sequence length), "
            f"got {name}[-1] = {host[-1].item()}"
        )


# Host copies of other small integer tensors whose values are checked (per-sequence
# position offsets): the same caching, kept apart from the validated offsets above.
_host_copies: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host int64 copy of the small integer tensor ``t``, read from the device once per
    tensor object and version (cached like ``cu_seqlens``), for checking its values."""
    if t.device.type == "cpu":
        return t.to(torch.int64)
    host = _cached_host_offsets(t, _host_copies)
    if host is None:
        host = t.detach().to("cpu", torch.int64)
        _remember_host_offsets(t, host, _host_copies)
    return host


def check_cu_seqlens(op: str, cu_seqlens, cu_seqlens_cpu, *, batch: int, T: int, device) -> torch.Tensor | None:
    """Validate variable-length offsets; return them as a host int64 tensor (or None).

    ``batch`` and ``T`` are the batch size and time length of the packed inputs, ``device``
    the device of the other tensor arguments. See the module docstring for when this
    syncs. While ``torch.compile`` traces, only the metadata is checked and None returned
    (size N from ``cu_seqlens.numel()``, not from the result).
    """
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError(f"{op}: `cu_seqlens_cpu` was given without `cu_seqlens`")
        return None
    for name, t in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: `{name}` must be a torch.Tensor of int32 or int64, got {type(t).__name__}")
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{op}: `{name}` must have dtype int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{op}: `{name}` must be 1-D [N + 1], got shape {_shape_str(t.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(
            f"{op}: `cu_seqlens` is on {cu_seqlens.device} but the inputs are on {device}; "
            "it must be on the same device (pass a CPU copy as `cu_seqlens_cpu` to avoid a sync)"
        )
    if batch != 1:
        raise ValueError(
            f"{op}: with `cu_seqlens` the batch size must be 1 (sequences packed along T), got B = {batch}"
        )
    if cu_seqlens_cpu is not None:
        if cu_seqlens_cpu.device.type != "cpu":
            raise ValueError(f"{op}: `cu_seqlens_cpu` must be on the CPU, got {cu_seqlens_cpu.device}")
        if cu_seqlens_cpu.numel() != cu_seqlens.numel():
            raise ValueError(
                f"{op}: `cu_seqlens_cpu` has {cu_seqlens_cpu.numel()} offsets but `cu_seqlens` has "
                f"{cu_seqlens.numel()}; they must be copies of each other"
            )
    if torch.compiler.is_compiling():
        # Values are not traceable: the op's real implementation checks them when it runs
        # (kernels/_library.py), with the same errors, before any launch.
        return None
    if cu_seqlens_cpu is not None:
        # Cached per object like the device tensor below, so that the host copy (and the
        # chunk maps keyed on it) stays the same object across calls, int32 input or not.
        host = _cached_host_offsets(cu_seqlens_cpu)
        if host is None:
            host = cu_seqlens_cpu.to(torch.int64)
            _check_offset_values(op, "cu_seqlens_cpu", host, T)
            _remember_host_offsets(cu_seqlens_cpu, host)
        elif int(host[-1]) != T:
            _check_offset_values(op, "cu_seqlens_cpu", host, T)  # raises the ends-at-T error
        return host
    host = _cached_host_offsets(cu_seqlens)
    if host is not None and int(host[-1]) != T:
        _check_offset_values(op, "cu_seqlens", host, T)  # raises the ends-at-T error
    if host is None:
        if cu_seqlens.device.type == "meta":
            raise ValueError(f"{op}: `cu_seqlens` on the meta device needs `cu_seqlens_cpu` with its values")
        host = cu_seqlens.detach().to("cpu", torch.int64)
        _check_offset_values(op, "cu_seqlens", host, T)
        _remember_host_offsets(cu_seqlens, host)
    return host
