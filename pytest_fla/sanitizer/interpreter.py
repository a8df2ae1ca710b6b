"""Access checks on the CPU under Triton's interpreter: memcheck's out-of-bounds check, and
a program's stores to one address in no set order.

compute-sanitizer's memcheck reports a load or store outside every allocation; it needs a
GPU, and sees a read just past a tensor only with PyTorch's caching allocator off
(``pytest_fla.sanitizer``). Under ``TRITON_INTERPRET=1`` every ``tl.load``, ``tl.store``
and atomic reaches the interpreter's builder as an array of addresses and a mask, so the
same check can run on every launch of every test, with no tool and no GPU.

``install()`` records, at each launch, the byte range of every tensor argument (a tensor
descriptor's base included): from its first element to one past its last, by its sizes
and strides. Each masked-in address of a load, store or atomic must then fall, with its
element's bytes, inside one of them; one that does not fails the launch with an
``OutOfBounds`` error naming the kernel, the program, the access's source line and the
nearest argument. The range is the tensor's own, not its allocation's: a read past a
view's end into memory the allocation holds (the next tensor of a packed buffer, the
guard bands of ``pytest_fla.checks.bounds``) is an error here, where memcheck sees only
allocations. That is the stricter verdict, and the one a kernel handed a view must meet:
its out-of-bounds reads that no output shows (a column masked out of every store) are
the ones the guard bands cannot see.

The planted faults of ``tests/plugin/faulty_kernels.py`` get the same verdict here as
from the real tool on a GPU (``tests/plugin/test_interpreter_memcheck.py`` beside
``tests/plugin/test_gpu_faults.py``).

It also fails a program whose two stores write one address different values with no
barrier between them (``UnorderedWrites``): on a GPU two store instructions of a program
may be issued by different threads, in no set order, so which value lands is a race in
global memory (racecheck watches shared memory only). Two stores of the same value (a
scan's carry, written as one chunk's outgoing and the next one's incoming state) leave the
same memory whichever lands last, and pass. The interpreter runs them in program order and the
later one always wins, so no value check can see it. Stores are told apart by their call
chain in the kernel (a helper's store called from two places is two stores); one store
run again, in a loop, is the same threads' and is not compared with itself.
``FLA_INTERPRETER_MEMCHECK=0`` turns both checks off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from .. import environment



class OutOfBounds(RuntimeError):
    """A masked-in access outside every tensor argument of its launch."""


class UnorderedWrites(RuntimeError):
    """Two stores of one program to one address, with no barrier between them."""


@dataclass(frozen=True)
class Extent:
    """One tensor argument's bytes: ``[start, end)``, and how to name it."""

    start: int
    end: int
    what: str


def wanted() -> bool:
    return os.environ.get(environment.INTERPRETER_MEMCHECK) != "0"


def tensor_extent(t, what: str) -> Extent | None:
    """The bytes a kernel may touch through ``t``: from its first element to one past its
    last (None for an empty tensor, which allows nothing)."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    # sizes and strides give the farthest element; a negative stride (never made by
    # torch's views, possible through as_strided) reaches below the first one
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    size = t.element_size()
    return Extent(start + low * size, start + (high + 1) * size,
                  f"`{what}` ({str(t.dtype).replace('torch.', '')}{list(t.shape)})")


def launch_extents(names, args, kwargs) -> list[Extent]:
    """The extents of a launch's tensor arguments (tuples and tensor descriptors opened)."""
    found: list[Extent] = []

    def add(value, what):
        if isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                add(item, f"{what}[{i}]")
        elif hasattr(value, "base") and hasattr(value, "block_shape"):  # a TensorDescriptor
            add(value.base, f"{what}.base")
        elif hasattr(value, "data_ptr") and hasattr(value, "stride"):
            extent = tensor_extent(value, what)
            if extent is not None:
                found.append(extent)

    for name, value in zip(names, args):
        add(value, name)
    for name, value in kwargs.items():
        add(value, name)
    return found


