"""Guard bands around every tensor an op touches: a kernel that writes past the end (or
before the start) of a buffer, or reads an input past its end into a result, is caught
without compute-sanitizer, on the CPU interpreter as on a GPU.

Each input is copied into a larger buffer whose bytes outside the tensor's storage are a
band pattern (NaN in every float dtype, negative in the integer ones), and, while the op runs forward
and backward, ``torch.empty``, ``torch.empty_like``, ``Tensor.new_empty``, ``torch.zeros``,
``torch.zeros_like`` and ``Tensor.new_zeros`` hand out tensors placed the same way. After
the call every band must still hold its pattern. A read past an input's end meets NaN, which
the check finds in the outputs and gradients (a read the kernel masks away meets nothing).
Each buffer's pattern carries its own tag in the NaN's payload: a kernel that copies one
band's NaN into another (a partial sum read past its end, stored past the output's end)
changes the second band, where a common fill would not.

Why not the caching allocator's neighbours: on a GPU a stray row may land in another live
tensor or in free memory, and on the CPU in memory nothing reads; memcheck finds it only
with the caching allocator off (``docs/design.md``, "Sanitizer"). A band makes every
out-of-bounds store visible to a plain run.

The band is 512 bytes, a multiple of every alignment a kernel may rely on (16 bytes for a
tensor descriptor, 128 for vector loads, the CUDA allocator's 512), so a placed tensor
compiles and runs as a fresh allocation would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback

import torch

BAND = 512  # bytes before and after each tensor's storage
# A band is the byte pair (tag, 0xFF) repeated: with the tag in 0xF1..0xFF every float32,
# float64, bfloat16 and float16 element of it is a quiet NaN (exponent all ones, payload
# nonzero), and the tag tells buffers apart.
TAGS = tuple(range(0xF1, 0x100))
# torch's own allocators, for the buffers themselves: the ones the block below hands out
# are replaced while it runs
_EMPTY, _FULL = torch.empty, torch.full


@dataclasses.dataclass
class Placed:
    """One tensor placed between two bands: its buffer (bytes), the storage's byte range
    inside it, and what to call it in a failure."""

    buffer: torch.Tensor
    start: int
    end: int
    what: str
    tag: int
    filled: bool = True  # the storage holds the tensor's values; else the band pattern until written

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s first element lies in this record's storage."""
        base = self.buffer.data_ptr()
        return t.device == self.buffer.device and base + self.start <= t.data_ptr() < base + self.end

    def breaches(self) -> list[str]:
        found = []
        expected = _pattern(self.buffer.numel(), self.tag, self.buffer.device)
        for side, band, first in (("before the start", slice(None, self.start), self.start),
                                  ("past the end", slice(self.end, None), self.end)):
            changed = torch.nonzero(self.buffer[band] != expected[band]).flatten()
            if changed.numel():
                at = int(changed[0] if side == "past the end" else changed[-1]) + (first if side == "past the end" else 0)
                offset = at - self.end if side == "past the end" else at - self.start
                found.append(f"{int(changed.numel())} byte(s) changed {side} of {self.what} "
                             f"(the nearest at byte {offset:+d})")
        return found


_placed = 0  # placements so far: each takes the next tag


