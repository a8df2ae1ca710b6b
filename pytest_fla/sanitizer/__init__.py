"""compute-sanitizer runs: the command, the environment, and reading its reports.

PyTorch's caching allocator hands out slices of larger blocks, so a read just past
the end of a tensor usually lands inside memory the process owns and memcheck sees
nothing: ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` gives each tensor its own allocation,
whose edge memcheck can see. Launches are made blocking so a report arrives while its
test is still running.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import environment as variables  # the module; `environment()` below is this one's

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
PREFIX = "========= "
# Each tool ends with a summary line of its own (compute-sanitizer 2025.3, read on an H100;
# the transcripts in tests/plugin/sanitizer_transcripts/): memcheck, initcheck and synccheck
# print ``ERROR SUMMARY: N errors``, racecheck ``RACECHECK SUMMARY: N hazards displayed
# (E errors, W warnings)``. Past --print-limit a second ``ERROR SUMMARY: M errors were not
# printed ...`` line follows the first.
ERROR_SUMMARY_RE = re.compile(r"^ERROR SUMMARY: (?P<errors>\d+) errors?\s*$")
UNPRINTED_RE = re.compile(r"^ERROR SUMMARY: (?P<unprinted>\d+) errors? (?:was|were) not printed")
RACECHECK_SUMMARY_RE = re.compile(
    r"^RACECHECK SUMMARY: (?P<hazards>\d+) hazards? displayed \((?P<errors>\d+) errors?, (?P<warnings>\d+) warnings?\)")
# The test program's pytest centres its section and summary lines between runs of '=',
# which can begin like the tool's prefix; the tool's own lines never end in one.
PYTEST_SEPARATOR_RE = re.compile(r" =+\s*$")
# A program that never calls CUDA (a compile-only check, a CPU test) leaves the tool
# nothing to instrument: it prints this (and a note on child processes) instead of a
# summary and exits 255.
NO_CUDA_CALL = "Target application terminated before first instrumented API call"
# What the tool says of the run itself rather than of a kernel: none is a finding. The
# program's own exit status or signal ("process didn't terminate successfully", "returned an
# error") comes before the summary; the test's verdict is the program's own.
TOOL_MESSAGES = (
    NO_CUDA_CALL,
    "Tracking kernels launched by child processes requires",
    "Error: process didn't terminate successfully",
    "Target application returned an error",
)
LOCATION_RE = re.compile(r"at (?P<kernel>\S+?)(?:\+0x[0-9a-f]+)? in (?P<file>[^\s:]+):(?P<line>\d+)")


def parse_tools(text: str) -> list[str]:
    tools = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        raise ValueError(f"--fla-sanitizer: unknown tool(s) {unknown}; choose from {', '.join(TOOLS)}")
    return tools


def executable() -> str | None:
    return shutil.which("compute-sanitizer")


# Work the checks do not need, skipped where this compute-sanitizer has the option: the
# test process's own subprocesses (ptxas, ldconfig) are not the program under test, and
# Triton kernels allocate nothing on the device heap.
LEAN_OPTIONS = {
    "--target-processes": ("application-only", TOOLS),
    "--check-device-heap": ("no", ("memcheck",)),
    # The tool waits 10 s (one tracked process) for the program to connect, which it does at
    # its first CUDA call: after importing torch and collecting the tests, well past 10 s on
    # a machine whose cores are all busy. The tool then gives up ("No attachable process
    # found ... Awaiting target completion") and the program, connecting later, waits for
    # ever at that first call: the stalls of the GPU runs (benchmarks/results/README.md).
    # Wait as long as the program takes.
    "--launch-timeout": ("0", TOOLS),
}
# What the tool prints when it gave up waiting for the program to connect (and its second line).
GAVE_UP = "No attachable process found"
GAVE_UP_NOTE = "--launch-timeout"


@functools.lru_cache(maxsize=None)
def _help_text(path: str) -> str:
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def _lists(option: str) -> bool:
    """Whether the compute-sanitizer on the PATH lists ``option`` in its ``--help``."""
    path = executable()
    listed = _help_text(path) if path else ""
    return re.search(rf"(^|\s){re.escape(option)}\b", listed) is not None


def lean_options(tool: str) -> list[str]:
    """The LEAN_OPTIONS for ``tool`` that this compute-sanitizer lists in its ``--help``."""
    options = []
    for option, (value, tools) in LEAN_OPTIONS.items():
        if tool in tools and _lists(option):
            options += [option, value]
    return options


# compute-sanitizer reaches the program it checks over TCP: the program (the tool's library
# injected into it) listens on the first free port of --max-connections ports from --port,
# 10 from 49152 by default, and the tool connects to it there. Every tool process of a run,
# one per xdist worker, drew from those same ten ports; on the H100, 16 memcheck workers ended
# with child after child under the tool waiting at its first test (where CUDA starts, and the
# connection with it), CPU and GPU idle. Each worker gets ports of its own instead: one tool
# process at a time per worker, with room for ports a finished child left in TIME_WAIT.
PORT_BASE = 49152
PORTS_PER_WORKER = 32


def port_range(worker: str | None = None, offset: int | None = None) -> tuple[int, int]:
    """(first port, count) for this process's tool runs: a block of its own per xdist worker
    (``gwN``: the N-th block; the controller or a run without xdist: block 0), moved by
    ``offset`` blocks (``FLA_SANITIZER_PORT_OFFSET``), wrapping inside 49152-65535."""
    if worker is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if offset is None:
        offset = int(os.environ.get(variables.SANITIZER_PORT_OFFSET, "0") or 0)
    match = re.fullmatch(r"gw(\d+)", worker)
    blocks = (65536 - PORT_BASE) // PORTS_PER_WORKER
    block = ((int(match.group(1)) if match else 0) + offset) % blocks
    return PORT_BASE + block * PORTS_PER_WORKER, PORTS_PER_WORKER


def port_options() -> list[str]:
    """``--port``/``--max-connections`` for this worker's ports, where this compute-sanitizer
    lists both in its ``--help``."""
    if not (_lists("--port") and _lists("--max-connections")):
        return []
    first, count = port_range()
    return ["--port", str(first), "--max-connections", str(count)]


def command(tool: str) -> list[str]:
    return [
        executable() or "compute-sanitizer",
        "--tool",
        tool,
        "--print-limit",
        "20",
        "--error-exitcode",
        "0",  # the report is read from the output; the test's own exit status stays its own
        "--show-backtrace",
        "device",
        *lean_options(tool),
        *port_options(),
    ]


# Small shapes under the sanitizer (it slows kernels down by one to two orders of magnitude);
# the op specs read FLA_SMALL_SHAPES.
SHAPES_ENV = {variables.SMALL_SHAPES: "1"}


def environment(caching_allocator: bool = False) -> dict[str, str]:
    # the float64 reference on the CPU: the tool need not check it (devices.reference_device)
    env = {"CUDA_LAUNCH_BLOCKING": "1", variables.REFERENCE_DEVICE: "cpu", **SHAPES_ENV}
    if not caching_allocator:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


@dataclass
class Finding:
    """One sanitizer report: what went wrong, in which kernel, at which source line."""

    lines: list[str]

    @property
    def access(self) -> str:
        return self.lines[0]

    @property
    def is_warning(self) -> bool:
        """racecheck's potential hazards (``Warning: ...``): shown, counted, not failed on."""
        return self.lines[0].startswith("Warning")

    @property
    def location(self) -> re.Match | None:
        for line in self.lines:
            match = LOCATION_RE.search(line)
            if match:
                return match
        return None

    def describe(self) -> str:
        text = "\n".join("  " + line for line in self.lines)
        location = self.location
        if location:
            source = source_line(location["file"], int(location["line"]))
            if source:
                text += f"\n  source {Path(location['file']).name}:{location['line']}:  {source}"
        return text


