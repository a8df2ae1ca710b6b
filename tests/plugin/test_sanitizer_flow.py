"""--fla-sanitizer end to end on any machine: a stand-in ``compute-sanitizer`` on the PATH
runs the program it is given and prints what the real tool printed in the recorded
transcripts (sanitizer_transcripts/: each tool's banner, its report of its planted fault,
its own summary line, its lines on a program that failed or was killed). What is checked is
the plugin's part: each test re-run in a subprocess under the tool, with the allocator cache
off and blocking launches, a finding failing the test with its kernel, access and line, and
a clean run passing it. The real tool on the planted faults: test_gpu_faults.py."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from plugin_testing import run

TRANSCRIPTS = Path(__file__).parent / "sanitizer_transcripts"

STAND_IN = r'''#!/usr/bin/env python3
import os, re, signal, subprocess, sys
from pathlib import Path

TRANSCRIPTS = Path(os.environ["FAKE_SANITIZER_TRANSCRIPTS"])
# each tool's planted fault, as recorded (benchmarks/sanitizer_transcripts.py)
FAULT = {"memcheck": "oob_read", "racecheck": "shared_race", "initcheck": "uninitialised_read",
         "synccheck": "divergent_barrier"}

def recorded(tool, scenario):
    return (TRANSCRIPTS / f"{tool}-{scenario}.stdout").read_text().splitlines()

def first_report(tool):
    """The first report of the tool's planted-fault run, up to its blank line."""
    lines = recorded(tool, FAULT[tool])[1:]
    return lines[:lines.index("========= ")]

def summary(tool, errors):
    """The tool's own summary line, as recorded, with this run's count."""
    line = next(l for l in recorded(tool, "clean") if "SUMMARY" in l)
    if tool == "racecheck":
        return (f"========= RACECHECK SUMMARY: {errors} hazard{'s' if errors != 1 else ''} displayed "
                f"({errors} error{'s' if errors != 1 else ''}, 0 warnings)")
    return re.sub(r"\d+ errors?$", f"{errors} error{'s' if errors != 1 else ''}", line)

args = sys.argv[1:]
if args == ["--help"]:
    print("  --tool arg            memcheck, racecheck, initcheck or synccheck")
    print("  --target-processes arg    application-only or all")
    print("  --check-device-heap arg   yes or no")
    print("  --max-connections arg (=10)   Maximum number of ports for connecting to target application")
    print("  --port arg (=49152)           Base port for connecting to target application")
    print("  --launch-timeout arg          Timeout in seconds to wait to connect to the target process.")
    sys.exit(0)
tool, options = None, []
while args and args[0].startswith("--"):  # every option the plugin passes takes a value
    if args[0] == "--tool":
        tool = args[1]
    options += args[:2]
    args = args[2:]
with open(os.environ["FAKE_SANITIZER_LOG"], "a") as log:
    log.write(f"{tool} {os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING')} {os.environ.get('CUDA_LAUNCH_BLOCKING')}\n")
with open(os.environ["FAKE_SANITIZER_LOG"] + ".options", "a") as log:
    log.write(" ".join(options) + "\n")
print(recorded(tool, "clean")[0], flush=True)  # the banner
code = subprocess.call(args, env=dict(os.environ, FAKE_UNDER_TOOL="1", FAKE_TOOL=tool))
errors = 0
inline = os.environ["FAKE_SANITIZER_FINDING"] + ".inline"  # reports the program printed as it ran
if os.path.exists(inline):
    errors = len(open(inline).read().split())
    os.remove(inline)
if os.path.exists(os.environ["FAKE_SANITIZER_FINDING"]):
    os.remove(os.environ["FAKE_SANITIZER_FINDING"])  # one report per run that caused one
    print("\n".join(first_report(tool) + ["========= "]))
    errors += 1
# how the real tool ends a program that failed or was killed: two lines of its own, then
# the summary, and the program's exit status (a signal's number) as its own
if code:
    ending = recorded(tool, "killed_by_signal" if code < 0 else "exit_status_3")
    print("\n".join(line for line in ending if "terminate" in line or "returned an error" in line))
