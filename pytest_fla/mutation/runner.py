"""Running an op's checks against one mutant, in a private copy of the project.

Each worker owns a copy of the project's files (what git lists, less dot directories).
A mutant is written into its copy's file, the op's kernel-launching conformance checks
run there in a fresh ``pytest -x`` (the copy first on ``PYTHONPATH``, no bytecode, no
cache), and the file is put back. Outcomes (``docs/design.md``, "Mutation testing"):

* ``killed``: a check failed; the first failing test is named. A worker that dies of a
  signal (an out-of-bounds access that segfaults) is killed too: the suite, run on its
  own, reports that.
* ``timeout``: the run outlived its limit, twice (the command runs it once more with
  twice the limit); counted as killed, and said so.
* ``invalid``: the first failure is Triton refusing the mutated code (a compile error
  natively; under the interpreter its type and shape checks, wrapped in an
  ``InterpreterError``) before any check could judge a value: not a kill. A finding of the
  interpreter's access checks (``pytest_fla.sanitizer.interpreter``), wrapped the same way,
  is a kill.
* ``survived``: every check passed. ``equivalent`` is a survivor on the kept list.

With the error ratchet (the command's default), the baseline records every comparison's
errors and a mutant's checks are held to them too: a check failing only by the ratchet is
a kill, named so in its detail (``error ratchet: ...``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import environment
from .sites import Mutant

# The conformance checks that launch kernels (and can judge their values), per device.
# The bad-input and device-mismatch checks launch nothing; the 64-bit-offset check needs
# tens of GiB. On the GPU the huge-grid check runs a batch past 65535 programs against a
# float64 reference of 1-3 GB (no small shapes there), too heavy for many copies at once;
# on the CPU it checks the grid rule, at the small shapes. Determinism and host syncs are
# GPU checks.
NUMERIC_CHECKS = ("test_forward", "test_backward", "test_varlen", "test_chunk_vs_recurrent", "test_every_output_written",
                  "test_in_bounds")
KILLING_CHECKS = {"cpu": NUMERIC_CHECKS + ("test_huge_grid",),
                  "cuda": NUMERIC_CHECKS + ("test_deterministic", "test_no_host_sync")}
CONFORMANCE_IMPORT = "pytest_fla.conformance"
# The CPU checks bf16 too, with the GPU's bf16 arithmetic patched into the interpreter: the
# bf16 work dtype takes branches of its own (product precisions, scaled operands) that
# fp32 and fp16 never reach, and which are the ones a GPU user runs.
DEVICE_OPTIONS = {"cpu": ("--fla-bf16-emulated",), "cuda": ()}


# The child runs under way: each in its own session (a timeout kills its whole group), so
# the command kills them itself when it is stopped (``stop_children``).
RUNNING: set = set()


def stop_children() -> None:
    for process in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@dataclass
class Outcome:
    status: str  # killed, timeout, invalid, survived, error
    seconds: float
    killed_by: str | None = None
    detail: str = ""
    counts: dict = field(default_factory=dict)


def project_files(root: Path) -> list[str]:
    """The project's files, relative: tracked and untracked-but-not-ignored where ``root``
    is in a git checkout, every file otherwise; dot directories and bytecode left out."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                                capture_output=True, text=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    keep = []
    for name in listed:
        parts = name.split("/")
        if any(p.startswith(".") for p in parts[:-1]) or "__pycache__" in parts or name.endswith(".pyc"):
            continue
        if (root / name).is_file() and not (root / name).is_symlink():
            keep.append(name)
    return keep


def conformance_modules(root: Path, files: list[str]) -> list[str]:
    """Test modules that import the conformance checks (``from pytest_fla.conformance import *``),
    less those of a nested project (below a directory with its own ``pyproject.toml``)."""
    nested = {name.rsplit("/", 1)[0] + "/" for name in files if name.endswith("/pyproject.toml")}
    found = []
    for name in files:
        base = name.rsplit("/", 1)[-1]
        if any(name.startswith(prefix) for prefix in nested):
            continue
        if base.startswith("test_") and base.endswith(".py") and _imports_conformance((root / name).read_text()):
            found.append(name)
    if not found:
        raise SystemExit(f"mutate: no test module under {root} imports {CONFORMANCE_IMPORT}")
    return found


