"""Small helpers shared by the kernel wrappers: allocation, sizes, varlen chunk maps."""

from __future__ import annotations

import contextlib
import threading

import torch
import triton

# Set by the test suite: every buffer a wrapper allocates is filled with NaN (floating)
# or -1 (integer), so an element a kernel forgot to write cannot pass as a plausible value.
POISON_ALLOCATIONS = False


# Set by the opcheck check: every buffer starts at zero, so that the parts of saved
# intermediates no kernel writes (unused per-chunk slots) compare equal between runs.
ZERO_ALLOCATIONS = False


def empty(shape, dtype, device) -> torch.Tensor:
    """``torch.empty`` for every buffer a kernel writes in full (outputs, intermediates)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    # the flags first: every buffer of every call comes through here, and asking a tensor
    # for its device builds a Python object each time (host time: kernels/README.md)
    if not (ZERO_ALLOCATIONS or POISON_ALLOCATIONS) or t.device.type == "meta":
        return t
    if ZERO_ALLOCATIONS:  # before the poison: opcheck runs inside the poisoned test suite
        t.zero_()
    elif POISON_ALLOCATIONS:
        t.fill_(float("nan") if t.dtype.is_floating_point else -1)
    return t


def empty_like(t: torch.Tensor, dtype=None) -> torch.Tensor:
    return empty(t.shape, dtype or t.dtype, t.device)


_shapes = threading.local()


def shapes_only() -> bool:
    """True while a custom op's fake implementation runs the host code for shapes alone
    (``kernels._library``): tensors have no values and launches do nothing."""
    return getattr(_shapes, "only", False)


@contextlib.contextmanager
def computing_shapes():
    """Mark this thread's host code as running for shapes alone (see ``shapes_only``)."""
    before = shapes_only()
    _shapes.only = True
    try:
        yield
    finally:
        _shapes.only = before


def contiguous(*tensors):
    """Each tensor contiguous (a copy only where it is not); None stays None."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_size(n: int, minimum: int = 16) -> int:
    """Power-of-two block covering ``n`` (``tl.dot`` needs at least 16 along each dim)."""
    return max(triton.next_power_of_2(n), minimum)


# Caches of small device tensors the wrappers build from host values (chunk tables,
# frequency and decay vectors), so that a training loop copies them once.
_DEVICE_CACHES: list[dict] = []


def device_cache() -> dict:
    """A new cache of device tensors, registered for ``clear_device_caches``."""
    cache: dict = {}
    _DEVICE_CACHES.append(cache)
    return cache


def clear_device_caches() -> None:
    """Empty every device-tensor cache (the CUDA-graph check starts the compiled calls
    cold, so a tensor cached while a graph is captured would be caught)."""
    for cache in _DEVICE_CACHES:
        cache.clear()


_chunk_maps = device_cache()


def host_to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` (on the host) on ``device`` without blocking the host: from pinned memory,
    asynchronously (a pageable host-to-device copy synchronises)."""
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# Orders of a chunk map's rows. Where programs do unequal work, the heaviest launched first
# even out the tail of the launch (the last programs to start are then short ones):
# under a causal mask a query block sees more keys the later it lies, a key block more
# queries the earlier it lies. Stable sorts: ties keep sequence order.
IN_ORDER, LATE_FIRST, EARLY_FIRST = "in_order", "late_first", "early_first"


def chunk_map(offsets_host: torch.Tensor, chunk_size: int, device, order: str = IN_ORDER) -> torch.Tensor:
    """For packed sequences: an int32 ``[NT, 2]`` table of (sequence, chunk-in-sequence).

    ``offsets_host`` is the validated host copy of ``cu_seqlens``. A kernel launched over
    the NT chunks of all sequences reads its row to find which sequence and chunk it
    owns. Zero-length sequences own no chunk. ``order``: sequence by sequence
    (``IN_ORDER``), or every sequence's chunks by descending index in it (``LATE_FIRST``)
    or by descending count of chunks after them (``EARLY_FIRST``). Cached per offsets
    object, chunk size, order and device, so a training loop pays for the host-to-device
    copy once. Under ``shapes_only()`` an empty table: nothing may size an output from it.
    """
    if shapes_only():
        return torch.empty((0, 2), dtype=torch.int32, device=device)
    key = (id(offsets_host), chunk_size, order, str(device))
    hit = _chunk_maps.get(key)
    if hit is not None and hit[0] is offsets_host:
        return hit[1]
    lengths = (offsets_host[1:] - offsets_host[:-1]).tolist()
    rows = [(n, c) for n, length in enumerate(lengths) for c in range(cdiv(length, chunk_size))]
    if order == LATE_FIRST:
        rows.sort(key=lambda row: -row[1])
    elif order == EARLY_FIRST:
        rows.sort(key=lambda row: row[1] - cdiv(lengths[row[0]], chunk_size))
    elif order != IN_ORDER:
        raise ValueError(f"chunk_map: unknown order {order!r}")
    table = torch.tensor(rows if rows else [[0, 0]], dtype=torch.int32).reshape(-1, 2)[: len(rows)]
    if len(_chunk_maps) > 256:
        _chunk_maps.clear()
    table = host_to_device(table, device)
    _chunk_maps[key] = (offsets_host, table)
    return table
