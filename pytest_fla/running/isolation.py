"""Running tests in child processes, so that a fault fails only the test that caused it.

A device fault (illegal address, device-side assert) leaves the CUDA context unusable
for every later test in the process, and a compiler assertion aborts the process. The
parent runs a batch of tests (one test, or one module) in a child pytest, which
streams each test's reports to a file as it goes. When the child dies, or stops
after a device fault, the test it was running fails with the end of its stderr, and
the rest of the batch goes on in a fresh child. The parent then replays the reports
as if the tests had run in-process, so terminal output, ``--junitxml`` and xdist see
ordinary reports.

The child side is ``ChildReporter``, installed by the plugin under ``--fla-child``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .. import environment
from ..report import PARTS_PROPERTY, annotate, timing_properties

STDERR_TAIL_LINES = 40
EXIT_DEVICE_FAULT = 86
BEGIN_MARK = "=== fla: running "  # written to the child's stdout and stderr as each test starts
END_MARK = "=== fla: batch done"  # and to its stdout after the last one
LAUNCHES_PROPERTY = "fla_triton_launches"


@dataclass
class ChildTime:
    """Wall seconds of the child processes that ran a test, and where they went: its share
    of each child's start-up and exit, and parts of its own work (``time_split``)."""

    seconds: float = 0.0  # all of it: start-up included, which is most of an isolated run's cost
    # before the child's first test (the interpreter, imports, collection; under the tool,
    # the tool's start too) and after its last (exit)
    startup: float = 0.0
    exit: float = 0.0
    # in the test itself: part name -> seconds (compiling and loading kernels, the reference)
    parts: dict = field(default_factory=dict)
    # of the start-up, the collection (from pytest's configuration to the tests collected):
    # the rest is the interpreter, pytest's and the plugins' imports (and the tool's start)
    collecting: float = 0.0

    def __add__(self, other: "ChildTime") -> "ChildTime":
        parts = dict(self.parts)
        for name, seconds in other.parts.items():
            parts[name] = parts.get(name, 0.0) + seconds
        return ChildTime(self.seconds + other.seconds, self.startup + other.startup, self.exit + other.exit, parts,
                         self.collecting + other.collecting)


@dataclass
class ItemOutcome:
    """What a child run left for one test: its reports, and the child's output."""

    reports: list = field(default_factory=list)  # serialized report dicts
    died: str | None = None  # why the child died while running this test
    stderr_tail: str = ""
    stdout: str = ""  # the child's whole stdout (the sanitizer writes its report there)
    exit_code: int | None = None  # of the child's process (under the sanitizer, the tool's)
    verdict: object = None  # under --fla-sanitizer: a sanitizer.reruns.Verdict
    time: ChildTime = field(default_factory=ChildTime)
    stalls: list = field(default_factory=list)  # where its child waited, each time it stalled
    # Finished in a child that was then killed for a stall: its own part of the output is
    # whole, though the output as a whole ends without the tool's summary.
    cut_after: bool = False

    def triton_launches(self) -> int | None:
        """How many Triton kernels the test launched (None if not counted)."""
        for report in self.reports:
            if report.get("when") == "call":
                for name, value in report.get("user_properties", ()):
                    if name == LAUNCHES_PROPERTY:
                        return value
        return None


def child_command(config, results_dir: Path, paths: list[str]) -> list[str]:
    """A pytest command line for the child: the parent's plugins and ini options, no xdist."""
    args = [sys.executable, "-m", "pytest", f"--fla-child={results_dir}", "-p", "no:xdist", "-p", "no:cacheprovider"]
    args += ["--rootdir", str(config.rootpath), "--capture=tee-sys", "-q", "--no-header", "-o", "console_output_style=classic"]
    if config.inipath:
        args += ["-c", str(config.inipath)]
    invocation = list(config.invocation_params.args)
    for i, arg in enumerate(invocation):
        # Options that change how a test runs, not which tests run or how the run reports.
        if arg in ("-p", "-o", "-W") and i + 1 < len(invocation):
            if not invocation[i + 1].startswith(("xdist", "no:xdist")):
                args += [arg, invocation[i + 1]]
        elif arg.startswith(("--tb", "--fla-blocking", "-W")) or (arg.startswith("-p") and len(arg) > 2):
            args.append(arg)
    if config.getoption("fla_impl", None):
        # which implementation the specs call: the child's tests have the same ids either way
        args.append(f"--fla-impl={config.getoption('fla_impl')}")
    return args + paths