def _imports_conformance(text: str) -> bool:
    if CONFORMANCE_IMPORT not in text:
        return False
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.ImportFrom) and node.module == CONFORMANCE_IMPORT for node in ast.walk(tree))


class Workspace:
    """A private copy of the project, where one mutant at a time is written."""

    def __init__(self, root: Path, files: list[str], parent: Path, index: int):
        self.root = root
        self.path = parent / f"copy{index}"
        for name in files:
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, target)
        self.files = files

    def env(self, device: str, extra: dict) -> dict:
        env = dict(os.environ)
        tool_path = str(Path(__file__).resolve().parents[2])  # where this pytest_fla lives
        env["PYTHONPATH"] = os.pathsep.join([str(self.path), tool_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env.pop("TRITON_INTERPRET", None)
            env[environment.SMALL_SHAPES] = "1"
        env.update(extra)
        return env

    def pytest(self, args: list[str], device: str, extra_env: dict, timeout: float | None):
        """Run pytest here; (return code or None on timeout, seconds, output tail)."""
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
                   "-p", "pytest_fla.mutation.child", *args]
        start = time.monotonic()
        process = subprocess.Popen(command, cwd=self.path, env=self.env(device, extra_env), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        RUNNING.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            code = None
        finally:
            RUNNING.discard(process)
        return code, time.monotonic() - start, output[-3000:]

    def run_checks(self, op: str, tests: list[str], mutant: Mutant | None, device: str, timeout: float | None,
                   env: dict | None = None) -> Outcome:
        """The op's killing checks here, with ``mutant`` written in (None: as it is), under
        ``env`` too (the error ratchet's files: ``checks.tolerance``)."""
        original = None
        target = None
        if mutant is not None:
            target = self.path / mutant.path
            original = target.read_text()
            target.write_text(mutant.apply(original))
        verdict = self.path / "verdict.json"
        verdict.unlink(missing_ok=True)
        extra = {**(env or {}), environment.MUTATION_VERDICT: str(verdict)}
        if target is not None:
            extra[environment.MUTATION_FILE] = str(target)
        try:
            args = [*tests, "-x", "-q", "--no-header", "-W", "ignore::DeprecationWarning",
                    f"--fla-ops={op}", "-k", " or ".join(KILLING_CHECKS[device]), *DEVICE_OPTIONS[device]]
            code, seconds, tail = self.pytest(args, device, extra, timeout)
        finally:
            if original is not None:
                target.write_text(original)
        report = json.loads(verdict.read_text()) if verdict.exists() else {}
        return classify(code, seconds, tail, report)


def classify(code: int | None, seconds: float, tail: str, report: dict) -> Outcome:
    """The outcome of one run from its exit code (None: timed out), the end of its output
    and what the child plugin wrote (``child._Verdict``)."""
    counts = report.get("counts", {})
    first = report.get("first_failure")
    if code is None:
        return Outcome("timeout", seconds, detail="outlived its time limit", counts=counts)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        test = first["test"] if first else report.get("running")
        return Outcome("killed", seconds, killed_by=test or f"the worker died of {name}",
                       detail=f"the pytest process died of {name}", counts=counts)
    if code == 0:
        if report.get("mutated_file_imported") is False:
            return Outcome("error", seconds, detail="the mutated file was never imported", counts=counts)
        if not counts.get("passed"):
            return Outcome("error", seconds, detail="no check ran (all skipped or none selected)", counts=counts)
        return Outcome("survived", seconds, counts=counts)
    if code == 1 and first:
        detail = f"{first['error']}: {first['message']}" if first.get("error") else first.get("message", "")
        if first.get("refused_by"):
            return Outcome("invalid", seconds, detail=f"Triton refused the code ({first['refused_by']}): {detail}",
                           counts=counts)
        return Outcome("killed", seconds, killed_by=first["test"], detail=detail, counts=counts)
    return Outcome("error", seconds, detail=f"pytest exited with {code}: {tail.strip().splitlines()[-1:] or ''}",
                   counts=counts)


def make_workspaces(root: Path, jobs: int) -> tuple[list[Workspace], Path]:
    """``jobs`` copies of the project under one new temporary directory (returned too)."""
    parent = Path(tempfile.mkdtemp(prefix="fla-mutate-"))
    files = project_files(root)
    return [Workspace(root, files, parent, i) for i in range(jobs)], parent
