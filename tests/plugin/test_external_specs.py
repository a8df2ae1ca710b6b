"""Another repository's ops through the plugin: specs registered from its conftest.py
with the ``pytest_fla_specs`` hook, the generic checks imported into one test module,
the report, and the NaN-poisoning of its own allocations (``fla_poison``)."""

from __future__ import annotations

import json

from plugin_testing import cpu_only, run

OPS = '''
import torch

def scale(x, w, alpha=2.0):
    """y = alpha * w * x, x [B, T, D], w [D], written into a fresh buffer."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"scale: `x` must be a float32/16 or bfloat16 tensor, got dtype {getattr(x, 'dtype', None)}")
    if x.dim() != 3:
        raise ValueError(f"scale: `x` must be [B, T, D], got shape {tuple(x.shape)}")
    if w.device != x.device:
        raise ValueError(f"scale: `w` is on {w.device}, `x` on {x.device}")
    y = torch.empty_like(x)
    y.copy_(x * w * alpha)
    return y

def scale_forgets_the_last_token(x, w, alpha=2.0):
    """The planted bug: the last token's output is never written."""
    y = torch.empty_like(x)
    y[:, :-1] = x[:, :-1] * w * alpha
    return y

def scale_reference(x, w, alpha=2.0):
    return alpha * w.double() * x.double()
'''

CONFTEST = '''
from pytest_fla.api import Arg, Case, ErrorInput, dtype_errors, op_spec, with_args
import toy_ops

ARGS = {"x": Arg(("B", "T", "D")), "w": Arg(("D",), "positive")}
CASES = (Case("small", {"B": 2, "T": 5, "D": 8}), Case("alpha", {"B": 1, "T": 3, "D": 4}, options={"alpha": 0.5}))

def scale_errors(spec, device):
    kwargs = spec.sample(spec.cases[0], "fp32", device).kwargs
    yield from dtype_errors(kwargs, "x")
    yield ErrorInput("x_2d", with_args(kwargs, x=kwargs["x"][0]), ValueError, "`x`.*shape")

def pytest_fla_specs(config):
    return [
        op_spec("scale", op=toy_ops.scale, reference=toy_ops.scale_reference, args=ARGS, cases=CASES,
                grads=("x",), errors=scale_errors, outputs=("y",), varlen=False),
        op_spec("scale_forgets_the_last_token", op=toy_ops.scale_forgets_the_last_token,
                reference=toy_ops.scale_reference, args=ARGS, cases=CASES[:1], outputs=("y",), varlen=False),
    ]
'''

TESTS = "from pytest_fla.conformance import *  # noqa: F401,F403\n"


def project(pytester):
    pytester.makepyfile(toy_ops=OPS, conftest=CONFTEST, test_conformance=TESTS)
    return pytester


@cpu_only
def test_a_repository_registers_its_specs_and_gets_the_checks(pytester):
    project(pytester)
    report = pytester.path / "report.json"
    result = run(pytester, "-v", "-rs", f"--fla-report={report}")
    out = result.stdout.str()
    for passed in ("test_forward[scale-fp32-small]", "test_backward[scale-fp16-alpha]", "test_error_inputs[scale-x_2d]",
                   "test_error_inputs[scale-x_float64]", "test_device_mismatch[scale-w]", "test_every_output_written[scale]"):
        assert f"{passed} PASSED" in out, passed
    # the planted bug: caught by torch.empty poisoning (the default), and nowhere else
    assert "test_every_output_written[scale_forgets_the_last_token] FAILED" in out
    assert "were never written" in out
    assert "test_forward[scale_forgets_the_last_token-fp32-small] PASSED" not in out  # NaN where finite expected
    matrix = json.loads(report.read_text())["matrix"]["interpreter"]
    assert matrix["scale"]["forward"]["failed"] == 0 and matrix["scale"]["forward"]["passed"] >= 4
    assert matrix["scale_forgets_the_last_token"]["every_output_written"]["failed"] == 1


@cpu_only
def test_a_flag_of_the_library_is_poisoned_instead_of_torch(pytester):
    project(pytester)
    pytester.makepyfile(alloc='POISON = False\n')
    pytester.makeini("[pytest]\nfla_poison = alloc:POISON\n")
    pytester.makepyfile(test_flag='''
import pytest
import alloc, torch

@pytest.mark.fla_op("scale")
def test_flag_set_and_torch_left_alone():
    assert alloc.POISON
    assert torch.empty_like.__module__ != "pytest_fla.checks.poison"

def test_not_an_op_test():
    assert torch.empty_like.__module__ != "pytest_fla.checks.poison"
''')
    result = run(pytester, "-v", "test_flag.py")
    result.assert_outcomes(passed=2)
    pytester.makeini("[pytest]\nfla_poison = alloc\n")
    assert "neither `torch` nor `package.module:FLAG`" in run(pytester, "test_flag.py").stderr.str()


@cpu_only
def test_a_check_no_spec_gives_a_test_is_not_collected(pytester):
    """The toy specs take no state, name no agreeing op and no varlen: those checks have no
    parameters, and are left out instead of collected as one empty-parameter-set skip."""
    project(pytester)
    result = run(pytester, "--collect-only", "-q")
    assert result.ret == 0, result.stdout.str()
    ids = [line for line in result.stdout.lines if "::" in line]
    assert any("test_forward[scale-fp32-small]" in i for i in ids), ids
    for absent in ("test_state_dtype", "test_chunk_vs_recurrent", "test_varlen", "test_no_host_sync"):
        assert not any(f"::{absent}" in i for i in ids), absent
    assert "NOTSET" not in result.stdout.str()
    skips = run(pytester, "-q", "-rs", "-k", "not (backward or forward or bounds or error or mismatch)")
    assert "got empty parameter set" not in skips.stdout.str(), skips.stdout.str()


