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
import subprocess
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
PREFIX = "========= "
SUMMARY_RE = re.compile(r"ERROR SUMMARY: (\d+) errors?")
# A program that never calls CUDA (a compile-only check, a CPU test) leaves the tool
# nothing to instrument: it prints this instead of a summary and exits 255.
NO_CUDA_CALL = "Target application terminated before first instrumented API call"
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
# What the tool prints when it gave up waiting for the program to connect.
GAVE_UP = "No attachable process found"


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
PORT_OFFSET_ENV = "FLA_SANITIZER_PORT_OFFSET"  # for two runs side by side on one machine


def port_range(worker: str | None = None, offset: int | None = None) -> tuple[int, int]:
    """(first port, count) for this process's tool runs: a block of its own per xdist worker
    (``gwN``: the N-th block; the controller or a run without xdist: block 0), moved by
    ``offset`` blocks (``FLA_SANITIZER_PORT_OFFSET``), wrapping inside 49152-65535."""
    if worker is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if offset is None:
        offset = int(os.environ.get(PORT_OFFSET_ENV, "0") or 0)
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
SHAPES_ENV = {"FLA_SMALL_SHAPES": "1"}


def environment(caching_allocator: bool = False) -> dict[str, str]:
    from .devices import REFERENCE_DEVICE_ENV

    # the float64 reference on the CPU: the tool need not check it (devices.REFERENCE_DEVICE_ENV)
    env = {"CUDA_LAUNCH_BLOCKING": "1", REFERENCE_DEVICE_ENV: "cpu", **SHAPES_ENV}
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


@dataclass
class SanitizerResult:
    tool: str
    findings: list[Finding]
    summary: int | None  # the tool's own error count; None if it never printed one
    untouched: bool = False  # the program made no CUDA call: nothing ran on the device
    gave_up: bool = False  # the tool stopped waiting for the program to connect

    @property
    def clean(self) -> bool:
        return not self.findings and (self.summary == 0 or (self.summary is None and self.untouched))

    def describe(self) -> str:
        if self.gave_up and self.summary is None:
            return (f"compute-sanitizer {self.tool} gave up waiting for the program to connect "
                    "(--launch-timeout): nothing was checked")
        if self.untouched and self.summary is None:
            return f"compute-sanitizer {self.tool}: the program made no CUDA call (nothing ran on the device)"
        if self.summary is None:
            return f"compute-sanitizer {self.tool} printed no error summary: it did not finish"
        head = f"compute-sanitizer {self.tool}: {self.summary} error(s)"
        return "\n".join([head] + [f.describe() for f in self.findings])


def parse(tool: str, output: str) -> SanitizerResult:
    """Read the ``========= `` lines of compute-sanitizer's output into findings."""
    findings: list[Finding] = []
    summary = None
    untouched = gave_up = False
    current: list[str] | None = None
    for raw in output.splitlines():
        if GAVE_UP in raw or "--launch-timeout" in raw:  # the message and its second line
            gave_up, current = True, None
            continue
        if not raw.startswith(PREFIX.rstrip()):
            continue
        line = raw[len(PREFIX) :] if raw.startswith(PREFIX) else ""
        match = SUMMARY_RE.search(line)
        if NO_CUDA_CALL in line:
            untouched, current = True, None
        elif match:
            summary = int(match.group(1))
            current = None
        elif not line.strip() or line.startswith("COMPUTE-SANITIZER"):
            current = None
        elif line.startswith(" "):
            if current is not None:
                current.append(line.strip())
        else:
            current = [line.strip()]
            findings.append(Finding(current))
    return SanitizerResult(tool, findings, summary, untouched, gave_up)
