"""What a failing check says: a numeric check names every output and gradient out of its
budget with the place of its worst element in the layout's words, and fails once; a
bad-input check an op fails says what the call got wrong and what was expected."""

from __future__ import annotations

import json
import re

from plugin_testing import cpu_only, run

from pytest_fla.checks.generic import locate
from pytest_fla.report import verdicts

OPS = '''
import torch
import triton
import triton.language as tl


class _Doubled(torch.autograd.Function):
    """y = 2 x, with one wrong element planted in y and one in dx."""

    @staticmethod
    def forward(ctx, x):
        y = 2 * x
        if y.shape[1] > 6:
            y[0, 6, 2] += 1.0
        return y

    @staticmethod
    def backward(ctx, dy):
        dx = 2 * dy
        dx[-1, 2, 1] += 1.0
        return dx


def doubled(x, cu_seqlens=None, cu_seqlens_cpu=None):
    return _Doubled.apply(x)


def doubled_reference(x, cu_seqlens=None, cu_seqlens_cpu=None):
    return 2 * x.double()


@triton.jit
def add_kernel(a, b, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y + offs, tl.load(a + offs, mask=mask) + tl.load(b + offs, mask=mask), mask=mask)


def add(a, b):
    """The planted omission: no check of the arguments' devices."""
    y = torch.empty_like(b)
    add_kernel[(triton.cdiv(b.numel(), 128),)](a, b, y, b.numel(), BLOCK=128)
    return y


def add_reference(a, b):
    return a.double() + b.double()
'''

CONFTEST = '''
from pytest_fla.api import Arg, Case, op_spec
import toy_ops

TOKENS = {"x": Arg(("B", "T", "D"))}
PAIR = {"a": Arg(("B", "T", "D")), "b": Arg(("B", "T", "D"))}


def pytest_fla_specs(config):
    return [
        op_spec("doubled", op=toy_ops.doubled, reference=toy_ops.doubled_reference, args=TOKENS,
                cases=(Case("small", {"B": 2, "T": 9, "D": 8}),), grads=("x",), outputs=("y",), chunk_size=16),
        op_spec("add", op=toy_ops.add, reference=toy_ops.add_reference, args=PAIR,
                cases=(Case("small", {"B": 2, "T": 5, "D": 8}),), outputs=("y",), varlen=False),
    ]
'''


def project(pytester):
    pytester.makepyfile(toy_ops=OPS, conftest=CONFTEST,
                        test_conformance="from pytest_fla.conformance import *  # noqa: F401,F403\n")
    return pytester


@cpu_only
def test_a_numeric_check_names_every_failing_tensor_where_it_is_worst(pytester):
    out = run(project(pytester), "-k", "test_backward and doubled and fp32").stdout.str()
    assert "FAILED test_conformance.py::test_backward[doubled-fp32-small]" in out
    assert re.search(r"doubled\.y \(fp32, forward\): relative RMS error \S+ \(limit 2\.0e-05\), max abs error .*; "
                     r"worst element at batch 0, token 6, channel 2\n", out), out
    assert re.search(r"doubled: dx \(fp32, backward\): relative RMS error .*; "
                     r"worst element at batch 1, token 2, channel 1\n", out), out
    assert "(2 of 2 comparisons failed)" in out


@cpu_only
def test_a_packed_run_names_the_sequence_of_the_worst_token(pytester):
    out = run(project(pytester), "-k", "test_varlen and doubled and fp32").stdout.str()
    assert re.search(r"doubled\.y \(fp32, forward\): .*; worst element at batch 0, "
                     r"token 6 \(sequence \d+, its token \d+\), channel 2\n", out), out


def test_a_location_decodes_each_dim_of_the_layout():
    assert locate((1, 37, 3, 12), ("B", "T", "H", "V")) == "batch 1, token 37, head 3, value channel 12"
    # the empty sequence 1 owns no token: token 3 is sequence 2's first
    assert locate((0, 3, 2), ("B", "T", "D"), [0, 3, 3, 8]) == "batch 0, token 3 (sequence 2, its token 0), channel 2"
    assert locate((0, 1, 2), ("B", "T", "D"), [0, 3, 3, 8], shift={"T": 5}) == \
        "batch 0, token 6 (sequence 2, its token 3), channel 2"
    assert locate((2, 0, 4, 1), ("N", "H", "K", "V")) == "sequence 2, head 0, key channel 4, value channel 1"
    assert locate((1, 2), None) == "index (1, 2)"


@cpu_only
def test_an_op_without_a_device_check_is_told_what_was_moved_and_what_was_expected(pytester):
    out = run(project(pytester), "-k", "test_device_mismatch and add").stdout.str()
    assert "FAILED test_conformance.py::test_device_mismatch[add-a]" in out
    assert ("add: `a` moved to meta, the other tensors on cpu: expected a ValueError matching '`a`.* on |on .*`a`' "
            "before any launch; got NotImplementedError: Cannot copy out of meta tensor") in out