@cpu_only
def test_specs_of_one_name_are_a_usage_error(pytester):
    project(pytester)
    pytester.makeconftest(CONFTEST + '''
_first = pytest_fla_specs
def pytest_fla_specs(config):
    return _first(config) + _first(config)[:1]
''')
    result = run(pytester)
    assert "two op specs are named 'scale'" in result.stderr.str() + result.stdout.str()
    assert result.ret != 0


@cpu_only
def test_ops_option_and_no_checks_without_the_import(pytester):
    project(pytester)
    result = run(pytester, "-q", "--fla-ops=scale_forgets_the_last_token", "-k", "forward")
    outcomes = result.parseoutcomes()  # bf16 is skipped under Triton < 3.8's interpreter
    assert outcomes["failed"] >= 2 and "passed" not in outcomes, outcomes
    (pytester.path / "test_conformance.py").unlink()
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    run(pytester, "-q").assert_outcomes(passed=1)


@cpu_only
def test_an_isolated_test_runs_the_implementation_the_session_chose(pytester):
    """--fla-impl reaches the child processes of --fla-isolate: their tests have the same
    ids whichever implementation the specs call."""
    project(pytester)
    pytester.makeconftest(CONFTEST + '''
_first = pytest_fla_specs
def pytest_fla_specs(config):
    good, buggy = _first(config)
    import dataclasses
    return [dataclasses.replace(good, op=buggy.op) if config.getoption("fla_impl") == "buggy" else good]
''')
    args = ("-q", "--fla-isolate=test", "-k", "every_output_written")
    run(pytester, *args).assert_outcomes(passed=1)
    run(pytester, *args, "--fla-impl=buggy").assert_outcomes(failed=1)


SLOW_PARTS = '''
import time
from pytest_fla.api import Arg, Case, make_factory, op_spec
import toy_ops

ARGS = {"x": Arg(("B", "T", "D")), "w": Arg(("D",), "positive")}
draw = make_factory(ARGS)

def slow_draw(*args):
    time.sleep(0.2)
    return draw(*args)

def slow_reference(x, w, alpha=2.0):
    time.sleep(0.1)
    return toy_ops.scale_reference(x, w, alpha)

def pytest_fla_specs(config):
    return [op_spec("scale", op=toy_ops.scale, reference=slow_reference, args=ARGS, factory=slow_draw,
                    cases=(Case("small", {"B": 2, "T": 5, "D": 8}),), outputs=("y",), varlen=False)]
'''


@cpu_only
def test_the_report_splits_the_time_of_tests_run_in_their_worker(pytester):
    """Without isolation too, a report says what a test's time went to: here its inputs
    (a 0.2 s draw) and its float64 reference (0.1 s a call)."""
    pytester.makepyfile(toy_ops=OPS, conftest=SLOW_PARTS, test_conformance=TESTS)
    report = pytester.path / "report.json"
    result = run(pytester, "-k", "test_forward and fp32", f"--fla-report={report}")
    result.assert_outcomes(passed=1)
    (test,) = json.loads(report.read_text())["tests"]
    assert test["process_seconds"] is None  # run in the worker, not a child
    assert test["parts_seconds"]["inputs"] >= 0.2 and test["parts_seconds"]["reference"] >= 0.1
    assert test["parts_seconds"]["inputs"] + test["parts_seconds"]["reference"] <= test["duration"]
    assert "tests run in their workers:" in result.stdout.str() and "drawing inputs" in result.stdout.str()


@cpu_only
def test_the_library_switches_named_in_the_ini_are_set_by_their_checks(pytester):
    """A library's switches (``checks.switches``): each flag True only inside its check,
    the cache function called, torch's allocators zeroed for opcheck by default."""
    project(pytester)
    pytester.makepyfile(lib='CAPTURING = False\nTHROUGH = False\nCLEARED = []\n'
                            'def clear():\n    CLEARED.append(1)\n')
    pytester.makeini("[pytest]\nfla_capturing_launches = lib:CAPTURING\nfla_clear_caches = lib:clear\n"
                     "fla_through_custom_ops = lib:THROUGH\n")
    pytester.makepyfile(test_switches='''
import math
import lib, torch
from pytest_fla.checks import poison, switches

def test_flags():
    assert not lib.CAPTURING
    with switches.flags_set(switches.CAPTURING_LAUNCHES):
        assert lib.CAPTURING and not lib.THROUGH
    assert not lib.CAPTURING
    switches.call_each(switches.CLEAR_CACHES)
    assert lib.CLEARED == [1]

def test_zeroed_inside_the_poison():
    with poison.poisoned(("torch",)):
        assert math.isnan(torch.empty(3)[0])
        with poison.zeroed():
            assert torch.empty(3).eq(0).all() and torch.empty_like(torch.ones(2)).eq(0).all()
''')
    run(pytester, "-v", "test_switches.py").assert_outcomes(passed=2)
    pytester.makeini("[pytest]\nfla_capturing_launches = torch\n")
    assert "fla_capturing_launches: 'torch' is not `package.module:FLAG`" in run(pytester, "test_switches.py").stderr.str()
