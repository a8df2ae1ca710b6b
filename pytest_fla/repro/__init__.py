"""Bug reports as tests: every ``*.py`` file in a ``repro`` directory is one test.

A reproducer is a user's code with a short header of ``# key: value`` lines::

    # source: where the report came from (an issue, a message)
    # seen-on: sm90
    # expect: pass                       (or: raises ValueError: <regex>)
    # expect-sm86: raises ...            (optional: a different outcome on one arch)
    # op: chunk_simple_gla               (optional: the op, for the report matrix)
    # needs: device                      (device: runs kernels, the interpreter too;
                                          gpu: a real or emulated GPU; compiler: compiles
                                          kernels offline)
    # plain-under-sanitizer: <why>       (optional: under --fla-sanitizer it runs plainly
                                          only, as a ``fla_plain_only`` check does, unless
                                          --fla-sanitizer-all-tests)
    # requires: fla-core>=0.4.0          (optional: a distribution the reproducer calls,
                                          and the first release with its op: skipped, with
                                          the installed release, where it is absent or older)

It always runs in a fresh process (a reproducer is often the very crash the suite
guards against), under the session's arch target, ``--fla-blocking`` and
``--fla-sanitizer``. ``python -m pytest_fla new-repro NAME`` writes a new one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .. import environment, sanitizer, targets
from ..sanitizer import reruns
from ..running.devices import is_interpreter
from ..running.isolation import device_fault

HEADER_RE = re.compile(r"^#\s*([a-z][a-z0-9-]*)\s*:\s*(.*?)\s*$")
EXPECT_RE = re.compile(r"^(?:pass|raises\s+(?P<exc>[A-Za-z_][\w.]*)\s*:\s*(?P<pattern>.+))$")
REQUIRED = ("source", "seen-on", "expect")
NEEDS = ("device", "gpu", "compiler")
REQUIRES_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)\s*(?:>=\s*(?P<least>\d+(?:\.\d+)*))?$")
OUTPUT_TAIL_LINES = 40


class ReproHeaderError(ValueError):
    pass


@dataclass
class Header:
    fields: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, path: str = "") -> "Header":
        fields = {}
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            match = HEADER_RE.match(line)
            if match:
                fields[match.group(1)] = match.group(2)
        missing = [key for key in REQUIRED if key not in fields]
        if missing:
            raise ReproHeaderError(
                f"{path}: the reproducer's header lacks {', '.join(missing)}; it starts with lines like\n"
                "# source: <where the report came from>\n# seen-on: sm90\n# expect: pass"
            )
        for key, value in fields.items():
            if key == "expect" or key.startswith("expect-"):
                if not EXPECT_RE.match(value):
                    raise ReproHeaderError(f"{path}: `{key}: {value}` must be `pass` or `raises <Exception>: <regex>`")
        if fields.get("needs", "device") not in NEEDS:
            raise ReproHeaderError(f"{path}: `needs` must be one of {', '.join(NEEDS)}")
        if "requires" in fields and not REQUIRES_RE.match(fields["requires"]):
            raise ReproHeaderError(f"{path}: `requires: {fields['requires']}` must be `<distribution>` or "
                                   "`<distribution>>=<release>`")
        return cls(fields)

    def missing_requirement(self) -> str | None:
        """Why the reproducer cannot run here (its ``requires`` distribution absent, or a
        release older than the one its op appeared in), or None."""
        from importlib import metadata

        if "requires" not in self.fields:
            return None
        match = REQUIRES_RE.match(self.fields["requires"])
        name, least = match.group("name"), match.group("least")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            return f"calls {name}, which is not installed"
        if least and release_key(installed) < release_key(least):
            return f"{name} {installed} lacks what it calls (first in {least})"
        return None


    def expectation(self, target_name: str | None) -> str:
        return self.fields.get(f"expect-{target_name}", self.fields["expect"])

    @property
    def needs(self) -> str:
        return self.fields.get("needs", "device")


def release_key(version: str) -> tuple:
    """``"0.4.2"`` -> ``(0, 4, 2)``, for ordering releases (a suffix such as ``.dev1`` is dropped)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def child_import_path(config) -> str:
    """``PYTHONPATH`` for a reproducer's process: the run's rootdir and the ``pythonpath``
    ini entries, where the test process imports the project under test from (a package
    checked from its own checkout, not installed), then the inherited path."""
    entries = [str(config.rootpath), *(str(path) for path in config.getini("pythonpath"))]
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join(entries + ([inherited] if inherited else []))