print(summary(tool, errors))
sys.exit(-code if code < 0 else code)
'''

PROJECT = '''
import os

import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def launch():
    # on the CPU machine the plugin runs kernels under the interpreter; on a GPU, on the GPU
    x = torch.arange(4.0, device="cuda" if torch.cuda.is_available() else "cpu")
    y = torch.empty_like(x)
    copy_kernel[(1,)](x, y, 4, BLOCK=4)
    assert torch.equal(x, y)


def under_tool(name):
    if os.environ.get("FAKE_UNDER_TOOL"):
        with open(os.environ["FAKE_SANITIZER_LOG"] + ".tests", "a") as f:
            f.write(name + "\\n")
        return True
    return False

def test_clean():
    launch()
    under_tool("test_clean")

def test_reads_past_the_end():
    launch()
    # under the tool, leave the file that makes the stand-in report a finding
    if under_tool("test_reads_past_the_end"):
        open(os.environ["FAKE_SANITIZER_FINDING"], "w").close()

def test_fails_plainly():
    launch()
    under_tool("test_fails_plainly")
    assert 1 == 2

def test_no_kernel():
    # an argument check that raises before any launch: nothing to sanitize
    under_tool("test_no_kernel")
'''


# the project's kernel, its helpers and test_clean: the start of a project of one's own
KERNEL_AND_CLEAN_TEST = PROJECT.split("def test_reads_past_the_end")[0]
MODULE_BATCHES = ("--fla-sanitizer=memcheck", "--fla-isolate=module", "-p", "no:xdist")


def _stand_in(pytester, monkeypatch):
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(STAND_IN)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SANITIZER_LOG", str(pytester.path / "sanitizer.log"))
    monkeypatch.setenv("FAKE_SANITIZER_FINDING", str(pytester.path / "finding"))
    monkeypatch.setenv("FAKE_SANITIZER_TRANSCRIPTS", str(TRANSCRIPTS))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    return pytester.path / "sanitizer.log"


# each tool's planted fault as the real tool reported it: the access and where
REPORTED = {
    "memcheck": ("compute-sanitizer memcheck: 1 error(s)", "Invalid __global__ read of size 4 bytes",
                 "shifted_copy_kernel+0xf0 in faulty_kernels.py:33"),
    "racecheck": ("compute-sanitizer racecheck: 1 error(s), 0 warning(s)",
                  "Error: Race reported between Write access at racy_shared_kernel+0x100 in faulty_kernels.py:152",
                  "and Read access at racy_shared_kernel+0x110 in faulty_kernels.py:152 [512 hazards]"),
    "initcheck": ("compute-sanitizer initcheck: 1 error(s)", "Uninitialized __global__ memory read of size 4 bytes",
                  "copy_kernel+0xf0 in faulty_kernels.py:18"),
    "synccheck": ("compute-sanitizer synccheck: 1 error(s)", "Barrier error detected. Divergent thread(s) in warp.",
                  "divergent_barrier_kernel+0xa0 in faulty_kernels.py:229"),
}


@pytest.mark.parametrize("tool", sorted(REPORTED))
def test_a_finding_fails_its_test_and_a_clean_run_passes(pytester, monkeypatch, tool):
    """Under each tool, with its real output: a clean run passes (racecheck's summary is
    not memcheck's), and its report fails the test that caused it."""
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=PROJECT)
    result = run(pytester, f"--fla-sanitizer={tool}", "-v", "-p", "no:xdist", "--fla-report=report.json")
    out = result.stdout.str()
    result.assert_outcomes(passed=2, failed=2)
    assert "test_kernels.py::test_clean PASSED" in out
    assert "test_kernels.py::test_no_kernel PASSED" in out
    assert "test_kernels.py::test_reads_past_the_end FAILED" in out
    assert all(text in out for text in REPORTED[tool]), out
    assert "did not finish" not in out and "ended without" not in out
    assert "assert 1 == 2" in out  # a plain failure keeps its own report...
    # ...and is not re-run under the tool, nor is a test that launched no Triton kernel
    under_tool = (pytester.path / "sanitizer.log.tests").read_text().split()
    assert sorted(under_tool) == ["test_clean", "test_reads_past_the_end"]
    # each ran as memcheck, with the caching allocator off and blocking launches
    assert log.read_text().splitlines() == [f"{tool} 1 1"] * 2
    # the report times each test's processes: the plain child, and the tool's run if any
    timed = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "report.json").read_text())["tests"]}
    for name in ("test_clean", "test_reads_past_the_end"):
        assert 0 < timed[name]["sanitizer_seconds"] < timed[name]["process_seconds"]
        # the tool's children's start-up is part of the start-up, which is part of the whole
        assert 0 < timed[name]["sanitizer_startup_seconds"] < timed[name]["sanitizer_seconds"]
        assert timed[name]["sanitizer_startup_seconds"] < timed[name]["startup_seconds"] < timed[name]["process_seconds"]
    for name in ("test_fails_plainly", "test_no_kernel"):
        assert timed[name]["sanitizer_seconds"] == 0 < timed[name]["process_seconds"]
    # and so do the slowest checks in the terminal summary (the target: the interpreter or the GPU's arch)
    assert re.search(r"s  (interpreter|sm\d+) +test_kernels\.py::test_clean \(its processes, start-up included; "
                     r"the test itself [\d.]+s, [\d.]+s under the sanitizer\)", out)
    assert re.search(r"child processes: .* under the sanitizer [\d.]+s \(\d+%\), of which [\d.]+s \(\d+%\) starting up", out)


LARGE_MEMORY_PROJECT = KERNEL_AND_CLEAN_TEST + '''