BYTECODE_CACHE = "pytest-fla-pycache"


def bytecode_cache(environ, package: str = "torch") -> dict[str, str]:
    """Environment that lets children keep compiled bytecode between them.

    Every child imports torch, triton and the library afresh. Where bytecode is not
    written (``PYTHONDONTWRITEBYTECODE``, set on the H100 test machine) and torch was
    installed without it, each child compiled about 1400 modules from source: 5 s of its
    start-up, most of what a batch of small tests under the sanitizer costs. The children
    then write theirs to one cache in the temp directory (``PYTHONPYCACHEPREFIX``), not
    beside the sources, which is what that setting keeps clean. Where bytecode is written,
    or was installed with ``package`` (pip compiles what it installs; a prefix would
    hide it), or a prefix was chosen, nothing changes.
    """
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return {}
    if installed_with_bytecode(package):
        return {}
    return {"PYTHONPYCACHEPREFIX": os.path.join(tempfile.gettempdir(), BYTECODE_CACHE), "PYTHONDONTWRITEBYTECODE": ""}


def installed_with_bytecode(package: str) -> bool:
    """Whether ``package`` has compiled bytecode beside its ``__init__`` (found, not imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def run_batch(config, items, wrapper: list[str] | None = None, env: dict | None = None,
              stall_seconds: float | None = None) -> dict:
    """Run ``items`` in child processes; returns nodeid -> ItemOutcome, in order.

    ``wrapper`` prefixes the command (compute-sanitizer); ``env`` adds variables. With
    ``stall_seconds``, a child that makes no progress that long is killed
    (``pytest_fla.running.stall``) and the test it stopped at runs once more in a fresh child; a
    second stall fails it, with where the processes waited.
    """
    outcomes = {item.nodeid: ItemOutcome() for item in items}
    remaining = [item.nodeid for item in items]
    by_id = {item.nodeid: item for item in items}
    child_env = dict(os.environ, **bytecode_cache(os.environ), **(env or {}))
    stalled_once: set[str] = set()
    while remaining:
        with tempfile.TemporaryDirectory(prefix="fla-child-") as tmp:
            results_dir = Path(tmp)
            (results_dir / "items.txt").write_text("\n".join(remaining) + "\n")
            paths = sorted({str(by_id[n].path) for n in remaining})
            command = (wrapper or []) + child_command(config, results_dir, paths)
            with open(results_dir / "stdout", "w+b") as out, open(results_dir / "stderr", "w+b") as err:
                spawned = time.time()
                code, stall = _run_child(command, out, err, child_env, config.invocation_params.dir,
                                         results_dir / "results.jsonl", stall_seconds)
                ended = time.time()
                out.seek(0)
                err.seek(0)
                stdout = out.read().decode(errors="replace")
                stderr = err.read().decode(errors="replace")
            events = _read_events(results_dir / "results.jsonl")
        startup, exiting = phases(events, spawned, ended)
        collecting = collection_seconds(events, startup)
        began = [e["begin"] for e in events if "begin" in e]
        finished = set()
        for event in events:
            if "report" in event:
                report = event["report"]
                outcome = outcomes[event["nodeid"]]
                outcome.reports.append(report)
                if report["when"] == "call":
                    parts = dict(report.get("user_properties") or ()).get(PARTS_PROPERTY) or {}
                    outcome.time += ChildTime(parts=parts)
                if report["when"] == "teardown":
                    finished.add(event["nodeid"])
        for nodeid in remaining:
            outcome = outcomes[nodeid]
            outcome.stdout = stdout
            outcome.exit_code = code
            outcome.time.seconds += (ended - spawned) / len(remaining)
            outcome.time.startup += startup / len(remaining)
            outcome.time.exit += exiting / len(remaining)
            outcome.time.collecting += collecting / len(remaining)
        unfinished = [n for n in remaining if n not in finished]
        if not unfinished:
            break
        culprit = next((n for n in began if n not in finished), None)
        if stall:
            for nodeid in finished:
                outcomes[nodeid].cut_after = True
            stopped_at = culprit or unfinished[0]
            outcomes[stopped_at].stalls.append(stall)
            if stopped_at not in stalled_once:
                stalled_once.add(stopped_at)
                remaining = unfinished[unfinished.index(stopped_at):]
                continue
            outcomes[stopped_at].died = f"the test process stalled twice ({stall_seconds:.0f} s without progress)"
            outcomes[stopped_at].stderr_tail = "\n\n".join(outcomes[stopped_at].stalls) + "\n" + _tail(
                _since_mark(stderr, stopped_at))
            remaining = unfinished[unfinished.index(stopped_at) + 1:]
            continue
        if culprit is None:
            if code == EXIT_DEVICE_FAULT and began:
                remaining = unfinished
                continue
            # The child died before starting any test left: every one of them fails with it.
            for nodeid in unfinished:
                outcomes[nodeid].died = _exit_reason(code) + " before the test started"
                outcomes[nodeid].stderr_tail = _tail(stdout + stderr)
            break
        outcomes[culprit].died = _exit_reason(code)
        outcomes[culprit].stderr_tail = _tail(_since_mark(stderr, culprit))
        remaining = unfinished[unfinished.index(culprit) + 1 :]
    return outcomes


def phases(events: list[dict], spawned: float, ended: float) -> tuple[float, float]:
    """(start-up, exit) seconds of a child that ran from ``spawned`` to ``ended`` (epoch
    seconds): until its tests were collected (its ``ready`` event), and after its session
    finished (``done``). A child that never got ready spent all of it starting up."""
    ready = next((e["ready"] for e in events if "ready" in e), None)
    done = next((e["done"] for e in events if "done" in e), None)
    if ready is None:
        return ended - spawned, 0.0
    startup = min(max(ready - spawned, 0.0), ended - spawned)
    return startup, (min(max(ended - done, 0.0), ended - spawned - startup) if done is not None else 0.0)


def collection_seconds(events: list[dict], startup: float) -> float:
    """Of a child's ``startup`` seconds, those from its pytest's configuration
    (``configured``) to its tests' collection (``ready``); 0 without both."""
    configured = next((e["configured"] for e in events if "configured" in e), None)
    ready = next((e["ready"] for e in events if "ready" in e), None)
    if configured is None or ready is None:
        return 0.0
    return min(max(ready - configured, 0.0), startup)


