"""The interpreter's out-of-bounds check (``pytest_fla/sanitizer/interpreter.py``) against
the real compute-sanitizer memcheck: one module of planted faults, run on the CPU under
the interpreter and on a GPU under memcheck, and the verdicts each must give. They differ
in one place only, by design: a read past a view's end into memory its allocation holds."""

from __future__ import annotations

import pytest
import torch
from plugin_testing import cpu_only, needs_gpu, run

from pytest_fla import environment, sanitizer
from pytest_fla.running.devices import is_interpreter
from pytest_fla.sanitizer import interpreter as memcheck

FAULTS = '''
import torch
import faulty_kernels as fk

DEVICE = "DEVICE"


def test_copy():
    x = torch.arange(1000.0, device=DEVICE)
    assert torch.equal(fk.copy(x), x)


def test_copy_of_a_slice():
    # a slice in the middle of a larger buffer: in bounds of the view, whatever lies around it
    buf = torch.arange(3000.0, device=DEVICE)
    assert torch.equal(fk.copy(buf[1000:2000]), buf[1000:2000])


def test_off_by_one_read():
    x = torch.arange(1000.0, device=DEVICE)
    y = fk.off_by_one_read(x)
    assert torch.equal(y[:-1], x[1:])


def test_discarded_read():
    # right results: only an address check sees the read
    x = torch.arange(1000.0, device=DEVICE)
    assert torch.equal(fk.discarded_read(x), x)


def test_read_into_the_next_tensor():
    # the first half of one allocation read one element too far: into the second half
    buf = torch.arange(2000.0, device=DEVICE)
    assert torch.equal(fk.off_by_one_read(buf[:1000]), buf[1:1001])
'''

# each test's verdict: (memcheck on a GPU, the interpreter's check on the CPU)
VERDICTS = {
    "test_copy": ("passed", "passed"),
    "test_copy_of_a_slice": ("passed", "passed"),
    "test_off_by_one_read": ("failed", "failed"),
    "test_discarded_read": ("failed", "failed"),
    # memcheck sees allocations, the interpreter's check each tensor argument's own bytes
    "test_read_into_the_next_tensor": ("passed", "failed"),
}


def verdicts(result) -> dict[str, str]:
    """Each test's outcome, from a ``-v`` run's lines."""
    found = {}
    for line in result.stdout.lines:
        for name in VERDICTS:
            if f"::{name} " in line and ("PASSED" in line or "FAILED" in line):
                found[name] = "passed" if "PASSED" in line else "failed"
    return found


@cpu_only
def test_the_interpreter_gives_the_verdicts_in_the_table(project):
    project.makepyfile(test_faults=FAULTS.replace('"DEVICE"', '"cpu"'))
    result = run(project, "-v")
    out = result.stdout.str()
    assert verdicts(result) == {name: v[1] for name, v in VERDICTS.items()}, out
    assert "fla interpreter memcheck: every load, store and atomic checked" in out
    assert ("discarded_read_kernel (program (7, 0, 0)): read of 1 element(s) of 4 bytes outside every tensor "
            "argument; the lowest, 0 bytes past the end of `x_ptr` (float32[1000])") in out
    assert "faulty_kernels.py:" in out and "nxt = tl.load(x_ptr + offs + 1, mask=mask)" in out


@cpu_only
def test_a_finding_is_reported_once(project):
    """The finding itself fails the test: Triton's interpreter wraps it in an InterpreterError
    repeating its message, and a failure printed both."""
    project.makepyfile(test_faults=FAULTS.replace('"DEVICE"', '"cpu"'))
    out = run(project, "-k", "test_off_by_one_read").stdout.str()
    finding = "shifted_copy_kernel (program (7, 0, 0)): read of 1 element(s) of 4 bytes outside every tensor argument"
    # once in the failure (the short summary line after it repeats it where CI is set)
    assert out.split("short test summary info")[0].count(finding) == 1, out
    assert "E       pytest_fla.sanitizer.interpreter.OutOfBounds: " + finding in out
    assert "InterpreterError" not in out


@cpu_only
def test_turned_off_every_fault_passes(project, monkeypatch):
    """What a plain run gives: none of these faults changes a checked value."""
    project.makepyfile(test_faults=FAULTS.replace('"DEVICE"', '"cpu"'))
    monkeypatch.setenv(environment.INTERPRETER_MEMCHECK, "0")
    result = run(project, "-v")
    out = result.stdout.str()
    assert verdicts(result) == {name: "passed" for name in VERDICTS}, out
    assert "fla interpreter memcheck" not in out


@needs_gpu
@pytest.mark.skipif(sanitizer.executable() is None, reason="compute-sanitizer is not on the PATH")
def test_memcheck_gives_the_verdicts_in_the_table(project):
    project.makepyfile(test_faults=FAULTS.replace('"DEVICE"', '"cuda"'))
    result = run(project, "--fla-sanitizer=memcheck", "-v")
    out = result.stdout.str()
    assert verdicts(result) == {name: v[0] for name, v in VERDICTS.items()}, out
    assert "discarded_read_kernel" in out and "Invalid __global__ read of size 4 bytes" in out


# In this process (the plugin installed the check where the suite runs under the interpreter)

needs_interpreter = pytest.mark.skipif(not is_interpreter(), reason="the check runs under Triton's interpreter only")


