"""Every failure gets a verdict on the library (``pytest_fla.report.verdicts``): a defect
(wrong, out of bounds, a crash on a valid input), a contract rule it does not promise, or
its own refusal; only defects are findings. A toy library with one planted behaviour of
each kind runs through the plugin, and its report must class each failure as that kind."""

from __future__ import annotations

import json
import sys

import pytest

from plugin_testing import cpu_only, needs_gpu, run
from pytest_fla.report import verdicts

OPS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _copy(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)


def head(x, length=None):
    """y = the first `length` elements of the flat x (default: all), by a Triton kernel."""
    if length is not None and not 0 < length <= x.numel():
        raise ValueError(f"head: `length` = {length} must be in 1..{x.numel()}")
    n = x.numel() if length is None else length
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _copy[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    return y


def head_unchecked(x, length=None):
    """The planted defect: `length` past x's end is accepted, and the kernel reads past it."""
    n = x.numel() if length is None else length
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _copy[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    return y


def head_lenient(x, length=None):
    """Not a defect: a `length` past the end is clamped, never read past; only the contract's error is missing."""
    return head(x, None if length is None else min(length, x.numel()))


@triton.jit
def _copy_reading_one_past(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(x + offs, mask=offs <= n)  # one element past the end: never stored, so no output shows it
    tl.store(y + offs, values, mask=offs < n)


def head_reads_one_past(x, length=None):
    """The planted defect only a sanitizer sees: a read one element past x's end."""
    n = x.numel() if length is None else length
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _copy_reading_one_past[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    return y


def head_wrong_at_17(x, length=None):
    """The planted defect: element 17 of the output is off (only where there is one)."""
    y = head(x, length).clone()
    if y.numel() > 17:
        y[17] += 1.0
    return y


def head_reference(x, length=None):
    return x.double().flatten()[: x.numel() if length is None else length]


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return head(x)

    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError("head_forward_only has no backward")


def head_forward_only(x, length=None):
    return _NoBackward.apply(x) if length is None else head(x, length)


def head_wrong(x, length=None):
    return head(x, length) * 1.5
'''

CONFTEST = '''
from pytest_fla.api import Arg, Case, ErrorInput, op_spec, with_args
import toy_ops

ARGS = {"x": Arg(("B", "T", "D"))}
CASES = (Case("small", {"B": 1, "T": 4, "D": 8}),)

def errors(spec, device):
    kwargs = spec.sample(spec.cases[0], "fp32", device).kwargs
    yield ErrorInput("length_past_the_end", with_args(kwargs, length=kwargs["x"].numel() + 40), ValueError, "`length`")

def spec(name):
    # only the forward-only op declares a gradient: the others' kernel has no backward
    return op_spec(name, op=getattr(toy_ops, name), reference=toy_ops.head_reference, args=ARGS, cases=CASES,
                   grads=("x",) if name == "head_forward_only" else (), errors=errors, outputs=("y",), varlen=False)

def pytest_fla_specs(config):
    return [spec(name) for name in ("head", "head_unchecked", "head_lenient", "head_forward_only", "head_wrong")]
'''

TESTS = "from pytest_fla.conformance import *  # noqa: F401,F403\n"


@cpu_only
@pytest.mark.parametrize("memcheck", ["1", "0"], ids=["interpreter_memcheck", "guard_bands_only"])
def test_each_failure_is_classed_as_what_it_says_of_the_library(pytester, monkeypatch, memcheck):
    # with the interpreter's own bounds check off, the silent read past the end must be
    # found by the guard bands, as on a GPU without compute-sanitizer
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FLA_INTERPRETER_MEMCHECK", memcheck)
    pytester.makepyfile(toy_ops=OPS, conftest=CONFTEST, test_conformance=TESTS)
    report = pytester.path / "report.json"
    result = run(pytester, "-k", "forward or backward or error_inputs", f"--fla-report={report}")
    data = json.loads(report.read_text())
    failed = {(t["op"], t["check"]): t for t in data["tests"] if t["outcome"] == "failed"}
    verdict = {key: t["verdict"] for key, t in failed.items()}
    assert verdict.get(("head_unchecked", "error_inputs")) == "defect", failed.get(("head_unchecked", "error_inputs"))
    assert failed[("head_unchecked", "error_inputs")]["verdict_why"] == "out of bounds"
    assert verdict.get(("head_lenient", "error_inputs")) == "contract", failed.get(("head_lenient", "error_inputs"))
    assert verdict.get(("head_forward_only", "backward")) == "refused", failed.get(("head_forward_only", "backward"))
    assert verdict.get(("head_wrong", "forward")) == "defect"
    assert not any(key[0] == "head" for key in failed), [k for k in failed if k[0] == "head"]
    assert None not in verdict.values()
    assert data["verdicts"]["defect"] >= 2 and data["verdicts"]["contract"] >= 1 and data["verdicts"]["refused"] >= 1
    out = result.stdout.str()
    assert "failures by verdict:" in out and "defects in head_unchecked, head_wrong" in out
    assert "(D1)" in out and "(C1)" in out and "(R" in out  # the matrix cells say which kind each failure was


@needs_gpu
def test_a_compute_sanitizer_report_is_a_defect(pytester):
    """The real tool: a read one past the end that no output shows, found by memcheck's
    re-run of the passing forward check, is classed a defect from the tool's report."""
    conftest = CONFTEST.replace('for name in ("head", "head_unchecked", "head_lenient", "head_forward_only", "head_wrong")',
                                'for name in ("head_reads_one_past",)')
    pytester.makepyfile(toy_ops=OPS, conftest=conftest, test_conformance=TESTS)
    report = pytester.path / "report.json"
    run(pytester, "-k", "test_forward and fp32", "--fla-sanitizer=memcheck", f"--fla-report={report}")
    tests = json.loads(report.read_text())["tests"]
    forward = [t for t in tests if t["check"] == "forward" and t["outcome"] == "failed"]
    assert forward, [(t["nodeid"], t["outcome"]) for t in tests]
    assert all(t["verdict"] == "defect" for t in forward), [(t["verdict"], t["reason"]) for t in forward]


@cpu_only
def test_a_defect_is_saved_as_its_smallest_failing_call(pytester, monkeypatch):
    """--fla-repro-dir: the failing forward check is shrunk over its dims (B, T, D lowered
    while it still fails) and written as a reproducer, which fails while the defect is there
    and passes once the op is fixed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    conftest = CONFTEST.replace('CASES = (Case("small", {"B": 1, "T": 4, "D": 8}),)',
                                'CASES = (Case("small", {"B": 3, "T": 12, "D": 8}),)').replace(
        'for name in ("head", "head_unchecked", "head_lenient", "head_forward_only", "head_wrong")',
        'for name in ("head_wrong_at_17",)')
    pytester.makepyfile(toy_ops=OPS, conftest=conftest, test_conformance=TESTS)
    run(pytester, "-k", "test_forward and fp32", "--fla-repro-dir=tests/repro").assert_outcomes(failed=1)
    saved = pytester.path / "tests" / "repro" / "head_wrong_at_17_forward_fp32_small.py"
    text = saved.read_text()
    dims = eval(text.split("dims=")[1].split(", dist=")[0])  # noqa: S307 - the file this test's run wrote
    assert dims["B"] == 1 and 18 <= dims["B"] * dims["T"] * dims["D"] < 3 * 12 * 8, dims  # element 17 must exist
    assert "# expect: pass" in text and "# op: head_wrong_at_17" in text
    failing = pytester.run(sys.executable, "-m", "pytest_fla", "run-repro", str(saved), "--expect", "pass")
    assert failing.ret == 1 and "relative RMS error" in failing.stdout.str() + failing.stderr.str()
    fixed = pytester.path / "toy_ops.py"
    fixed.write_text(fixed.read_text().replace("y[17] += 1.0", "pass"))
    assert pytester.run(sys.executable, "-m", "pytest_fla", "run-repro", str(saved), "--expect", "pass").ret == 0


class _Info:
    """What ``of_exception`` reads of a ``pytest.ExceptionInfo``: the exception and its frames."""

    def __init__(self, value, paths):
        self.value = value
        self.traceback = [type("Entry", (), {"path": p})() for p in paths]


LIBRARY = "/site-packages/somelib/ops.py"
PLUGIN = str(verdicts.PLUGIN_ROOT / "checks" / "generic.py")
TORCH = "/site-packages/torch/nn/functional.py"


@pytest.mark.parametrize("exc, paths, expected", [
    (verdicts.ContractMismatch("the final state is torch.bfloat16, not float32"), [PLUGIN], "contract"),
    (AssertionError("chunk_gla: o: relative RMS error 0.9 > 0.01"), [PLUGIN], "defect"),
    (RuntimeError("Triton Error [CUDA]: invalid argument"), [PLUGIN, LIBRARY, "/site-packages/triton/x.py"], "defect"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), [PLUGIN, LIBRARY, TORCH], "defect"),
    (NotImplementedError("backward is not implemented"), [PLUGIN, LIBRARY], "refused"),
    (ValueError("head dim must be at most 256"), [PLUGIN, LIBRARY], "refused"),
    # a library installed in a virtual environment's site-packages is the library, not Python's own
    (ValueError("head dim must be at most 256"),
     [PLUGIN, f"{verdicts.STDLIB}/site-packages/somelib/ops.py"], "refused"),
    (ValueError("invalid literal"), [PLUGIN, LIBRARY, f"{verdicts.STDLIB}/json/decoder.py"], "refused"),
    (TypeError("f() got an unexpected keyword argument 'cu_seqlens_cpu'"), [PLUGIN], "contract"),
    (RuntimeError("shape mismatch in a torch op"), [PLUGIN, LIBRARY, TORCH], "defect"),
    (KeyError("gk"), [PLUGIN, str(verdicts.PLUGIN_ROOT / "specs" / "peer.py")], "harness"),
    (RuntimeError("CUDA out of memory. Tried to allocate 4 GiB"), [PLUGIN, LIBRARY, TORCH], "environment"),
    (ModuleNotFoundError("No module named 'einops'"), [PLUGIN, LIBRARY], "environment"),
    (RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn"),
     [PLUGIN, "/site-packages/torch/autograd/__init__.py"], "refused"),
    (type("InterpreterError", (RuntimeError,), {})("AttributeError(\"'int' object has no attribute 'to'\")"),
     [PLUGIN, LIBRARY, "/site-packages/triton/runtime/interpreter.py"], "environment"),
    (type("InterpreterError", (RuntimeError,), {})("OutOfBounds('_copy: read of 32 element(s) outside every tensor argument')"),
     [PLUGIN, LIBRARY, "/site-packages/triton/runtime/interpreter.py"], "defect"),
])
def test_the_verdict_of_an_exception(exc, paths, expected):
    assert verdicts.of_exception(_Info(exc, paths))[0] == expected


@pytest.mark.parametrize("message, expected", [
    ("the test process stopped (exit -11) while running this test", "defect"),
    ("Failed: DID NOT RAISE <class 'ValueError'>", "contract"),
    ("2 byte(s) changed past the end of input `x`", "defect"),
    ("chunk_gla: do were never written (still NaN from the poisoned allocation)", "defect"),
    ("compute-sanitizer memcheck: 2 error(s)\n  Invalid __global__ read of size 4 bytes", "defect"),
    ("compute-sanitizer racecheck gave up waiting for the program to connect (--launch-timeout)", "environment"),
    ("worker 'gw3' crashed while running 'tests/test_conformance.py::test_forward[x]'", "defect"),
])
def test_the_verdict_of_a_message_alone(message, expected):
    assert verdicts.from_message(message)[0] == expected


@pytest.mark.parametrize("what, why", [
    ("does not compile: CompilationError: at 31:8:\n      caused by AssertionError: Loop-carried variable b_x "
     "has initial type <['64', '16'], bf16> but is re-assigned to <['64', '16'], fp32>", "does not compile for the arch"),
    ("needs 262144 bytes of shared memory, over sm90's limit of 232448", "over the arch's limits (a launch it refuses)"),
    ("1024 threads per block, over 1024", "over the arch's limits (a launch it refuses)"),
    ("grid axis 1 is 65538, over CUDA's limit of 65535", "launch refused on a valid input"),
])
def test_a_compile_checks_problem_is_a_defect_that_says_which(what, why):
    """The compile checks' failures (``checks.capture``: what a card would refuse, found
    offline), as the check raises them: each a defect, with why."""
    from pytest_fla.checks.capture import CompileCheckFailed

    message = f"1 problem(s) for sm90:\n  _fwd_kernel(BK=64, num_warps=4, num_stages=2) [d128 bf16 fwd]: {what}"
    exc = CompileCheckFailed(message)
    assert verdicts.of_exception(_Info(exc, [PLUGIN])) == ("defect", why)


def test_fp32_at_tf32_precision_is_a_contract_failure_and_past_fp16_a_defect():
    """An fp32 result with tf32 products (fp16's significand) fails the fp32 limits and
    stays within fp16's: the peer library's chunked kernels by design, a rule of this
    repository's contract. Past the fp16 limits it is wrong at any product precision."""
    import torch

    from pytest_fla.checks.tolerance import assert_close

    ref = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for rel, expected in ((3e-4, verdicts.ContractMismatch), (3e-2, AssertionError)):
        noise = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        out = (ref + rel * noise * ref.norm() / noise.norm()).float()
        with pytest.raises(AssertionError) as raised:
            assert_close("o", out, ref, "fp32")
        assert type(raised.value) is expected, raised.value
        verdict = verdicts.of_exception(_Info(raised.value, [PLUGIN]))[0]
        assert verdict == ("contract" if expected is verdicts.ContractMismatch else "defect")
    with pytest.raises(AssertionError) as raised:  # bf16 at the same error: no such excuse
        assert_close("o", (ref * (1 + 0.1 * torch.sign(ref))).to(torch.bfloat16), ref, "bf16")
    assert type(raised.value) is AssertionError