def _run_child(command, out, err, env, cwd, progress: Path, stall_seconds: float | None) -> tuple[int, str | None]:
    """(exit code, None) once the child exits; (its code after the kill, where it waited)
    when it stalled."""
    if not stall_seconds:
        with stacks_signal_held():
            process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        with process:  # as subprocess.call: an interrupted wait kills the child
            try:
                return process.wait(), None
            except BaseException:
                process.kill()
                raise
    from . import stall

    # a session of its own, so that a stall kills the tool and the test process together
    with stacks_signal_held():
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True)
    try:
        found = stall.wait(process, progress, stall_seconds, python_marker="--fla-child=")
    except BaseException:  # interrupted (the run's limit): the child goes with the parent
        stall.kill(process)
        raise
    return process.returncode, found


@contextlib.contextmanager
def stacks_signal_held():
    """Processes started inside start with SIGUSR1 blocked (a signal mask is inherited across
    fork and exec), and the child unblocks it once its stack dump is registered
    (:func:`dump_stacks_on_signal`): a SIGUSR1 that comes sooner (a tool asking every child for
    its stacks while one is still importing) waits for the handler instead of killing the
    child by the signal's default action."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def dump_stacks_on_signal() -> None:
    """SIGUSR1 writes every thread's Python stack to stderr (the fd: pytest replaces
    sys.stderr); then the signal is unblocked (:func:`stacks_signal_held`)."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def _read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a child killed mid-write
            break
    return events


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"the test process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the test process was killed by signal {-code}"
    if code == EXIT_DEVICE_FAULT:
        return "the test process stopped after a device fault"
    return f"the test process exited with code {code}"