class Launches:
    """The launches in progress (the innermost last) with their arguments' extents, the
    running program's stores since its last barrier, and the two checks."""

    def __init__(self):
        self.stack: list[tuple[str, list[Extent]]] = []
        self.suspended = 0
        self.kernel_code = None  # the running kernel's code object: where a store's call chain ends
        self.written: dict[tuple, object] = {}  # per store (call chain): addresses since the last barrier

    def barrier(self) -> None:
        """A new program, or a barrier in this one: what was written before is ordered."""
        self.written = {}

    def active(self) -> bool:
        """Whether the access being made is to be checked (in a launch, not suspended)."""
        return bool(self.stack) and not self.suspended

    def check_write_order(self, addresses, bits) -> None:
        """``addresses``, ``bits``: a store's masked-in lanes (:func:`lanes`)."""
        import numpy as np

        addresses, first = np.unique(addresses, return_index=True)
        bits = bits[first]
        if addresses.size == 0:
            return
        site = _call_chain(self.kernel_code)
        for other, (earlier, earlier_bits) in self.written.items():
            if other == site:
                continue
            both, here, there = np.intersect1d(addresses, earlier, assume_unique=True, return_indices=True)
            # the same value from both is the same memory whichever lands last
            differ = bits[here] != earlier_bits[there].astype(bits.dtype)
            if differ.any():
                raise UnorderedWrites(
                    f"{self.stack[-1][0]}{_program()}: {int(differ.sum())} element(s) written different values by "
                    f"two stores with no barrier between them, whose order a GPU does not keep (different threads "
                    f"may issue them): first at {_describe_chain(other)}, then at {_describe_chain(site)}")
        before = self.written.get(site)
        if before is None:
            self.written[site] = (addresses, bits)
        else:  # this store's latest values where it wrote an address again (a loop)
            merged = np.concatenate([addresses, before[0]])
            merged_bits = np.concatenate([bits, before[1].astype(bits.dtype)])
            kept, at = np.unique(merged, return_index=True)
            self.written[site] = (kept, merged_bits[at])

    def check(self, op: str, addresses, element_bytes: int) -> None:
        """``addresses``: an access's masked-in lanes (:func:`lanes`)."""
        import numpy as np  # here: the plugin loads this module on controllers without numpy

        kernel, extents = self.stack[-1]
        if extents is None:  # the launch's arguments were never seen: nothing to check against
            return
        if addresses.size == 0:
            return
        starts, ends = _merged(extents)
        if starts.size == 0:
            inside = np.zeros(addresses.shape, dtype=bool)
        else:
            # the merged range that starts at or below each address, and whether it holds it whole
            at = np.searchsorted(starts, addresses, side="right") - 1
            inside = (at >= 0) & (addresses + np.uint64(element_bytes) <= ends[np.maximum(at, 0)])
        if inside.all():
            return
        outside = np.unique(addresses[~inside])  # lanes that repeat an address count once
        raise OutOfBounds(self.describe(kernel, op, outside, extents, element_bytes))

    @staticmethod
    def describe(kernel: str, op: str, outside, extents: list[Extent], element_bytes: int) -> str:
        first = int(outside.min())
        where = ""
        if extents:
            def distance(e):
                return e.start - first if first < e.start else first + element_bytes - e.end
            near = min(extents, key=distance)
            where = (f"; the lowest, {near.start - first} bytes before the start of {near.what}" if first < near.start
                     else f"; the lowest, {first - near.end} bytes past the end of {near.what}")
        return (f"{kernel}{_program()}: {op} of {outside.size} element(s) of {element_bytes} bytes outside every "
                f"tensor argument{where}{_source_line()}")


def lanes(ptrs, mask, values=None):
    """An access's masked-in lanes, flat: their addresses (uint64) and, given the stored
    ``values``, those values' bits (compared bit for bit, NaN included)."""
    import numpy as np

    addresses = np.asarray(ptrs, dtype=np.uint64)
    keep = None if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), addresses.shape)
    flat = addresses.ravel() if keep is None else addresses[keep]
    if values is None:
        return flat
    bits = np.ascontiguousarray(np.broadcast_to(np.asarray(values), addresses.shape))
    bits = bits.view(f"u{bits.dtype.itemsize}")
    return flat, (bits.ravel() if keep is None else bits[keep])


def _merged(extents: list[Extent]):
    """The extents' union as sorted, disjoint ``(starts, ends)`` arrays (cached per list: one
    launch's), so that each access is one binary search, whatever the number of arguments
    and however their views overlap."""
    cached = _MERGED.get(id(extents))
    if cached is not None and cached[0] is extents:
        return cached[1]
    import numpy as np

    merged: list[list[int]] = []
    for e in sorted(extents, key=lambda e: e.start):
        if merged and e.start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e.end)
        else:
            merged.append([e.start, e.end])
    arrays = (np.array([m[0] for m in merged], dtype=np.uint64), np.array([m[1] for m in merged], dtype=np.uint64))
    _MERGED.clear()  # one launch's at a time
    _MERGED[id(extents)] = (extents, arrays)
    return arrays


_MERGED: dict = {}


def _program() -> str:
    from triton.runtime.interpreter import interpreter_builder

    idx = getattr(interpreter_builder, "grid_idx", None)
    return f" (program {tuple(int(i) for i in idx)})" if idx is not None else ""


def _frames_outside():
    """``(path, line, code)`` of the calling frames outside Triton and this module,
    innermost first: the kernel's (or its helpers') lines."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}triton{os.sep}" not in path and path != __file__:
            yield path, frame.f_lineno, frame.f_code
        frame = frame.f_back


def _source_line() -> str:
    """`` at file:line: source`` of the access: the innermost frame outside Triton."""
    frame = next(_frames_outside(), None)
    return f" at {_describe_chain((frame[:2],))}" if frame else ""


def _call_chain(kernel_code) -> tuple:
    """``((path, line), ...)`` from the store out to the kernel's own frame."""
    chain = []
    for path, line, code in _frames_outside():
        chain.append((path, line))
        if code is kernel_code:
            break
    return tuple(chain)