class ReproFile(pytest.File):
    def collect(self):
        header = Header.parse(self.path.read_text(), str(self.path))
        item = ReproItem.from_parent(self, name=self.path.stem, header=header)
        item.add_marker(pytest.mark.fla_op(header.fields.get("op", self.path.stem)))
        if "plain-under-sanitizer" in header.fields:
            item.add_marker(pytest.mark.fla_plain_only(reason=header.fields["plain-under-sanitizer"]))
        yield item


class ReproItem(pytest.Item):
    fla_check = "repro"

    def __init__(self, *, header: Header, **kwargs):
        super().__init__(**kwargs)
        self.header = header

    def runtest(self):
        missing = self.header.missing_requirement()
        if missing:
            pytest.skip(missing)
        target = targets.run_target(self.config)
        mode = target.mode if target else None
        if self.header.needs in ("device", "gpu") and mode == targets.COMPILE_ONLY:
            pytest.skip(f"runs kernels; {target.name} is compile-only here")
        if self.header.needs == "gpu" and mode == targets.INTERPRETER:
            pytest.skip("needs a GPU (real or emulated); the CPU interpreter cannot show it")
        if self.header.needs == "compiler" and mode == targets.INTERPRETER:
            pytest.skip("compiles kernels offline; the interpreter builds no GPU code")
        expect = self.header.expectation(target.name if target else None)
        command = [sys.executable, "-m", "pytest_fla", "run-repro", str(self.path), "--expect", expect]
        env = dict(os.environ, PYTHONPATH=child_import_path(self.config))
        if self.config.getoption("fla_blocking"):
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=self.path.parent)
        if run.returncode == EXIT_CANNOT_RUN:
            pytest.skip(run.stdout.strip().splitlines()[-1])
        if run.returncode != 0:
            raise ReproFailed(self._describe(run, "does not behave as its header expects"))
        tools = self.config.stash.get(SANITIZER_TOOLS, [])
        if tools and self.get_closest_marker(reruns.PLAIN_ONLY) and not self.config.option.fla_sanitizer_all_tests:
            self.add_report_section("call", "compute-sanitizer", reruns.plain_only_reason(self))
            tools = []
        for tool in tools:
            checked = subprocess.run(
                sanitizer.command(tool) + command, capture_output=True, text=True,
                env=dict(env, **sanitizer.environment()), cwd=self.path.parent,
            )
            result = sanitizer.parse(tool, checked.stdout, checked.returncode)
            # the tool's own exit code (255) stands in for the program's when it made no CUDA
            # call; the plain run above already showed the program behaves
            if not result.clean or (checked.returncode != 0 and not result.untouched):
                raise ReproFailed(f"{result.describe()}\n{self._describe(checked, 'under ' + tool)}")

    def _describe(self, run, what: str) -> str:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-OUTPUT_TAIL_LINES:])
        return f"{self.path.name} {what} (exit {run.returncode}); last lines of its output:\n{tail}"

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ReproFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"repro: {self.path.name} (seen on {self.header.fields['seen-on']})"


class ReproFailed(AssertionError):
    pass


SANITIZER_TOOLS = pytest.StashKey[list]()


def is_repro_file(file_path: Path) -> bool:
    return (
        file_path.suffix == ".py"
        and file_path.parent.name == "repro"
        and not file_path.name.startswith(("_", "test_", "conftest"))
    )