def _since_mark(stderr: str, nodeid: str) -> str:
    mark = BEGIN_MARK + nodeid
    index = stderr.rfind(mark)
    return stderr[index + len(mark) :] if index >= 0 else stderr


def test_output(stdout: str, nodeid: str) -> str | None:
    """What a child wrote to its stdout while ``nodeid`` ran: from its start mark to the
    next test's (or the batch's end). A sanitizer's report of a kernel lands there, since
    launches are blocking under the tool. None if the test never started in it."""
    start = stdout.find(f"{BEGIN_MARK}{nodeid}\n")
    if start < 0:
        return None
    ends = [i for i in (stdout.find(BEGIN_MARK, start + 1), stdout.find(END_MARK, start)) if i >= 0]
    return stdout[start : min(ends)] if ends else stdout[start:]


def _tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def replay(item, outcome: ItemOutcome, extra_failure: str | None = None, section: tuple | None = None,
           tool_time: ChildTime | None = None) -> None:
    """Log ``outcome``'s reports for ``item`` in this process, as if it had run here.

    A test whose child died gets a failed call report with the end of its stderr;
    ``extra_failure`` (a sanitizer finding) turns a passing call into a failure. The call
    report carries the wall time of the test's child processes, which its own duration
    leaves out, and where it went (``report.timing_properties``), the tool's children's
    (``tool_time``) apart.
    """
    from _pytest.reports import TestReport

    config = item.config
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = [_from_json(config, data) for data in outcome.reports]
    whens = {r.when for r in reports}
    if outcome.died:
        text = f"{outcome.died} while running this test.\nLast lines of its stderr:\n{outcome.stderr_tail}"
        if "setup" not in whens:
            reports.append(_synthetic(TestReport, item, "setup", "passed", None))
        reports = [r for r in reports if r.when == "setup"]
        reports.append(_synthetic(TestReport, item, "call", "failed", text))
        reports.append(_synthetic(TestReport, item, "teardown", "passed", None))
    elif extra_failure:
        for i, report in enumerate(reports):
            if report.when == "call" and report.outcome == "passed":
                failed = _synthetic(TestReport, item, "call", "failed", extra_failure)
                failed.duration = report.duration
                failed.sections = list(report.sections)
                reports[i] = failed
    if section:
        for report in reports:
            if report.when == "call":
                report.sections.append(section)
    timed = next((r for r in reports if r.when == "call"), reports[-1] if reports else None)
    if timed is not None:
        timing = timing_properties(outcome.time, tool_time or ChildTime())
        # the child's own measures of this run give way to the totals over every run of it
        timed.user_properties = [(n, v) for n, v in timed.user_properties if n not in timing] + list(timing.items())
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _from_json(config, data: dict):
    report = config.hook.pytest_report_from_serializable(config=config, data=data)
    # A skip's longrepr is a (path, line, reason) tuple, which the terminal asserts on;
    # JSON brought it back as a list (xdist's channel keeps tuples, JSON does not).
    if isinstance(report.longrepr, list):
        report.longrepr = tuple(report.longrepr)
    return report