def _describe_chain(chain: tuple) -> str:
    import linecache

    if not chain:
        return "an unknown line"
    path, line = chain[0]
    text = f"{path}:{line}: {linecache.getline(path, line).strip()}"
    return text + "".join(f" (called at line {n})" for _, n in chain[1:])


LAUNCHES = Launches()


@contextlib.contextmanager
def suspended():
    """No access checked inside: for tests of what the other checks see of a fault."""
    LAUNCHES.suspended += 1
    try:
        yield
    finally:
        LAUNCHES.suspended -= 1


def _element_bytes(ptrs) -> int:
    return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)


def install() -> bool:
    """Check every access of every interpreted launch in this process; False (nothing
    done) where it is not wanted or this Triton's interpreter has not the shape it was
    written for (Triton 3.6 to 3.9 have it)."""
    if not wanted():
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    executor = getattr(interpreter, "GridExecutor", None)
    methods = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas",
               "set_grid_idx", "create_barrier")
    if builder is None or executor is None or not all(hasattr(builder, m) for m in methods) \
            or not hasattr(executor, "_init_args_hst") or getattr(executor, "fla_memcheck", False):
        return False

    init_args, call = executor._init_args_hst, executor.__call__

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        if LAUNCHES.stack and LAUNCHES.stack[-1][1] is None:
            LAUNCHES.stack[-1] = (LAUNCHES.stack[-1][0], launch_extents(self.arg_names, args_hst, kwargs_hst))
        return args_hst, kwargs_hst

    def call_checked(self, *args, **kwargs):
        LAUNCHES.stack.append((getattr(self.fn, "__name__", "a kernel"), None))
        LAUNCHES.kernel_code = getattr(self.fn, "__code__", None)
        LAUNCHES.barrier()
        try:
            return call(self, *args, **kwargs)
        except Exception as error:
            finding = error.__cause__
            if isinstance(finding, (OutOfBounds, UnorderedWrites)):
                # Triton's interpreter wraps it in an InterpreterError of its repr, caused by
                # it: a failure printed the finding twice, once per exception of the chain
                raise finding from None
            raise
        finally:
            LAUNCHES.stack.pop()
            LAUNCHES.barrier()

    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    grid_idx, barrier = builder.set_grid_idx, builder.create_barrier
    atomic_rmw, atomic_cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        if LAUNCHES.active():
            LAUNCHES.check("read", lanes(ptrs.data, mask.data), _element_bytes(ptrs))
        return masked_load(self, ptrs, mask, other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        if LAUNCHES.active():
            addresses, bits = lanes(ptrs.data, mask.data, value.data)
            LAUNCHES.check("write", addresses, _element_bytes(ptrs))
            LAUNCHES.check_write_order(addresses, bits)
        return masked_store(self, ptrs, value, mask, *args, **kwargs)

    def set_grid_idx(self, *args, **kwargs):
        LAUNCHES.barrier()
        return grid_idx(self, *args, **kwargs)

    def create_barrier(self, *args, **kwargs):
        LAUNCHES.barrier()
        return barrier(self, *args, **kwargs)

    def create_atomic_rmw(self, rmw_op, ptr, val, mask, *args, **kwargs):
        if LAUNCHES.active():
            LAUNCHES.check("atomic", lanes(ptr.data, mask.data), _element_bytes(ptr))
        return atomic_rmw(self, rmw_op, ptr, val, mask, *args, **kwargs)

    def create_atomic_cas(self, ptr, cmp, val, *args, **kwargs):
        if LAUNCHES.active():
            LAUNCHES.check("atomic", lanes(ptr.data, None), _element_bytes(ptr))
        return atomic_cas(self, ptr, cmp, val, *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = create_atomic_rmw, create_atomic_cas
    builder.set_grid_idx, builder.create_barrier = set_grid_idx, create_barrier
    executor._init_args_hst, executor.__call__ = init_args_checked, call_checked
    executor.fla_memcheck = True
    return True


def install_process_fixes() -> None:
    """What makes a valid kernel run under the interpreter, installed alike in every process
    that runs kernels there (a test process, a reproducer's child): the fixes of
    ``pytest_fla.targets`` (launches that skip repeated patching, a GPU's exp, each autotuned
    kernel at its first config, the fixes of each Triton's interpreter), then this module's
    check of every access (a read past a tensor that changes no value fails too)."""
    from ..targets import autotune, interpreter, interpreter_exp, interpreter_versions

    interpreter.skip_repeated_patching()
    interpreter_exp.install()
    autotune.install_untimed()
    interpreter_versions.install()
    install()
