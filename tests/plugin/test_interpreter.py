"""The interpreter shortcut (pytest_fla/targets/interpreter.py): a helper call inside a launch
reuses the launch's patched ``triton.language`` instead of patching it again. Each check
runs a small program under ``TRITON_INTERPRET=1`` in a fresh process, with and without
the shortcut: the answers must agree, Triton's own patching must happen once per launch
(and once for the first helper that sees ``triton.language.core``), and ``triton.language``
must be left as Triton's own patching leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROGRAM = r'''
import json, os, sys
import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from pytest_fla.targets.interpreter import skip_repeated_patching

calls = []  # Triton's own patching, by the function it was for
patch = interpreter._patch_lang
def counting(fn):
    calls.append(fn.__name__)
    return patch(fn)
interpreter._patch_lang = counting
installed = skip_repeated_patching()  # on top of the counting


@triton.jit
def scaled(x, factor):
    return x * factor


@triton.jit
def row_sums_kernel(x_ptr, out_ptr, N: tl.constexpr, STEPS: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, N)
    acc = tl.zeros([N], dtype=tl.float32)
    for step in range(STEPS):
        acc += scaled(tl.load(x_ptr + row * N + offs), step + 1.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0) + tl.cdiv(N, 3))


x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
results = []
for launch in range(2):
    out = torch.empty(3)
    calls.clear()
    row_sums_kernel[(3,)](x, out, N=8, STEPS=4)
    results.append({"out": out.tolist(), "patches": list(calls)})
    if launch == 0:  # a helper called from the host, outside any launch, between the two
        host = scaled(2.0, 3.0)
print(json.dumps({
    "installed": installed,
    "launches": results,
    "host": host,
    # what is left interpreted afterwards (Triton never puts back what a helper call patched)
    "left_patched": {name: sorted(n for n, member in vars(module).items() if callable(member)
                                  and getattr(member, "__name__", "") == "<lambda>")
                     for name, module in (("tl", tl), ("tl.core", tl.core))},
}))
'''


def _run(shortcut: bool) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", FLA_INTERPRETER_REPATCH="0" if shortcut else "1")
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def with_and_without():
    return _run(True), _run(False)


def test_same_answers_with_and_without_the_shortcut(with_and_without):
    fast, plain = with_and_without
    assert fast["installed"] and not plain["installed"]
    expected = [sum(v * (s + 1.0) for s in range(4) for v in range(8 * r, 8 * r + 8)) + 3 for r in range(3)]
    for run in (fast, plain):
        assert [launch["out"] for launch in run["launches"]] == [expected, expected]
        assert run["host"] == 6.0
    assert fast["left_patched"] == plain["left_patched"]


def test_triton_patches_once_per_launch_not_per_helper_call(with_and_without):
    fast, plain = with_and_without
    for launch in fast["launches"]:
        # the launch, then tl.zeros (the first helper that sees triton.language.core); not
        # the helper of each of 3 programs x 4 steps, nor tl.sum and tl.cdiv after tl.zeros
        assert launch["patches"] == ["row_sums_kernel", "zeros"]
    for launch in plain["launches"]:
        assert launch["patches"].count("scaled") == 12
        assert len(launch["patches"]) == 1 + 3 * (1 + 4 + 2)  # the launch; per program zeros, 4 x scaled, sum, cdiv


RUNTIME_LOOP = '''
import warnings

import pytest
import torch
import triton
import triton.language as tl


@triton.jit
def running_sum(x, out, n):
    acc = 0.0
    for i in range(n):  # a bound the kernel is given: the interpreter calls its __index__
        acc += tl.load(x + i)
    tl.store(out, acc)


def call():
    x, out = torch.arange(5, dtype=torch.float32), torch.zeros(1)
    running_sum[(1,)](x, out, 5)
    return out


def test_loop_over_a_runtime_bound():
    assert call().item() == 10.0


def test_the_interpreter_still_warns_outside_the_filter():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    if not any("ndim > 0 to a scalar" in str(w.message) for w in seen):
        pytest.skip("this Triton and numpy raise no such warning: nothing for the filter to hide")


def test_the_same_deprecation_from_elsewhere_still_shows():
    import numpy as np
    try:
        int(np.array([3]))
    except TypeError:  # numpy >= 2.4: the deprecation became an error
        pytest.skip("this numpy raises instead of warning: nothing for the filter to hide")
'''


def test_the_interpreters_numpy_deprecation_is_filtered_and_no_other(pytester, monkeypatch):
    """Under the interpreter the plugin hides numpy's scalar-conversion DeprecationWarning
    when Triton's interpreter raises it (a loop bound), and only there: the same warning
    from the test's own code is still reported."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytester.makepyfile(test_loop=RUNTIME_LOOP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-rs", timeout=300)
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 3 and "failed" not in outcomes, out
    assert "triton/runtime/interpreter.py" not in out, out  # the interpreter's own: filtered
    if "nothing for the filter to hide" not in out:
        assert outcomes.get("warnings") == 1 and "test_loop.py" in out, out  # the test's own: kept