def source_line(path: str, line: int) -> str | None:
    try:
        return Path(path).read_text().splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return None


OUTPUT_TAIL_LINES = 12


@dataclass
class SanitizerResult:
    tool: str
    findings: list[Finding]
    errors: int | None  # the tool's own error count; None if it printed no summary
    untouched: bool = False  # the program made no CUDA call: nothing ran on the device
    gave_up: bool = False  # the tool stopped waiting for the program to connect
    warnings: int = 0  # racecheck's potential hazards (its summary's warnings)
    unprinted: int = 0  # errors past --print-limit, counted but not shown
    exit_status: int | None = None  # of the tool's process, where the caller knows it
    tail: str = ""  # the output's last lines, for a run that ended without a summary

    @property
    def error_findings(self) -> list[Finding]:
        return [f for f in self.findings if not f.is_warning]

    @property
    def clean(self) -> bool:
        return not self.error_findings and (self.errors == 0 or (self.errors is None and self.untouched))

    def _how_it_ended(self) -> str:
        if self.exit_status is None:
            return "its exit status is unknown"
        if self.exit_status < 0:
            try:
                return f"it was killed by {signal.Signals(-self.exit_status).name}"
            except ValueError:
                return f"it was killed by signal {-self.exit_status}"
        return f"it exited with status {self.exit_status}"

    def describe(self) -> str:
        if self.gave_up and self.errors is None:
            return (f"compute-sanitizer {self.tool} gave up waiting for the program to connect "
                    "(--launch-timeout): nothing was checked")
        if self.untouched and self.errors is None:
            return f"compute-sanitizer {self.tool}: the program made no CUDA call (nothing ran on the device)"
        if self.errors is None:
            text = f"compute-sanitizer {self.tool} ended without its summary line: {self._how_it_ended()}"
            if self.findings:
                text += f"; {len(self.findings)} report(s) before it ended"
            text += "\n" + "\n".join(f.describe() for f in self.findings)
            if self.tail:
                text += "\nthe last lines of its output:\n" + self.tail
            return text.rstrip()
        head = f"compute-sanitizer {self.tool}: {self.errors} error(s)"
        if self.tool == "racecheck":
            head += f", {self.warnings} warning(s)"
        if self.unprinted:
            head += f" ({self.unprinted} not printed: past --print-limit)"
        return "\n".join([head] + [f.describe() for f in self.findings])

    def part(self, findings: list[Finding], finished: bool) -> "SanitizerResult":
        """The verdict on one test's share of this output: ``findings`` are the reports
        made while it ran; ``finished`` says its share is whole (the tool's summary came, or
        the test ended before a stalled child was killed)."""
        errors = sum(not f.is_warning for f in findings) if finished else None
        return SanitizerResult(self.tool, findings, errors, self.untouched, self.gave_up,
                               warnings=sum(f.is_warning for f in findings), exit_status=self.exit_status)


