"""Guard bands (``pytest_fla.checks.bounds``): a store past a buffer's end or before its start,
and a read past an input's end, seen by a plain run on the CPU interpreter; the check
``test_in_bounds`` catching an op whose every other check passes."""

from __future__ import annotations

import faulty_kernels as fk
import pytest
import torch

from plugin_testing import DEVICE, cpu_only, run
from pytest_fla import environment
from pytest_fla.checks import bounds
from pytest_fla.sanitizer import interpreter as interpreter_memcheck


def banded_call(fn, x):
    """``fn(x)`` with x and every allocation between bands; the interpreter's access check,
    which refuses these faults before they land, suspended."""
    records = []
    placed, record = bounds.place(x, "input `x`", copy=True)
    records.append(record)
    with bounds.banded_allocations(records), interpreter_memcheck.suspended():
        y = fn(placed)
    return y, [breach for record in records for breach in record.breaches()]


def test_a_clean_kernel_leaves_every_band():
    x = torch.randn(300, device=DEVICE)
    y, breaches = banded_call(fk.copy, x)
    assert breaches == []
    assert torch.equal(y, x)


def test_a_store_past_the_end_is_named_with_its_allocation():
    # values none of whose bytes is a band's: one byte of a random float32 matches the band
    # in about 1 draw in 90, and the stray store then changes 3 bytes, not 4
    y, breaches = banded_call(fk.off_by_one_store, torch.arange(1.0, 301.0, device=DEVICE))
    assert len(breaches) == 1, breaches
    assert "4 byte(s) changed past the end of a [300] float32 allocation (plugin/faulty_kernels.py:" in breaches[0]
    assert "(the nearest at byte +0)" in breaches[0]


def test_a_read_past_an_input_meets_nan_and_changes_no_band():
    x = torch.randn(300, device=DEVICE)
    y, breaches = banded_call(fk.off_by_one_read, x)
    assert breaches == []
    assert torch.equal(y[:-1], x[1:])
    assert torch.isnan(y[-1])


def test_a_store_before_the_start_is_named():
    placed, record = bounds.place(torch.zeros(8), "input `x`", copy=True)
    record.buffer[record.start - 3] = 0
    (breach,) = record.breaches()
    assert breach.startswith("1 byte(s) changed before the start of input `x` (the nearest at byte -3)")


def test_placing_keeps_values_strides_offset_and_alignment():
    x = torch.arange(48.0).reshape(6, 8)[1:, 2:7]
    placed, record = bounds.place(x, "input `x`", copy=True)
    assert torch.equal(placed, x)
    assert placed.stride() == x.stride()
    assert placed.storage_offset() == x.storage_offset() + bounds.BAND // 4
    assert (placed.data_ptr() - x.storage_offset() * 4 - record.buffer.data_ptr()) % bounds.BAND == 0
    assert record.breaches() == []


def test_allocators_are_restored_and_zeros_stay_zero():
    originals = (torch.empty, torch.empty_like, torch.zeros, torch.zeros_like, torch.Tensor.new_empty,
                 torch.Tensor.new_zeros)
    records = []
    with bounds.banded_allocations(records):
        z = torch.zeros(5, 3)
        e = torch.empty_like(z, dtype=torch.int32)
        n = z.new_zeros(4)
        assert torch.equal(z, torch.full((5, 3), 0.0)) and torch.equal(n, torch.full((4,), 0.0))
        assert e.dtype == torch.int32 and e.shape == (5, 3)
    assert len(records) == 3
    assert (torch.empty, torch.empty_like, torch.zeros, torch.zeros_like, torch.Tensor.new_empty,
            torch.Tensor.new_zeros) == originals


def _differentiable_op(forward, backward):
    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return forward(x)

        @staticmethod
        def backward(ctx, dy):
            return backward(dy)

    return Op.apply


