"""compute-sanitizer runs: the command, the environment, and reading its reports.

PyTorch's caching allocator hands out slices of larger blocks, so a read just past
the end of a tensor usually lands inside memory the process owns and memcheck sees
nothing: ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` gives each tensor its own allocation,
whose edge memcheck can see. Launches are made blocking so a report arrives while its
test is still running.
"""

from __future__ import annotations

import functools
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
}


@functools.lru_cache(maxsize=None)
def _help_text(path: str) -> str:
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def lean_options(tool: str) -> list[str]:
    """The LEAN_OPTIONS for ``tool`` that this compute-sanitizer lists in its ``--help``."""
    path = executable()
    listed = _help_text(path) if path else ""
    options = []
    for option, (value, tools) in LEAN_OPTIONS.items():
        if tool in tools and re.search(rf"(^|\s){re.escape(option)}\b", listed):
            options += [option, value]
    return options


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
    ]


# Small shapes under the sanitizer (it slows kernels down by one to two orders of magnitude);
# the op specs read FLA_SMALL_SHAPES.
SHAPES_ENV = {"FLA_SMALL_SHAPES": "1"}


def environment(caching_allocator: bool = False) -> dict[str, str]:
    env = {"CUDA_LAUNCH_BLOCKING": "1", **SHAPES_ENV}
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

    @property
    def clean(self) -> bool:
        return not self.findings and (self.summary == 0 or (self.summary is None and self.untouched))

    def describe(self) -> str:
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
    untouched = False
    current: list[str] | None = None
    for raw in output.splitlines():
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
    return SanitizerResult(tool, findings, summary, untouched)
