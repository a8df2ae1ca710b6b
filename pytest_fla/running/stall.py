"""Waiting for a child process that may stop making progress, and saying where it stopped.

On the GPU machine, children under compute-sanitizer stopped at a test and stayed there:
no new test, no CPU, no GPU, for minutes, until the run's limit (the 2026-11 memcheck runs
in benchmarks/results/README.md). This watch found where they waited (at their first CUDA
call, for a tool that had given up on them: ``sanitizer.LEAN_OPTIONS``' ``--launch-timeout``
removed that), and stays as the guard against the next wait of its kind, which would fail
no check by itself and only eat the run's time. The parent watches its child: a tree of
processes that has used under ``CPU_FLOOR`` seconds of CPU and written nothing to its
results file for ``seconds`` is stalled. The parent then records where each process of the
tree waits (its state, kernel wait channel and stack, and the Python stacks the child
writes on SIGUSR1), kills the tree, and the batch goes on (``isolation.run_batch`` runs the
stalled test once more before it fails it).

Processes, their CPU time and command lines are read through psutil; the kernel's wait
channel and stack, which psutil does not read, from ``/proc`` where it is there (Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

POLL_SECONDS = 2.0
CPU_FLOOR = 1.0  # CPU seconds of the whole tree within the window that count as progress
PROC = Path("/proc")


def tree(root: int) -> list[int]:
    """``root`` and every process descended from it (those still there)."""
    try:
        process = psutil.Process(root)
        return [root] + [child.pid for child in process.children(recursive=True)]
    except psutil.Error:
        return []


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` (those still there), with their children
    that have ended and been waited for (a compiler run from the test process)."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def where(pids: list[int]) -> str:
    """Each process's command, state, threads' states, and (Linux) kernel wait channel and
    kernel stack, where readable."""
    lines = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                command = " ".join(process.cmdline()).strip() or process.name()
                status = process.status()
                threads = [thread.id for thread in process.threads()]
        except psutil.Error:
            continue
        states: dict[str, int] = {}
        for thread in threads:
            try:
                state = psutil.Process(thread).status()  # a thread is a process to the kernel
            except psutil.Error:
                continue
            states[state] = states.get(state, 0) + 1
        summary = " ".join(f"{n} {state}" for state, n in sorted(states.items()))
        wchan = _read(PROC / str(pid) / "wchan") or "?"
        lines.append(f"pid {pid} state {status} wchan {wchan} threads [{summary}]: {command[:300]}")
        stack = _read(PROC / str(pid) / "stack")
        if stack:
            lines += ["    " + line for line in stack.splitlines()[:12]]
    return "\n".join(lines)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def wait(process: subprocess.Popen, progress: Path, seconds: float | None, python_marker: str = "") -> str | None:
    """Wait for ``process`` (started in a session of its own). None once it exits; if it
    stalls for ``seconds`` (see the module), kill its tree and return where it waited.
    The Python processes of the tree run as ``python -m pytest`` with an argument that
    starts with ``python_marker`` are asked for their stacks (SIGUSR1) first; not the
    wrapper whose command line holds theirs (compute-sanitizer dies of that signal)."""
    if not seconds:
        process.wait()
        return None
    mark_time, mark_cpu, mark_size = time.monotonic(), -1.0, -1
    while True:
        try:
            process.wait(timeout=POLL_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        pids = tree(process.pid)
        cpu = cpu_seconds(pids)
        size = progress.stat().st_size if progress.exists() else 0
        if size != mark_size or cpu - mark_cpu >= CPU_FLOOR:
            mark_time, mark_cpu, mark_size = now, cpu, size
            continue
        if now - mark_time < seconds:
            continue
        for pid in pids:
            argv = _argv(pid)
            if python_marker and argv[1:3] == ["-m", "pytest"] and any(a.startswith(python_marker) for a in argv):
                _signal(pid, signal.SIGUSR1)
        time.sleep(POLL_SECONDS)  # the stacks reach the child's stderr
        found = where(pids)
        kill(process)
        return (f"no progress for {seconds:.0f} s (under {CPU_FLOOR:.0f} CPU second in the tree, no test "
                f"event): killed. Where its processes waited:\n{found}")


def _argv(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def kill(process: subprocess.Popen) -> None:
    """SIGKILL ``process``'s session (it was started with one of its own), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()
    process.wait()
