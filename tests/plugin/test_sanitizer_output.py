"""Reading compute-sanitizer's output: findings, the error summary, and programs that
never call CUDA (compile-only checks), which the tool reports without a summary."""

from __future__ import annotations

from pytest_fla import sanitizer

CLEAN = """\
========= COMPUTE-SANITIZER
some program output
========= ERROR SUMMARY: 0 errors
"""

ONE_READ = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at shifted_copy_kernel+0x1f0 in /p/faulty_kernels.py:31
=========     by thread (999,0,0) in block (0,0,0)
=========     Address 0x7f0000000fa0 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""

NO_CUDA = """\
========= COMPUTE-SANITIZER
sm90: 1 launches, 1 distinct kernels compiled
passed, as expected
========= Error: Target application terminated before first instrumented API call
"""

CUT_SHORT = """\
========= COMPUTE-SANITIZER
half of a program's output
"""

# What compute-sanitizer 2025.2 prints when the program has not connected within
# --launch-timeout (its own text, from the tool's binary); the program then waits for ever.
GAVE_UP = """\
========= COMPUTE-SANITIZER
========= Error: No attachable process found. compute-sanitizer timed-out.
========= Default timeout can be adjusted with --launch-timeout. Awaiting target completion.
"""


def test_a_clean_run():
    result = sanitizer.parse("memcheck", CLEAN)
    assert result.clean and result.summary == 0 and not result.untouched


def test_a_finding_names_kernel_access_and_line():
    result = sanitizer.parse("memcheck", ONE_READ)
    assert not result.clean and result.summary == 1
    text = result.describe()
    assert "Invalid __global__ read of size 4 bytes" in text and "faulty_kernels.py:31" in text


def test_a_program_without_cuda_calls_is_clean_and_says_so():
    result = sanitizer.parse("memcheck", NO_CUDA)
    assert result.untouched and result.clean and not result.findings
    assert "made no CUDA call" in result.describe()


def test_a_run_cut_short_is_not_clean():
    result = sanitizer.parse("memcheck", CUT_SHORT)
    assert not result.clean and result.summary is None
    assert "did not finish" in result.describe()


def test_no_cuda_call_does_not_excuse_findings():
    result = sanitizer.parse("memcheck", ONE_READ.replace("========= ERROR SUMMARY: 1 error\n", "") + NO_CUDA)
    assert not result.clean


def test_each_xdist_worker_gets_ports_of_its_own():
    """The tool and its program meet on a TCP port from a range: workers sharing the default
    ten ports waited at their first test on the H100 (pytest_fla/sanitizer.py)."""
    first, count = sanitizer.port_range("gw0", offset=0)
    assert (first, count) == (49152, 32)
    ranges = [sanitizer.port_range(f"gw{n}", offset=0) for n in range(64)]
    spans = sorted((start, start + n) for start, n in ranges)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # disjoint
    assert all(49152 <= start and start + n <= 65536 for start, n in ranges)
    assert sanitizer.port_range("", offset=0) == (49152, 32)  # no xdist: the first block
    assert sanitizer.port_range("gw1", offset=16) == sanitizer.port_range("gw17", offset=0)
    blocks = (65536 - 49152) // 32
    assert sanitizer.port_range(f"gw{blocks}", offset=0) == (49152, 32)  # wraps inside the range



def test_a_tool_that_gave_up_waiting_is_not_clean_and_says_why():
    result = sanitizer.parse("memcheck", GAVE_UP)
    assert result.gave_up and not result.clean and not result.findings
    assert "gave up waiting for the program to connect (--launch-timeout): nothing was checked" in result.describe()