AGREEING_OPS = '''
import torch


class _Tripled(torch.autograd.Function):
    """y = 3 x, with a wrong dx where ``wrong_grad``: the planted defect of one of two kernels."""

    @staticmethod
    def forward(ctx, x, wrong_grad):
        ctx.wrong_grad = wrong_grad
        return 3 * x

    @staticmethod
    def backward(ctx, dy):
        dx = 3 * dy
        if ctx.wrong_grad:
            dx[0, 1, 1] += 1.0
        return dx, None


def tripled_chunk(x):
    return _Tripled.apply(x, False)


def tripled_recurrent(x):
    return _Tripled.apply(x, True)


def tripled_reference(x):
    return 3 * x.double()
'''

AGREEING_CONFTEST = '''
from pytest_fla.api import Arg, Case, op_spec
import toy_ops

TOKENS = {"x": Arg(("B", "T", "D"))}
CASES = (Case("small", {"B": 2, "T": 5, "D": 8}),)


def pytest_fla_specs(config):
    return [
        op_spec("tripled_chunk", op=toy_ops.tripled_chunk, reference=toy_ops.tripled_reference, args=TOKENS,
                cases=CASES, grads=("x",), outputs=("y",), varlen=False, agrees_with="tripled_recurrent"),
        op_spec("tripled_recurrent", op=toy_ops.tripled_recurrent, reference=toy_ops.tripled_reference,
                args=TOKENS, cases=CASES, grads=("x",), outputs=("y",), varlen=False),
    ]
'''


@cpu_only
def test_a_disagreement_names_the_kernel_off_the_reference(pytester):
    """chunk_vs_recurrent of a right kernel against a wrong one fails under the right one's
    name; the failure says whose defect it is."""
    pytester.makepyfile(toy_ops=AGREEING_OPS, conftest=AGREEING_CONFTEST,
                        test_conformance="from pytest_fla.conformance import *  # noqa: F401,F403\n")
    report = pytester.path / "report.json"
    out = run(pytester, "-k", "test_chunk_vs_recurrent and fp32", f"--fla-report={report}").stdout.str()
    assert "FAILED test_conformance.py::test_chunk_vs_recurrent[tripled_chunk-fp32-small]" in out, out
    said = ("tripled_chunk and tripled_recurrent disagree; against the float64 reference: tripled_chunk within "
            "its tolerances; tripled_recurrent off on dx: the disagreement is tripled_recurrent's")
    assert said in out, out
    # the verdict counts it against the kernel that is off, and the one-line reason keeps who that is
    (record,) = [t for t in json.loads(report.read_text())["tests"] if t["check"] == "chunk_vs_recurrent"]
    assert record["verdict"] == "defect", record
    assert verdicts.culprit(record["verdict_why"], record["op"]) == "tripled_recurrent", record
    assert record["reason"].startswith(f"pytest_fla.report.verdicts.OtherKernelOff: {said}"), record


def _determinism_spec(op):
    from pytest_fla.api import Arg, Case, op_spec

    return op_spec("toy", op=op, reference=lambda x: 2 * x.double(), args={"x": Arg(("B", "T", "D"))},
                   cases=(Case("small", {"B": 2, "T": 5, "D": 8}),), grads=("x",), outputs=("y",), varlen=False)


def test_a_nondeterministic_output_is_told_where_and_by_how_much():
    """Two runs that differ: how many elements, the first in the layout's words, the largest difference."""
    import pytest
    import torch

    from pytest_fla.checks import generic

    calls = []

    def drifting(x):
        calls.append(1)
        y = 2 * x
        return y + torch.where(torch.arange(y.numel()).view(y.shape) == 13, 1e-3 * len(calls), 0.0)

    spec = _determinism_spec(drifting)
    with pytest.raises(AssertionError, match=r"toy: y differs between two identical runs: 1 of 80 elements, "
                                             r"the first at batch 0, token 1, channel 5, the largest difference 0\.001"):
        generic.check_deterministic(spec, spec.cases[0], "fp32", "cpu", 0)


def test_a_nan_in_the_same_place_with_the_same_bits_is_no_difference():
    """torch.equal counts every NaN as unequal; two runs alike bit for bit are deterministic."""
    import torch

    from pytest_fla.checks import generic

    def with_nan(x):
        y = 2 * x
        return torch.where(torch.arange(y.numel()).view(y.shape) == 3, float("nan"), y)

    spec = _determinism_spec(with_nan)
    generic.check_deterministic(spec, spec.cases[0], "fp32", "cpu", 0)  # raises nothing