def _pattern(nbytes: int, tag: int, device) -> torch.Tensor:
    pair = _FULL((2,), 0xFF, dtype=torch.uint8, device=device)
    pair[0] = tag
    return pair.repeat(nbytes // 2)


def placeable(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in memory a band can surround: a strided tensor on the CPU or a GPU."""
    return t.device.type in ("cpu", "cuda") and t.layout == torch.strided


def place(t: torch.Tensor, what: str, copy: bool) -> tuple[torch.Tensor, Placed]:
    """``t``'s size, strides and storage offset in a buffer with a band on each side; its
    values copied in when ``copy``. Returns the placed tensor (a leaf) and its record."""
    global _placed
    tag = TAGS[_placed % len(TAGS)]
    _placed += 1
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    buffer = _pattern(nbytes + nbytes % 2 + 2 * BAND, tag, t.device)
    if copy and nbytes:
        raw = _EMPTY(0, dtype=torch.uint8, device=t.device).set_(storage)
        buffer[BAND:BAND + nbytes].copy_(raw)
    placed = _EMPTY(0, dtype=t.dtype, device=t.device).set_(
        buffer.untyped_storage(), BAND // t.element_size() + t.storage_offset(), t.size(), t.stride())
    return placed, Placed(buffer, BAND, BAND + nbytes, what, tag, filled=copy)


def band_tags(values: torch.Tensor) -> torch.Tensor:
    """Per element of the floating ``values``, the tag of the band pattern its bytes are (0
    where they are not one): how a NaN in a result tells where it came from."""
    size = values.element_size()
    if not values.dtype.is_floating_point or size < 2 or values.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.int32, device=values.device)
    raw = values.contiguous().view(torch.uint8).reshape(-1, size)
    tags, highs = raw[:, 0::2].int(), raw[:, 1::2]
    banded = (tags == tags[:, :1]).all(1) & (highs == 0xFF).all(1) & (tags[:, 0] >= TAGS[0])
    return torch.where(banded, tags[:, 0], 0).reshape(values.shape)


def _poison(values: torch.Tensor) -> torch.Tensor:
    """Which elements of the floating ``values`` are, bit for bit, the NaN that poisoning
    fills a library's allocations with (:func:`pytest_fla.checks.poison.fill_poison`)."""
    if values.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    size = values.element_size()
    nan = _FULL((1,), float("nan"), dtype=values.dtype, device=values.device).view(torch.uint8)
    return (values.contiguous().view(torch.uint8).reshape(-1, size) == nan).all(1).reshape(values.shape)


def not_finite(name: str, t: torch.Tensor, records: list[Placed]) -> list[str]:
    """Why elements of the result ``t`` (called ``name``) are not finite, read off their
    bytes. Never written: those still holding the pattern of the allocation ``t`` was placed
    in, or the poisoned allocations' NaN (where a library poisons its own after torch's
    allocator placed them). Any other NaN came in by a read out of bounds: a band's pattern
    (named by its tag where one buffer has it; tags repeat every ``len(TAGS)`` placements,
    so a read of a buffer sharing the output's tag passes for an unwritten element)."""
    bad = ~torch.isfinite(t)
    if not bad.any():
        return []
    own = next((r for r in records if not r.filled and r.holds(t)), None)
    values = t[bad]
    tags = band_tags(values)
    unwritten = _poison(values) | ((tags == own.tag) if own is not None else False)
    positions = torch.nonzero(bad)
    found = []
    if unwritten.any():
        held = f"the band pattern of {own.what}" if own is not None and (tags[unwritten] == own.tag).any() \
            else "the poisoned allocation's NaN"
        found.append(f"{int(unwritten.sum())} of {t.numel()} elements of {name} were never written (they still hold "
                     f"{held}), first at {tuple(positions[unwritten][0].tolist())}")
    if not unwritten.all():
        read = ~unwritten
        sources = {r.what for r in records if r.tag in set(tags[read].tolist()) and r is not own}
        source = f" (NaN with the tag of {sources.pop()})" if len(sources) == 1 else ""
        found.append(f"{int(read.sum())} of {t.numel()} elements of {name} are not finite with NaN past each "
                     f"input's end: a read out of bounds reached them{source}, first at {tuple(positions[read][0].tolist())}")
    return found


def _allocating_frames():
    """The first two frames outside torch and this package, innermost first: who allocated,
    and who called that (a library's own allocation helper and the op that used it)."""
    frames = [f for f in reversed(traceback.extract_stack(limit=14)[:-2])
              if "/torch/" not in f.filename and "/pytest_fla/" not in f.filename]
    return frames[:2]


def _short(frame) -> str:
    return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


@contextlib.contextmanager
def banded_allocations(records: list):
    """Inside the block, torch's Python allocators return tensors placed between bands;
    each placement is appended to ``records``."""
    originals = {
        (torch, "empty"): torch.empty, (torch, "empty_like"): torch.empty_like,
        (torch, "zeros"): torch.zeros, (torch, "zeros_like"): torch.zeros_like,
        (torch.Tensor, "new_empty"): torch.Tensor.new_empty, (torch.Tensor, "new_zeros"): torch.Tensor.new_zeros,
    }

    def banded(allocate, zero):
        def allocator(*args, **kwargs):
            t = allocate(*args, **kwargs)
            if "out" in kwargs or not placeable(t):
                return t
            frames = _allocating_frames()
            if frames and "/triton/" in frames[0].filename:
                return t  # the interpreter's own views of a launch's arguments
            where = " from ".join(_short(f) for f in frames) or "?"
            placed, record = place(t, f"a {list(t.shape)} {str(t.dtype).replace('torch.', '')} allocation ({where})",
                                   copy=False)
            if zero:
                placed.zero_()
            records.append(record)
            return placed.requires_grad_(t.requires_grad)
        return allocator

    for (owner, name), allocate in originals.items():
        setattr(owner, name, banded(allocate, zero=name.startswith(("zeros", "new_zeros"))))
    try:
        yield records
    finally:
        for (owner, name), allocate in originals.items():
            setattr(owner, name, allocate)
