"""Reading compute-sanitizer's output: findings, each tool's own summary, and runs that end
without one. The outputs are the real tool's, recorded on an H100 with the plugin's own
command line (sanitizer_transcripts/, re-recorded by benchmarks/sanitizer_transcripts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_fla import sanitizer

TRANSCRIPTS = Path(__file__).parent / "sanitizer_transcripts"
MANIFEST = json.loads((TRANSCRIPTS / "manifest.json").read_text())


def transcript(tool: str, scenario: str) -> str:
    return (TRANSCRIPTS / f"{tool}-{scenario}.stdout").read_text()


def exit_status(tool: str, scenario: str):
    return next(r["exit"] for r in MANIFEST["runs"] if (r["tool"], r["scenario"]) == (tool, scenario))


# (scenario, tool) -> what the tool found there: the planted fault of each tool is reported
# by that tool alone; everything else is clean for every tool
FAULTS = {
    ("oob_read", "memcheck"): "Invalid __global__ read of size 4 bytes",
    ("oob_store", "memcheck"): "Invalid __global__ write of size 4 bytes",
    ("shared_race", "racecheck"): "Error: Race reported between Write access at racy_shared_kernel",
    ("uninitialised_read", "initcheck"): "Uninitialized __global__ memory read of size 4 bytes",
    ("divergent_barrier", "synccheck"): "Barrier error detected. Divergent thread(s) in warp.",
}
RUNS = sorted({(r["tool"], r["scenario"]) for r in MANIFEST["runs"]})


def test_every_tool_and_scenario_was_recorded():
    assert {tool for tool, _ in RUNS} == set(sanitizer.TOOLS)
    assert all((TRANSCRIPTS / f"{tool}-{scenario}.stdout").exists() for tool, scenario in RUNS)
    assert {(tool, scenario) for scenario, tool in FAULTS} <= set(RUNS)


@pytest.mark.parametrize("tool,scenario", RUNS, ids=[f"{t}-{s}" for t, s in RUNS])
def test_each_tools_verdict_on_the_real_output(tool, scenario):
    result = sanitizer.parse(tool, transcript(tool, scenario), exit_status(tool, scenario))
    fault = FAULTS.get((scenario, tool))
    if fault is None:
        # every clean run is clean: a program that exits non-zero or is killed is the
        # program's verdict (its test fails on its own), not a finding of the tool's
        assert result.clean, result.describe()
        assert not result.findings
        assert result.errors == (None if scenario == "no_cuda_call" else 0)
        assert "did not finish" not in result.describe() and "ended without" not in result.describe()
    else:
        assert not result.clean
        assert result.errors and result.errors > 0
        assert fault in result.findings[0].access
        assert result.findings[0].location is not None  # the kernel and its source line


def test_racecheck_counts_errors_and_warnings_from_its_own_summary():
    result = sanitizer.parse("racecheck", transcript("racecheck", "shared_race"))
    assert (result.errors, result.warnings, len(result.findings)) == (1, 0, 1)
    race = result.findings[0]
    assert race.lines[1].startswith("and Read access at racy_shared_kernel") and "[512 hazards]" in race.lines[1]
    assert race.location["kernel"] == "racy_shared_kernel" and race.location["file"] == "faulty_kernels.py"
    assert result.describe().startswith("compute-sanitizer racecheck: 1 error(s), 0 warning(s)")
    clean = sanitizer.parse("racecheck", transcript("racecheck", "op_varlen"))  # three ops' varlen checks
    assert clean.clean and (clean.errors, clean.warnings) == (0, 0)


def test_a_racecheck_warning_is_shown_but_does_not_fail():
    # the tool's analysis mode grades a hazard an error or a warning (--racecheck-detect-level)
    warned = transcript("racecheck", "clean").replace(
        "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
        "========= Warning: Race reported between Write access at k+0x10 in f.py:3\n"
        "=========     and Write access at k+0x10 in f.py:3 [4 hazards]\n"
        "========= \n"
        "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)")
    result = sanitizer.parse("racecheck", warned)
    assert result.clean and result.warnings == 1 and len(result.findings) == 1
    assert "0 error(s), 1 warning(s)" in result.describe()


def test_errors_past_the_print_limit_are_counted():
    result = sanitizer.parse("initcheck", transcript("initcheck", "uninitialised_read"))
    assert (result.errors, result.unprinted, len(result.findings)) == (1000, 980, 20)
    assert "(980 not printed: past --print-limit)" in result.describe()


def test_a_program_without_cuda_calls_is_clean_and_says_so():
    """The compile-only reproducers: the tool prints two lines of its own and no summary."""
    text = transcript("memcheck", "no_cuda_call")
    assert "Tracking kernels launched by child processes" in text
    result = sanitizer.parse("memcheck", text, 255)
    assert result.untouched and result.clean and not result.findings
    assert "made no CUDA call" in result.describe()


def test_a_run_cut_short_says_how_it_ended():
    cut = transcript("racecheck", "op_varlen").split("========= RACECHECK SUMMARY")[0]
    result = sanitizer.parse("racecheck", cut, -9)
    assert not result.clean and result.errors is None
    text = result.describe()
    assert text.startswith("compute-sanitizer racecheck ended without its summary line: it was killed by SIGKILL")
    assert "the last lines of its output:" in text and "parallel_attn" in text
    assert "exited with status 2" in sanitizer.parse("memcheck", "========= COMPUTE-SANITIZER\n", 2).describe()


def test_no_cuda_call_does_not_excuse_findings():
    result = sanitizer.parse("memcheck", transcript("memcheck", "oob_read").split("========= Error: process")[0]
                             + transcript("memcheck", "no_cuda_call"))
    assert not result.clean


def test_pytests_own_separator_lines_are_not_findings():
    """A child's pytest prints lines of '=' that can start like the tool's prefix."""
    text = transcript("memcheck", "clean").replace(
        "clean: done", "========= 5 passed, 2 warnings in 123.45s (0:02:03) =========\nclean: done")
    assert sanitizer.parse("memcheck", text).clean


# What compute-sanitizer 2025.2 prints when the program has not connected within
# --launch-timeout (its own text, from the tool's binary); the program then waits for ever.
GAVE_UP = """\
========= COMPUTE-SANITIZER
========= Error: No attachable process found. compute-sanitizer timed-out.
========= Default timeout can be adjusted with --launch-timeout. Awaiting target completion.
"""


def test_each_xdist_worker_gets_ports_of_its_own():
    """The tool and its program meet on a TCP port from a range: workers sharing the default
    ten ports waited at their first test on the H100 (pytest_fla/sanitizer/__init__.py)."""
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


def test_racecheck_hazard_mode_lists_each_hazard_with_its_values():
    """``--racecheck-report hazard`` (recorded on an H100 over fused_recurrent_simple_gla's
    backward, host frames left out): a report per hazard, its threads and the values written,
    and a summary counting more errors than it displays."""
    result = sanitizer.parse("racecheck", transcript("racecheck", "hazard_report"))
    assert not result.clean
    assert (result.errors, result.warnings, len(result.findings)) == (1232, 0, 6)
    first = result.findings[0]
    assert first.access.startswith("Error: Potential WAW hazard detected at __shared__ 0x400")
    assert first.location["kernel"] == "fused_recurrent_fwd_kernel" and first.location["line"] == "207"
    assert "Current Value : 196, Incoming Value : 195" in first.lines
