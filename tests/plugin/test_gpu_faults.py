"""Planted faults on a real GPU: memcheck finds the off-by-one read (only with the caching
allocator off), isolation contains an illegal address, and sm86 emulation refuses the
shared-memory overflow that sm90 runs. Skipped without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from plugin_testing import GPU, needs_gpu, run

from pytest_fla import sanitizer

pytestmark = needs_gpu
needs_sanitizer = pytest.mark.skipif(sanitizer.executable() is None, reason="compute-sanitizer is not on the PATH")

OFF_BY_ONE = '''
import torch
import faulty_kernels as fk

def test_copy_is_clean():
    x = torch.arange(1000.0, device="cuda")
    assert torch.equal(fk.copy(x), x)

def test_off_by_one_read():
    x = torch.arange(1000.0, device="cuda")
    y = fk.off_by_one_read(x)
    torch.cuda.synchronize()
    assert torch.equal(y[:-1], x[1:])  # the last element came from past the end: no check sees it
'''


@needs_sanitizer
def test_memcheck_catches_the_off_by_one_read(project):
    project.makepyfile(test_oob=OFF_BY_ONE)
    result = run(project, "--fla-sanitizer=memcheck", "-v")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "test_oob.py::test_copy_is_clean PASSED" in out
    assert "Invalid __global__ read of size 4 bytes" in out
    assert "shifted_copy_kernel" in out  # the kernel
    assert "faulty_kernels.py:" in out  # the source line
    assert "tl.load(x_ptr + offs + 1" in out


@needs_sanitizer
def test_the_read_is_invisible_with_the_caching_allocator(project):
    """Why the sanitizer run turns PyTorch's caching allocator off."""
    code = (
        "import torch, faulty_kernels as fk\n"
        "x = torch.arange(1000.0, device='cuda')\n"
        "fk.off_by_one_read(x); torch.cuda.synchronize()\n"
    )
    seen = {}
    for caching in (True, False):
        env = dict(__import__("os").environ, **sanitizer.environment(caching_allocator=caching))
        if caching:
            env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
        out = subprocess.run(
            sanitizer.command("memcheck") + [sys.executable, "-c", code],
            capture_output=True, text=True, env=env, cwd=project.path,
        ).stdout
        seen[caching] = sanitizer.parse("memcheck", out)
    assert seen[True].errors == 0, seen[True].describe()
    assert seen[False].errors and seen[False].errors > 0


EVERY_TOOL = '''
import torch
import faulty_kernels as fk

def test_clean_kernels():
    # a copy, a reduction across warps (Triton's own shared memory and barriers) and a
    # pipelined matmul: what every tool must pass
    x = torch.arange(1000.0, device="cuda")
    assert torch.equal(fk.copy(x), x)
    m = torch.randn(64, 1000, device="cuda")
    torch.testing.assert_close(fk.row_sums(m), m.sum(1), rtol=1e-4, atol=1e-3)
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(fk.shared_hungry_matmul(a, a).float(), a.float() @ a.float(), rtol=2e-2, atol=2e-1)

def test_planted_fault():
    # each passes plainly: only its tool sees the fault
    tool = "TOOL"
    if tool == "memcheck":
        fk.off_by_one_store(torch.arange(1000.0, device="cuda"))
    elif tool == "racecheck":
        fk.shared_memory_race(torch.arange(128, device="cuda", dtype=torch.int32))
    elif tool == "initcheck":
        fk.uninitialised_read(1000, "cuda")
    else:
        fk.divergent_barrier(torch.arange(32, device="cuda", dtype=torch.int32))
    torch.cuda.synchronize()
'''

# what each tool reports of its planted fault (the real tool's words)
PLANTED = {
    "memcheck": ("Invalid __global__ write of size 4 bytes", "shifted_store_kernel"),
    "racecheck": ("Race reported between Write access at racy_shared_kernel", "and Read access at racy_shared_kernel"),
    "initcheck": ("Uninitialized __global__ memory read of size 4 bytes", "copy_kernel"),
    "synccheck": ("Barrier error detected. Divergent thread(s) in warp.", "divergent_barrier_kernel"),
}


