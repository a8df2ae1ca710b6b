"""Compile-only targets on this machine: the planted shared-memory overflow fails for sm86
and passes for sm90, grid limits are checked, numeric tests skip with the reason, and the
report says so per arch (text and JSON)."""

from __future__ import annotations

import json

from plugin_testing import cpu_only, run

PROJECT = '''
import pytest, torch
import faulty_kernels as fk
from pytest_fla.checks.capture import assert_compiles, capture_launches, check_launches
from pytest_fla.targets import ALL_ARCHS

def per_arch(op):
    return [pytest.param(a, id=f"sm{a}", marks=[pytest.mark.fla_op(op), pytest.mark.fla_compile(f"sm{a}")])
            for a in ALL_ARCHS]

@pytest.mark.parametrize("arch", per_arch("hungry_matmul"))
def test_compile(arch):
    a = torch.randn(256, 256, dtype=torch.float16)
    with capture_launches(arch) as recorder:
        fk.shared_hungry_matmul(a, a)
    assert_compiles(recorder.launches, arch)

@pytest.mark.parametrize("arch", per_arch("copy"))
def test_grid(arch):
    x = torch.zeros(128 * 70000)
    with capture_launches(arch) as recorder:
        fk.copy_kernel[(1, 70000)](x, x, x.numel(), BLOCK=128)
    problems = [str(p) for p in check_launches(recorder.launches, arch).problems]
    assert problems == ["copy_kernel(BLOCK=128, num_warps=4, num_stages=3): grid axis 1 is 70000, over CUDA's limit of 65535"]

@pytest.mark.fla_op("copy")
def test_forward():
    x = torch.arange(300.0)
    assert torch.equal(fk.copy(x), x)
'''


@cpu_only
def test_shared_memory_overflow_fails_sm86_only(project):
    project.makepyfile(test_project=PROJECT)
    result = run(project, "--fla-arch=sm86,sm90", "--fla-report=report.json", "-rs")
    out = result.stdout.str()
    assert "sm86: compile-only - no GPU here" in out
    assert "needs 131072 bytes of shared memory, over sm86's limit of 101376" in out
    result.assert_outcomes(passed=4, failed=1, skipped=2)  # 2 skipped: test_forward in each compile-only worker
    assert "runs kernels; sm86 is compile-only here" in out
    report = json.loads((project.path / "report.json").read_text())
    assert {a["name"]: a["mode"] for a in report["archs"]} == {
        "interpreter": "interpreter", "sm86": "compile-only", "sm90": "compile-only"}
    outcomes = {(t["op"], t["check"], t["arch"]): t["outcome"] for t in report["tests"]}
    assert outcomes[("hungry_matmul", "compile", "sm86")] == "failed"
    assert outcomes[("hungry_matmul", "compile", "sm90")] == "passed"
    assert outcomes[("copy", "grid", "sm86")] == "passed"
    assert outcomes[("copy", "forward", "interpreter")] == "passed"
    assert outcomes[("copy", "forward", "sm90")] == "skipped"
    assert ("hungry_matmul", "compile", "interpreter") not in outcomes  # runs in its arch's worker only
    assert report["matrix"]["sm86"]["hungry_matmul"]["compile"] == {"passed": 0, "failed": 1, "skipped": 0,
                                                                 "verdicts": {"defect": 1}}
    assert all(t["duration"] >= 0 for t in report["tests"])
    reasons = {(t["op"], t["check"], t["arch"]): t["reason"] for t in report["tests"]}
    assert "needs 131072 bytes of shared memory" in reasons[("hungry_matmul", "compile", "sm86")]
    assert "runs kernels; sm90 is compile-only here" in reasons[("copy", "forward", "sm90")]
    assert reasons[("hungry_matmul", "compile", "sm90")] is None
    assert all(t["process_seconds"] is None for t in report["tests"])  # nothing ran isolated


def test_compile_error_text_names_the_innermost_cause():
    """Triton wraps the real error in a CompilationError per inlined function; the problem
    line must reach it (the first line alone, "at 12:16:", says nothing)."""
    from pytest_fla.checks.capture import compile_error_text

    try:
        try:
            try:
                raise ValueError("s is already defined. constexpr cannot be reassigned.")
            except ValueError as e:
                raise RuntimeError("at 9:24:\n    s: tl.constexpr = 1 << level\n    ^") from e
        except RuntimeError as e:
            raise RuntimeError("at 12:16:\n    carry = backward_chunk(...)\n    ^") from e
    except RuntimeError as outer:
        text = compile_error_text(outer)
    assert text.startswith("RuntimeError: at 12:16:")
    assert "backward_chunk" in text
    assert "constexpr cannot be reassigned" in text


SCOPE_PROJECT = '''
import pytest, torch
import faulty_kernels as fk
from pytest_fla.checks.capture import check_launches, capture_launches

@pytest.mark.fla_compile("sm80")
def test_scopes():
    x32, x16 = torch.zeros(256), torch.zeros(256, dtype=torch.float16)
    with capture_launches(80) as recorder:
        fk.copy_kernel[(4,)](x32, x32, 256, BLOCK=64)
        fk.copy_kernel[(2,)](x32, x32, 256, BLOCK=128)
        fk.copy_kernel[(1, 70000)](x16, x16, 256, BLOCK=64)
    every = check_launches(recorder.launches, 80)
    per_kernel = check_launches(recorder.launches, 80, per_kernel=True)
    assert (every.compiled, per_kernel.compiled) == (3, 2)  # per kernel: one fp32, one fp16 launch
    # the grid is checked on every launch either way
    assert [str(p) for p in per_kernel.problems] == [str(p) for p in every.problems]
    assert len(every.problems) == 1 and "grid axis 1 is 70000" in str(every.problems[0])
'''


@cpu_only
def test_kernel_scope_compiles_each_kernel_once_per_dtype(project):
    """--fla-compile-scope=kernels: each kernel's first launch per pointer type, not every
    specialisation; the grid limits still apply to all of them."""
    project.makepyfile(test_project=SCOPE_PROJECT)
    result = run(project, "--fla-arch=sm80")
    result.assert_outcomes(passed=1)


DRIVER_PROJECT = '''
import pytest, torch
from triton.runtime import driver
import faulty_kernels as fk
from pytest_fla.checks.capture import capture_launches

@pytest.mark.fla_compile("sm90")
def test_a_grid_sized_by_the_sm_count():
    x = torch.zeros(128)
    with capture_launches(90) as recorder:
        active = driver.active
        sms = active.utils.get_device_properties(active.get_current_device())["multiprocessor_count"]
        assert active.get_current_target().arch == 90
        fk.copy_kernel[(sms,)](x, x, x.numel(), BLOCK=128)  # a persistent kernel's grid: a program per SM
    assert [launch.grid for launch in recorder.launches] == [(132, 1, 1)]  # an H100 SXM's SMs
    with pytest.raises(RuntimeError, match="0 active drivers"):
        driver.active  # afterwards as before: no GPU driver here
'''


@cpu_only
def test_launches_captured_without_a_gpu_driver_see_the_arch_s_reference_card(project):
    """A library that sizes its grid by the GPU's SM count (Triton's driver) asks it in the
    middle of its call; with no GPU driver here, capture answers as the arch's reference card
    would (``arch_table.REFERENCE_CARD``), and only while it captures."""
    project.makepyfile(test_project=DRIVER_PROJECT)
    result = run(project, "--fla-arch=sm90")
    result.assert_outcomes(passed=1)