def _synthetic(report_class, item, when: str, outcome: str, longrepr):
    report = report_class(
        nodeid=item.nodeid,
        location=item.location,
        keywords={name: 1 for name in item.keywords},
        outcome=outcome,
        longrepr=longrepr,
        when=when,
        sections=[],
        duration=0.0,
        start=time.time(),
        stop=time.time(),
        user_properties=list(item.user_properties),
    )
    annotate(item, report)
    return report


class ChildReporter:
    """The child's side: run only the listed tests, stream their reports, stop after a fault."""

    def __init__(self, config, results_dir: str):
        self.config = config
        self.results_dir = Path(results_dir)
        self.wanted = (self.results_dir / "items.txt").read_text().split()
        self.out = open(self.results_dir / "results.jsonl", "a", buffering=1)
        # made in pytest_configure: before it, the interpreter and the imports; after, collection
        self._write({"configured": time.time()})
        self.faulted: set[str] = set()
        # Under --fla-sanitizer the parent asks how many Triton kernels each test launched
        # (a test that launched none has nothing of the kernels under test to sanitize).
        self.count_launches = os.environ.get(environment.COUNT_LAUNCHES) == "1"
        # A child that stops making progress (seen under compute-sanitizer: children waiting
        # at their first test with the CPU and the GPU idle) shows where it waits: SIGUSR1
        # writes every thread's Python stack to its stderr, which the parent keeps.
        dump_stacks_on_signal()

    def _write(self, event: dict) -> None:
        self.out.write(json.dumps(event) + "\n")
        self.out.flush()

    def pytest_collection_modifyitems(self, config, items):
        order = {nodeid: i for i, nodeid in enumerate(self.wanted)}
        kept = sorted((item for item in items if item.nodeid in order), key=lambda item: order[item.nodeid])
        dropped = [item for item in items if item.nodeid not in order]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def pytest_collection_finish(self, session):
        # the parent splits the child's time: start-up until here, the tests, exit after "done"
        self._write({"ready": time.time()})

    def pytest_runtest_logstart(self, nodeid, location):
        self._write({"begin": nodeid})
        # Into the raw stderr too, so that a crash's stderr can be cut at this test.
        os.write(2, f"\n{BEGIN_MARK}{nodeid}\n".encode())
        sys.stdout.flush()
        os.write(1, f"\n{BEGIN_MARK}{nodeid}\n".encode())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        # A device fault is sticky: the synchronize after the test fails if anything in it
        # faulted, whether or not the test itself noticed.
        counting = contextlib.nullcontext(None)
        if self.count_launches:
            from .launches import observe_launches

            counting = observe_launches()
        try:
            with counting as launches:
                result = yield
                if launches is not None:
                    item.user_properties.append((LAUNCHES_PROPERTY, launches.count))
        except BaseException:
            if device_fault():
                self.faulted.add(item.nodeid)
            raise
        fault = device_fault()
        if fault:
            self.faulted.add(item.nodeid)
            raise DeviceFault(f"the device faulted during this test (found at the synchronize after it): {fault}")
        return result

    def pytest_sessionfinish(self):
        if not self.out.closed:
            self._write({"done": time.time()})
        sys.stdout.flush()
        os.write(1, f"\n{END_MARK}\n".encode())

    def pytest_runtest_logreport(self, report):
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self._write({"nodeid": report.nodeid, "report": data})
        if report.when == "teardown" and report.nodeid in self.faulted:
            # The context is gone: every later test here would fail for no fault of its own.
            self.out.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_DEVICE_FAULT)


class DeviceFault(RuntimeError):
    pass


def device_fault() -> str | None:
    """Synchronize the device, if this process used it; the error text if it faulted."""
    torch = sys.modules.get("torch")
    # a process with no device has no context to lose (and a test may fake an initialized one)
    if torch is None or not torch.cuda.is_initialized() or not torch.cuda.is_available():
        return None
    try:
        torch.cuda.synchronize()
    except RuntimeError as error:  # torch's CUDA errors (AcceleratorError among them): a lost context
        return str(error).strip().splitlines()[0]
    return None