@needs_sanitizer
@pytest.mark.parametrize("tool", sorted(PLANTED))
def test_each_tool_reports_its_planted_fault_and_passes_clean_kernels(project, tool):
    project.makepyfile(test_planted=EVERY_TOOL.replace('"TOOL"', repr(tool)))
    result = run(project, f"--fla-sanitizer={tool}", "-v")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "test_planted.py::test_clean_kernels PASSED" in out
    assert "test_planted.py::test_planted_fault FAILED" in out
    assert f"compute-sanitizer {tool}:" in out
    assert all(text in out for text in PLANTED[tool]), out
    assert "did not finish" not in out and "ended without" not in out


ILLEGAL_ADDRESS = '''
import torch
import faulty_kernels as fk

def test_a_before():
    x = torch.ones(1000, device="cuda")
    assert torch.equal(fk.copy(x), x)

def test_b_illegal_address():
    y = torch.zeros(1000, device="cuda")
    fk.illegal_address(y)  # never synchronizes: the fault surfaces after the test

def test_c_after():
    x = torch.ones(1000, device="cuda")
    assert torch.equal(fk.copy(x), x)

def test_d_after():
    assert torch.ones(3, device="cuda").sum().item() == 3
'''


@pytest.mark.parametrize("granularity", ["test", "module"])
def test_isolation_contains_an_illegal_address(project, granularity):
    project.makepyfile(test_fault=ILLEGAL_ADDRESS)
    result = run(project, f"--fla-isolate={granularity}", "-v")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "test_fault.py::test_b_illegal_address FAILED" in out
    assert "illegal memory access" in out


def test_without_isolation_the_fault_takes_later_tests_down(project):
    project.makepyfile(test_fault=ILLEGAL_ADDRESS)
    result = run(project, "--fla-isolate=none", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) >= 2, result.stdout.str()


EMULATION = '''
import pytest, torch
import faulty_kernels as fk
from triton.runtime.errors import OutOfResources

def test_hungry_matmul():
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    c = fk.shared_hungry_matmul(a, a)
    torch.testing.assert_close(c.float(), a.float() @ a.float(), rtol=2e-2, atol=2e-1)
'''


@pytest.mark.skipif(GPU is None or GPU.arch != 90, reason="needs an sm90 GPU to emulate sm86 and run sm90 natively")
@pytest.mark.parametrize("arch,passes", [("sm86", False), ("sm80", True), ("sm90", True)])
def test_emulation_enforces_the_targets_shared_memory(project, arch, passes):
    project.makepyfile(test_emulated=EMULATION)
    result = run(project, f"--fla-arch={arch}")
    expected_mode = "native" if arch == "sm90" else "emulated"
    assert f"{arch}: {expected_mode}" in result.stdout.str()
    if passes:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        assert "OutOfResources" in result.stdout.str()
        assert "Required: 131072, Hardware limit: 101376" in result.stdout.str()


PIN_REPORT = '''
import os, pathlib, pytest, torch

@pytest.mark.parametrize("i", range(8))
def test_where_am_i(i):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    x = torch.ones(4, device="cuda")
    pathlib.Path(f"pin-{worker}-{i}.txt").write_text(
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')} {torch.cuda.device_count()} {x.device}")
'''


@pytest.mark.skipif(GPU is None or GPU.count < 2, reason="needs two GPUs: one xdist worker pinned to each")
def test_auto_runs_one_worker_per_gpu_each_pinned(project):
    project.makepyfile(test_pin=PIN_REPORT)
    result = run(project, "-n", "auto", "-v")
    result.assert_outcomes(passed=8)
    out = result.stdout.str()
    assert f"created: {GPU.count}/{GPU.count} workers" in out
    reports = {}
    for path in project.path.glob("pin-*.txt"):
        reports.setdefault(path.name.split("-")[1], set()).add(path.read_text())
    # every worker sees exactly one GPU, a different one, as cuda:0
    assert len(reports) == GPU.count, reports
    seen = [next(iter(r)) for r in reports.values()]
    assert all(len(r) == 1 for r in reports.values()), reports
    assert all(s.split()[1:] == ["1", "cuda:0"] for s in seen), seen
    assert len({s.split()[0] for s in seen}) == GPU.count, seen