import pytest


@pytest.mark.large_memory
def test_past_two_to_the_31():
    launch()
    under_tool("test_past_two_to_the_31")
'''


def test_a_large_memory_check_is_skipped_unless_all_tests_are_asked_for(pytester, monkeypatch):
    """Its plain run would hold the GPU alone (every other check waiting) for nothing the
    tool sees: it is skipped, in the worker, without a child process."""
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=LARGE_MEMORY_PROJECT)
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "-rA", "--fla-report=report.json")
    result.assert_outcomes(passed=1, skipped=1)
    assert (pytester.path / "sanitizer.log.tests").read_text().split() == ["test_clean"]
    assert "not run under --fla-sanitizer: a large_memory check" in result.stdout.str()
    timed = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "report.json").read_text())["tests"]}
    assert timed["test_past_two_to_the_31"]["process_seconds"] is None  # no child ran it
    result = run(pytester, "--fla-sanitizer=memcheck", "--fla-sanitizer-all-tests", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert "test_past_two_to_the_31" in (pytester.path / "sanitizer.log.tests").read_text().split()
    assert len(log.read_text().splitlines()) == 2 + 1  # the first run's test_clean, then both


PLAIN_ONLY_PROJECT = KERNEL_AND_CLEAN_TEST + '''

import pytest


@pytest.mark.fla_plain_only(reason="its launch holds the GPU for minutes under the tool")
def test_huge_launch():
    launch()
    under_tool("test_huge_launch")