@pytest.mark.parametrize("label, forward, backward, breached", [
    ("clean", fk.copy, fk.copy, None),
    ("forward reads past x", fk.off_by_one_read, fk.copy, "elements of y are not finite"),
    ("backward reads past dy", fk.copy, fk.off_by_one_read, "elements of dx are not finite"),
])
@cpu_only
def test_the_check_bands_differentiable_inputs_and_upstream_gradients(label, forward, backward, breached):
    """The leaves that get gradients and the upstream gradients go through ``run_with_grads``'s
    placement: a read one past either's end reaches the result it feeds."""
    from pytest_fla.api import Arg, Case, op_spec
    from pytest_fla.checks import generic

    case = Case("small", {"B": 2, "T": 5, "D": 8})
    spec = op_spec(label.replace(" ", "_"), op=_differentiable_op(forward, backward), reference=lambda x: x.double(),
                   args={"x": Arg(("B", "T", "D"))}, cases=(case,), grads=("x",), outputs=("y",), varlen=False)
    with interpreter_memcheck.suspended():  # it would refuse the reads before the bands see them
        if breached is None:
            generic.check_in_bounds(spec, case, "fp32", "cpu", 1)
            return
        with pytest.raises(AssertionError, match=breached):
            generic.check_in_bounds(spec, case, "fp32", "cpu", 1)


def _poisoned_then_unwritten_last(x):
    """What a library that poisons its own allocations (``fla_poison = pkg:FLAG``) leaves:
    the placed allocation filled with NaN, its last element never written."""
    y = torch.empty_like(x).fill_(float("nan"))
    fk.short_copy_kernel[(1,)](x, y, x.numel(), BLOCK=128)
    return y


@pytest.mark.parametrize("forward, backward, result, held", [
    (fk.unwritten_last, fk.copy, "y", "the band pattern of a [2, 5, 8] float32 allocation (plugin/faulty_kernels.py:"),
    (fk.copy, fk.unwritten_last, "dx", "the band pattern of a [2, 5, 8] float32 allocation (plugin/faulty_kernels.py:"),
    (_poisoned_then_unwritten_last, fk.copy, "y", "the poisoned allocation's NaN"),
])
@cpu_only
def test_an_element_never_written_is_told_from_a_read_out_of_bounds(forward, backward, result, held):
    """An unwritten element holds its own allocation's pattern (or a library's poison), where
    a read past an input brings that input's: the check names the one it finds."""
    from pytest_fla.api import Arg, Case, op_spec
    from pytest_fla.checks import generic

    case = Case("small", {"B": 2, "T": 5, "D": 8})
    spec = op_spec("short_copy", op=_differentiable_op(forward, backward), reference=lambda x: x.double(),
                   args={"x": Arg(("B", "T", "D"))}, cases=(case,), grads=("x",), outputs=("y",), varlen=False)
    with pytest.raises(AssertionError) as failed:
        generic.check_in_bounds(spec, case, "fp32", "cpu", 1)
    message = str(failed.value)
    assert f"1 of 80 elements of {result} were never written (they still hold {held}" in message, message
    assert "first at (1, 4, 7)" in message
    assert "read out of bounds" not in message


@cpu_only
def test_a_read_past_an_input_names_the_input_whose_band_it_read():
    from pytest_fla.api import Arg, Case, op_spec
    from pytest_fla.checks import generic

    case = Case("small", {"B": 2, "T": 5, "D": 8})
    spec = op_spec("shifted_copy", op=_differentiable_op(fk.off_by_one_read, fk.copy), reference=lambda x: x.double(),
                   args={"x": Arg(("B", "T", "D"))}, cases=(case,), grads=("x",), outputs=("y",), varlen=False)
    with interpreter_memcheck.suspended(), pytest.raises(AssertionError) as failed:
        generic.check_in_bounds(spec, case, "fp32", "cpu", 1)
    assert ("1 of 80 elements of y are not finite with NaN past each input's end: a read out of bounds reached them "
            "(NaN with the tag of input `x`), first at (1, 4, 7)") in str(failed.value)
    assert "never written" not in str(failed.value)