@needs_interpreter
def test_a_store_and_an_atomic_out_of_bounds_are_refused_before_they_land():
    import faulty_kernels as fk
    import triton
    import triton.language as tl

    @triton.jit
    def add_past_end(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.atomic_add(x_ptr + offs, 1.0, mask=offs <= n)  # the planted bug: <= n

    buf = torch.zeros(300)
    x = buf[:100]
    with pytest.raises(Exception, match=r"atomic of 1 element\(s\) of 4 bytes outside every tensor argument"):
        add_past_end[(1,)](x, 100, BLOCK=128)
    with pytest.raises(Exception, match=r"shifted_store_kernel .*write of 1 element"):
        fk.off_by_one_store(x)
    assert torch.count_nonzero(buf[100:]) == 0  # neither reached the memory past x


@needs_interpreter
def test_lanes_that_repeat_an_address_count_once():
    import triton
    import triton.language as tl

    @triton.jit
    def rows_of_a_vector(w, y, n, R: tl.constexpr, B: tl.constexpr):
        # a parameter vector as an [R, B] tile, every row a copy; the planted bug: c <= n
        c = tl.arange(0, B)[None, :] + tl.zeros([R, 1], dtype=tl.int32)
        r = tl.arange(0, R)[:, None]
        tl.store(y + r * n + c, tl.load(w + c, mask=c <= n, other=0.0), mask=c < n)

    with pytest.raises(Exception, match=r"read of 1 element\(s\) of 4 bytes .* past the end of `w` \(float32\[6\]\)"):
        rows_of_a_vector[(1,)](torch.ones(6), torch.empty(4, 6), 6, R=4, B=8)


@needs_interpreter
def test_a_finding_is_raised_as_itself():
    import faulty_kernels as fk

    with pytest.raises(memcheck.OutOfBounds) as found:
        fk.off_by_one_store(torch.zeros(100))
    assert found.value.__cause__ is None and found.value.__suppress_context__


@needs_interpreter
def test_two_stores_of_one_address_with_no_barrier_between_fail():
    import faulty_kernels as fk

    x = torch.arange(1000.0)
    with pytest.raises(Exception) as found:
        fk.overlapping_stores(x)
    message = str(found.value)
    assert found.type is memcheck.UnorderedWrites
    assert "overlapping_stores_kernel (program (7, 0, 0)): 1 element(s) written " \
        "different values by two stores with no barrier between them" in message
    assert "tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=head) * 0.0" in message
    assert "tl.store(y_ptr + last, tl.load(x_ptr + last)" in message
    with memcheck.suspended():  # what a plain run sees: the later store's right value
        y = fk.overlapping_stores(x)
    assert torch.equal(y[:-1], torch.zeros(999)) and y[-1] == 999


@needs_interpreter
def test_two_stores_of_the_same_value_pass():
    """A scan's carry written as one chunk's outgoing and the next one's incoming state: the
    same memory whichever store lands last (chunk_hgrn's ``_scan_chunk_maps``)."""
    import triton
    import triton.language as tl

    @triton.jit
    def carry_twice(y, B: tl.constexpr):
        o = tl.arange(0, B)
        h = tl.cumsum(o.to(tl.float32), axis=0)
        tl.store(y + o + 1, h, mask=o < B - 1)  # each row's state into the next slot
        tl.store(y + 1 + tl.arange(0, 1), tl.sum(tl.where(o == 0, h, 0.0)) + tl.zeros([1], tl.float32))

    y = torch.zeros(9)
    carry_twice[(1,)](y, B=8)
    assert y[1] == 0 and y[2] == 1


@needs_interpreter
def test_a_store_rerun_in_a_loop_or_after_a_barrier_is_ordered():
    import triton
    import triton.language as tl

    @triton.jit
    def rewrites(y, n, B: tl.constexpr, BARRIER: tl.constexpr):
        o = tl.arange(0, B)
        for i in range(3):  # one store, the same threads each time
            tl.store(y + o, o.to(tl.float32) * i, mask=o < n)
        if BARRIER:
            tl.debug_barrier()
            tl.store(y + o, o.to(tl.float32), mask=o < n)

    y = torch.zeros(8)
    rewrites[(1,)](y, 8, B=8, BARRIER=True)
    assert torch.equal(y, torch.arange(8.0))
    import faulty_kernels as fk

    with pytest.raises(Exception, match="written different values by two stores .* \\(called at line"):
        fk.helper_stores_twice(y)


def test_extents_follow_sizes_and_strides():
    base = torch.zeros(4, 6)
    size = base.element_size()
    whole = memcheck.tensor_extent(base, "x")
    assert (whole.start, whole.end - whole.start) == (base.data_ptr(), 24 * size)
    column = memcheck.tensor_extent(base[:, 2], "x")  # stride 6: elements 2, 8, 14, 20
    assert (column.start - base.data_ptr(), column.end - base.data_ptr()) == (2 * size, 21 * size)
    transposed = memcheck.tensor_extent(base.t()[1:3], "x")  # columns 1 and 2 of every row
    assert (transposed.start - base.data_ptr(), transposed.end - base.data_ptr()) == (1 * size, 21 * size)
    broadcast = memcheck.tensor_extent(base[0:1].expand(5, 6), "x")  # stride 0: one row
    assert broadcast.end - broadcast.start == 6 * size
    assert memcheck.tensor_extent(base[:0], "x") is None