'''


def test_a_plain_only_test_runs_plainly_not_under_the_tool(pytester, monkeypatch):
    _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=PLAIN_ONLY_PROJECT)
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "sanitizer.log.tests").read_text().split() == ["test_clean"]
    assert "not run under the tool: its launch holds the GPU for minutes under the tool" in result.stdout.str()
    result = run(pytester, "--fla-sanitizer=memcheck", "--fla-sanitizer-all-tests", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert "test_huge_launch" in (pytester.path / "sanitizer.log.tests").read_text().split()


def test_each_tool_asked_for_runs_and_all_tests_on_request(pytester, monkeypatch):
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels="def test_no_kernel():\n    pass\n")
    result = run(pytester, "--fla-sanitizer=memcheck,racecheck,synccheck", "--fla-sanitizer-all-tests", "-p", "no:xdist")
    result.assert_outcomes(passed=1)
    assert [r.split()[0] for r in log.read_text().splitlines()] == ["memcheck", "racecheck", "synccheck"]
    assert "fla sanitizer: memcheck, racecheck, synccheck (each test re-run at small shapes, a check's tests for one op " \
        "in one subprocess; a report lands on the test that was running)" in result.stdout.str()


def test_a_module_reruns_in_one_process_and_one_by_one_after_a_report(pytester, monkeypatch):
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=PROJECT)
    result = run(pytester, *MODULE_BATCHES, "-v")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "test_kernels.py::test_clean PASSED" in out
    assert "test_kernels.py::test_reads_past_the_end FAILED" in out
    assert "a module's tests in one subprocess" in out
    # one run of both kernel-launching tests together, whose report came after both (it
    # lands on neither); then each alone
    assert len(log.read_text().splitlines()) == 3
    under_tool = (pytester.path / "sanitizer.log.tests").read_text().split()
    assert sorted(under_tool) == ["test_clean", "test_clean", "test_reads_past_the_end", "test_reads_past_the_end"]


def test_a_clean_module_reruns_in_one_process(pytester, monkeypatch):
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=KERNEL_AND_CLEAN_TEST + """
def test_clean_too():
    launch()
""")
    result = run(pytester, *MODULE_BATCHES, "-rA")
    result.assert_outcomes(passed=2)
    assert len(log.read_text().splitlines()) == 1
    assert "run with 2 tests in one process" in result.stdout.str()


def test_a_crash_under_the_tool_fails_only_its_own_test(pytester, monkeypatch):
    """The batch child dies at one test: each re-runs alone, and only that one fails."""
    _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=KERNEL_AND_CLEAN_TEST + """
def test_crashes_under_the_tool():
    launch()
    if under_tool("test_crashes_under_the_tool"):
        os.abort()

def test_clean_after():
    launch()
""")
    result = run(pytester, *MODULE_BATCHES, "-v")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "test_kernels.py::test_crashes_under_the_tool FAILED" in out
    assert "test_kernels.py::test_clean_after PASSED" in out
    # the tool outlives the program: the crash shows as its exit status, with the stderr
    assert "under compute-sanitizer memcheck: the test process exited with code" in out
    assert "Fatal Python error: Aborted" in out


REPORT_INLINE = """

def report_inline():
    # what the tool prints while a kernel runs: into the program's stdout, at that moment
    # (the tool's own report of its planted fault, as recorded)
    lines = open(os.path.join(os.environ["FAKE_SANITIZER_TRANSCRIPTS"], "memcheck-oob_read.stdout")).read().splitlines()
    os.write(1, ("\\n".join(lines[1:lines.index("========= ")]) + "\\n").encode())
    with open(os.environ["FAKE_SANITIZER_FINDING"] + ".inline", "a") as f:
        f.write("x\\n")

"""

BATCH_PROJECT = KERNEL_AND_CLEAN_TEST + REPORT_INLINE + """
import pytest

RAN = []


@pytest.mark.parametrize("case", ["op-a", "op-b", "op-c", "op-d"])
def test_op(case):
    launch()
    with open(os.environ["FAKE_SANITIZER_LOG"] + ".shapes", "a") as f:
        f.write(os.environ.get("FLA_SMALL_SHAPES", "-") + "\\n")
    with open(os.environ["FAKE_SANITIZER_LOG"] + ".reference", "a") as f:
        f.write(("tool " if os.environ.get("FAKE_UNDER_TOOL") else "plain ") + os.environ.get("FLA_REFERENCE_DEVICE", "-") + "\\n")
    if under_tool(f"test_op[{case}]"):
        if case == "op-b" or (case == "op-d" and RAN):  # op-d reports only after another test ran
            report_inline()
        RAN.append(case)
"""


def test_a_batch_report_lands_on_the_test_that_was_running(pytester, monkeypatch):
    """A check's tests for one op run in one process under the tool; a report that comes
    while a test runs fails that test alone: it is confirmed by a run of that test alone,
    and a report that comes only in company says so."""
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=BATCH_PROJECT)
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    for case in ("op-a", "op-c"):
        assert f"PASSED test_kernels.py::test_op[{case}]" in out
    assert "FAILED test_kernels.py::test_op[op-b] - compute-sanitizer memcheck: 1 error(s)" in out
    assert "FAILED test_kernels.py::test_op[op-d] - compute-sanitizer memcheck: 1 error(s)" in out
    assert "run alone it was clean" in out  # op-d's report came only in company
    assert "run with 4 tests in one process" in out
    # the batch under the tool, then op-b and op-d alone; not every test alone
    under_tool = [t for t in (pytester.path / "sanitizer.log.tests").read_text().split() if t != "test_clean"]
    assert sorted(under_tool) == sorted(f"test_op[{c}]" for c in ("op-a", "op-b", "op-b", "op-c", "op-d", "op-d"))
    assert len(log.read_text().splitlines()) == 4  # test_clean's batch, test_op's, op-b and op-d alone
    # the plain run used the tool's small shapes; the tool skipped what the checks do not need
    assert set((pytester.path / "sanitizer.log.shapes").read_text().split()) == {"1"}
    # and under the tool the float64 reference goes to the CPU, where the tool has nothing to check
    assert sorted(set((pytester.path / "sanitizer.log.reference").read_text().splitlines())) == ["plain -", "tool cpu"]
    options = (pytester.path / "sanitizer.log.options").read_text().splitlines()[0]
    assert "--target-processes application-only" in options and "--check-device-heap no" in options
    assert "--launch-timeout 0" in options  # the tool waits for a program slow to start


def test_batches_under_xdist_run_whole_in_one_worker(pytester, monkeypatch):
    """-n 2 hands a worker a whole batch: the four tests run once each, under the tool in
    one process."""
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=BATCH_PROJECT.replace('case == "op-b" or (case == "op-d" and RAN)', "False"))
    result = run(pytester, "--fla-sanitizer=memcheck", "-n", "2", "-rA", "--fla-report=report.json")
    result.assert_outcomes(passed=5)
    under_tool = (pytester.path / "sanitizer.log.tests").read_text().split()
    assert sorted(under_tool) == ["test_clean"] + [f"test_op[{c}]" for c in ("op-a", "op-b", "op-c", "op-d")]
    assert len(log.read_text().splitlines()) == 2  # test_clean's batch and test_op's
    # each worker's tool runs reach their programs on ports of the worker's own
    ports = {tuple(re.search(r"--port (\d+) --max-connections (\d+)", line).groups())
             for line in (pytester.path / "sanitizer.log.options").read_text().splitlines()}
    assert ports <= {("49152", "32"), ("49184", "32")}
    # the report's timeline: when each test began, and on which worker (a batch's on one)
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    assert all(t["started"] > 1e9 and t["worker"] in ("gw0", "gw1") for t in tests)
    batch = [t for t in tests if "test_op[" in t["nodeid"]]
    assert len({t["worker"] for t in batch}) == 1
    assert [t["nodeid"] for t in sorted(batch, key=lambda t: t["started"])] == [t["nodeid"] for t in batch]


ONE_PER_OP_PROJECT = KERNEL_AND_CLEAN_TEST + REPORT_INLINE + """
import pytest


@pytest.mark.parametrize("op", ["alpha", "beta", "gamma"])
def test_huge_grid(op):
    launch()
    if under_tool(f"test_huge_grid[{op}]") and op == "beta":
        report_inline()
"""


def test_one_test_per_op_checks_share_a_child_across_ops(pytester, monkeypatch):
    """A check with one test per op (huge grid, 2**31 elements, ...) would pay two child
    start-ups per test: its ops' tests run in one child, plainly and under the tool, and a
    report still lands on the op whose test was running."""
    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=ONE_PER_OP_PROJECT)
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    assert "FAILED test_kernels.py::test_huge_grid[beta] - compute-sanitizer memcheck" in out
    assert "run with 3 tests in one process" in out
    # test_clean's child, the three ops' child, then beta alone to confirm its report
    assert len(log.read_text().splitlines()) == 3
    under_tool = (pytester.path / "sanitizer.log.tests").read_text().split()
    assert sorted(under_tool) == sorted(["test_clean"] + [f"test_huge_grid[{op}]" for op in ("alpha", "beta", "beta", "gamma")])


STALL_PROJECT = KERNEL_AND_CLEAN_TEST + """
import time


def stall_under_tool(name, first_run_only):
    # what the GPU machine's children did under the tool: stop at a test, no CPU, no output
    marker = os.environ["FAKE_SANITIZER_LOG"] + "." + name + ".stalled"
    if under_tool(name) and not (first_run_only and os.path.exists(marker)):
        open(marker, "w").close()
        time.sleep(120)

def test_a_before():
    launch()
    under_tool("test_a_before")

def test_b_stalls_once():
    launch()
    stall_under_tool("test_b_stalls_once", first_run_only=True)

def test_c_stalls_always():
    launch()
    stall_under_tool("test_c_stalls_always", first_run_only=False)

def test_d_after():
    launch()
    under_tool("test_d_after")
"""


def test_a_stalled_child_is_killed_and_its_test_runs_again(pytester, monkeypatch):
    """A child under the tool that stops making progress costs the run only the stall
    limit: it is killed with where it waited, its test runs once more in a fresh child (and
    passes if it then finishes), a second stall fails it; the tests around it keep their
    own verdicts."""
    _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=STALL_PROJECT)
    # 5 s: a child importing torch on a loaded 2-core machine still uses a CPU second in that
    result = run(pytester, *MODULE_BATCHES, "-rA", "--fla-sanitizer-stall=5")
    result.assert_outcomes(passed=4, failed=1)
    out = result.stdout.str()
    assert "FAILED test_kernels.py::test_c_stalls_always" in out
    assert "under compute-sanitizer memcheck: the test process stalled twice (5 s without progress)" in out
    for name in ("test_a_before", "test_b_stalls_once", "test_d_after"):
        assert f"PASSED test_kernels.py::{name}" in out
    assert "its first run under the tool stalled and was killed; it ran again" in out
    # where the processes waited: the tool's and the test process's state, Python stacks
    assert re.search(r"pid \d+ state sleeping wchan \S+ threads \[[^]]*\]: \S*python\S* -m pytest --fla-child=", out)
    assert "in stall_under_tool" in out
    under_tool = (pytester.path / "sanitizer.log.tests").read_text().split()
    # one batch run cut at b, b's re-run cut at c, c's re-run, then d on its own
    assert sorted(under_tool) == sorted(["test_clean", "test_a_before", "test_b_stalls_once", "test_b_stalls_once",
                                         "test_c_stalls_always", "test_c_stalls_always", "test_d_after"])


def test_a_negative_stall_limit_is_a_usage_error(pytester, monkeypatch):
    _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=KERNEL_AND_CLEAN_TEST)
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "--fla-sanitizer-stall=-5")
    assert result.ret == 4  # pytest's usage error
    assert "--fla-sanitizer-stall: -5 seconds; give 0 (wait for ever) or more" in result.stderr.str()


def test_a_repro_marked_plain_under_the_sanitizer_runs_plainly_only(pytester, monkeypatch):
    """`# plain-under-sanitizer: <why>` in a reproducer's header: under --fla-sanitizer it runs
    plainly, its report says why the tool left it out, and --fla-sanitizer-all-tests puts it
    under the tool again; a reproducer without the line runs under the tool."""
    log = _stand_in(pytester, monkeypatch)
    repro_dir = pytester.mkdir("repro")
    header = "# source: a report\n# seen-on: sm90\n# expect: pass\n"
    (repro_dir / "huge.py").write_text(header + "# plain-under-sanitizer: 65538 programs a launch\nx = 1\n")
    (repro_dir / "small.py").write_text(header + "x = 1\n")
    result = run(pytester, "--fla-sanitizer=memcheck", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=2)
    assert "not run under the tool: 65538 programs a launch (--fla-sanitizer-all-tests runs it)" in result.stdout.str()
    assert len(log.read_text().splitlines()) == 1  # small.py alone went under the tool
    result = run(pytester, "--fla-sanitizer=memcheck", "--fla-sanitizer-all-tests", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert len(log.read_text().splitlines()) == 3