TOY_OPS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def double_kernel(x, y, n, BLOCK: tl.constexpr, OVERRUN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x + offs, mask=offs < n, other=0.0)
    # OVERRUN = 1: one element past the end is written too (a mask one past its edge)
    tl.store(y + offs, 2 * values, mask=offs < n + OVERRUN)


def _double(x, overrun):
    y = torch.empty_like(x)
    double_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128, OVERRUN=overrun)
    return y


def double(x):
    return _double(x, 0)


def double_past_the_end(x):
    return _double(x, 1)


def double_but_the_last(x):
    y = torch.empty_like(x)
    double_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel() - 1, BLOCK=128, OVERRUN=0)
    return y


def double_reference(x):
    return 2 * x.double()
'''

TOY_CONFTEST = '''
from pytest_fla.api import Arg, Case, op_spec
import toy_ops

ARGS = {"x": Arg(("B", "T", "D"))}
CASES = (Case("small", {"B": 2, "T": 5, "D": 8}),)


def pytest_fla_specs(config):
    return [op_spec(name, op=getattr(toy_ops, name), reference=toy_ops.double_reference, args=ARGS, cases=CASES,
                    outputs=("y",), varlen=False)
            for name in ("double", "double_past_the_end", "double_but_the_last")]
'''


@cpu_only
def test_the_check_fails_an_op_that_every_other_check_passes(pytester, monkeypatch):
    """The bands alone: the interpreter's access check (on by default) turned off, as on a GPU."""
    pytester.makepyfile(toy_ops=TOY_OPS, conftest=TOY_CONFTEST,
                        test_conformance="from pytest_fla.conformance import *  # noqa: F401,F403\n")
    monkeypatch.setenv(environment.INTERPRETER_MEMCHECK, "0")
    out = run(pytester, "-v", "-k", "forward or every_output or in_bounds").stdout.str()
    for passed in ("test_forward[double-fp32-small]", "test_every_output_written[double]",
                   "test_in_bounds[double-fp32-small]", "test_forward[double_past_the_end-fp32-small]",
                   "test_every_output_written[double_past_the_end]"):
        assert f"{passed} PASSED" in out, passed
    assert "test_in_bounds[double_past_the_end-fp32-small] FAILED" in out
    assert "4 byte(s) changed past the end of a [2, 5, 8] float32 allocation (" in out
    assert "/toy_ops.py:15 from " in out  # the allocation's line, then its caller


@cpu_only
def test_under_the_interpreter_its_access_check_fails_every_check_that_runs_the_store(pytester):
    pytester.makepyfile(toy_ops=TOY_OPS, conftest=TOY_CONFTEST,
                        test_conformance="from pytest_fla.conformance import *  # noqa: F401,F403\n")
    out = run(pytester, "-v", "-k", "forward or every_output or in_bounds").stdout.str()
    for check in ("test_forward[double_past_the_end-fp32-small]", "test_every_output_written[double_past_the_end]",
                  "test_in_bounds[double_past_the_end-fp32-small]"):
        assert f"{check} FAILED" in out, check
    assert "test_forward[double-fp32-small] PASSED" in out
    assert ("double_kernel (program (0, 0, 0)): write of 1 element(s) of 4 bytes outside every tensor argument; "
            "the lowest, 0 bytes past the end of `y` (float32[2, 5, 8])") in out


@cpu_only
def test_an_output_never_written_is_reported_as_such_by_both_checks(pytester):
    """The element the op never writes: the poisoning check and the bands' check say the same."""
    pytester.makepyfile(toy_ops=TOY_OPS, conftest=TOY_CONFTEST,
                        test_conformance="from pytest_fla.conformance import *  # noqa: F401,F403\n")
    out = run(pytester, "-v", "-k", "double_but_the_last and (every_output or in_bounds)").stdout.str()
    for check in ("test_every_output_written[double_but_the_last]", "test_in_bounds[double_but_the_last-fp32-small]"):
        assert f"{check} FAILED" in out, check
    assert ("double_but_the_last (small, fp32): 1 of 80 elements of y were never written (they still hold the band "
            "pattern of a [2, 5, 8] float32 allocation (") in out
    assert "a read out of bounds reached them" not in out