# A reproducer whose kernels Triton's CPU interpreter cannot run (a construct it lacks, or no
# driver where the code asks for the GPU's) shows nothing of its defect here: a skip, saying so
CANNOT_RUN = "Triton's CPU interpreter cannot run this reproducer's kernels (a GPU can)"
EXIT_CANNOT_RUN = 4


def interpreter_cannot_run(raised: BaseException) -> bool:
    """An error of the interpreter itself, not a kernel's access out of bounds (its memcheck)
    nor the reproducer's own assertion."""
    from ..report.verdicts import faulted

    if faulted(raised) or isinstance(raised, AssertionError):
        return False
    names = {cls.__name__ for cls in type(raised).__mro__}
    return "InterpreterError" in names or "active drivers" in str(raised)


def run_repro(path: str, expect: str) -> int:
    """Run a reproducer's code in this process and compare what happens with ``expect``.

    Exit 0 when it behaves as expected; otherwise print why and exit 1.
    """
    match = EXPECT_RE.match(expect)
    if match is None:
        print(f"bad expectation {expect!r}")
        return 2
    import runpy

    if is_interpreter():  # as in the suite's processes
        from ..sanitizer import interpreter as interpreter_memcheck

        interpreter_memcheck.install_process_fixes()
    elif os.environ.get(environment.AUTOTUNE) == "first":  # the run's --fla-autotune=first, as in its tests
        from ..targets import autotune

        autotune.install_first_that_runs()
    sys.path.insert(0, str(Path(path).parent))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as error:
        raised = None if error.code in (0, None) else error
    except BaseException as error:  # noqa: BLE001 - compared with the expectation below
        raised = error
    else:
        raised = None
    fault = device_fault()
    if fault:
        print(f"the device faulted: {fault}")
        return 1
    if raised is not None and is_interpreter() and interpreter_cannot_run(raised):
        print(f"{CANNOT_RUN}: {type(raised).__name__}: {str(raised).strip().splitlines()[0][:300]}")
        return EXIT_CANNOT_RUN
    if match.group("exc") is None:
        if raised is not None:
            traceback.print_exception(raised)
            print(f"expected the reproducer to pass; it raised {type(raised).__name__}")
            return 1
        print("passed, as expected")
        return 0
    names = {cls.__name__ for cls in type(raised).__mro__} if raised is not None else set()
    wanted, pattern = match.group("exc").split(".")[-1], match.group("pattern")
    if raised is None:
        print(f"expected {wanted} matching {pattern!r}; the reproducer raised nothing")
        return 1
    if wanted not in names or not re.search(pattern, str(raised)):
        traceback.print_exception(raised)
        print(f"expected {wanted} matching {pattern!r}; got {type(raised).__name__}: {raised}")
        return 1
    print(f"raised as expected: {type(raised).__name__}: {raised}")
    return 0


TEMPLATE = '''\
# source: {source}
# seen-on: {seen_on}
# expect: {expect}
# op: {op}
# needs: device
"""{name}: what the user saw, in one or two sentences."""

import torch

from pytest_fla.repro_helpers import session_device

device = session_device()
# The user's code, as reported, on `device`:
'''


def new_repro(name: str, directory: Path, source: str, seen_on: str, expect: str, op: str) -> Path:
    """Write a reproducer scaffold ``directory/name.py``; refuses to overwrite."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise ValueError(f"repro name {name!r} must be a Python identifier (letters, digits, _)")
    if not EXPECT_RE.match(expect):
        raise ValueError(f"--expect {expect!r} must be `pass` or `raises <Exception>: <regex>`")
    path = directory / f"{name}.py"
    if path.exists():
        raise FileExistsError(f"{path} exists")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(TEMPLATE.format(source=source, seen_on=seen_on, expect=expect, op=op, name=name))
    return path