def parse(tool: str, output: str, exit_status: int | None = None) -> SanitizerResult:
    """Read the ``========= `` lines of compute-sanitizer's output into findings.

    A finding starts at a line of the tool's that is not one of its own messages about the
    run (``TOOL_MESSAGES``) and takes the indented lines after it; ``exit_status`` (of the
    tool's process, where known) and the output's last lines explain a run that ended
    without a summary."""
    findings: list[Finding] = []
    result = SanitizerResult(tool, findings, None, exit_status=exit_status)
    current: list[str] | None = None
    for raw in output.splitlines():
        if GAVE_UP in raw or GAVE_UP_NOTE in raw:
            result.gave_up, current = True, None
            continue
        if not raw.startswith(PREFIX.rstrip()) or PYTEST_SEPARATOR_RE.search(raw):
            continue
        line = raw[len(PREFIX) :] if raw.startswith(PREFIX) else ""
        errors = ERROR_SUMMARY_RE.match(line)
        unprinted = UNPRINTED_RE.match(line)
        races = RACECHECK_SUMMARY_RE.match(line)
        if NO_CUDA_CALL in line:
            result.untouched = True
        if errors:
            result.errors = int(errors["errors"])
        elif unprinted:
            result.unprinted = int(unprinted["unprinted"])
        elif races:
            result.errors, result.warnings = int(races["errors"]), int(races["warnings"])
        elif line.startswith(" ") and line.strip():
            if current is not None:
                current.append(line.strip())
            continue
        elif line.strip() and not line.startswith("COMPUTE-SANITIZER") and not any(m in line for m in TOOL_MESSAGES):
            current = [line.strip()]
            findings.append(Finding(current))
            continue
        current = None
    if result.errors is None:
        result.tail = "\n".join(output.strip().splitlines()[-OUTPUT_TAIL_LINES:])
    return result
