"""--fla-isolate: a process abort fails only its own test, with the end of its stderr,
and the run goes on (per test, and per module with a fresh process after the crash)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from plugin_testing import run

PROJECT = '''
import os, sys, pytest

def test_before():
    pass

def test_abort():
    sys.stderr.write("Assertion `isa<LayoutAttr>' failed (stands in for a Triton compiler assertion)\\n")
    sys.stderr.flush()
    os.abort()

def test_after():
    assert os.getpid() != int(os.environ.get("FLA_TEST_PARENT_PID", "0"))

def test_ordinary_failure():
    assert 1 == 2

def test_skipped():
    pytest.skip("needs 3 GB")

@pytest.mark.xfail(reason="known off-by-one", strict=True)
def test_expected_failure():
    assert 1 == 2
'''


@pytest.mark.parametrize("granularity", ["test", "module"])
def test_an_abort_fails_only_its_own_test(pytester, granularity, monkeypatch):
    import os

    monkeypatch.setenv("FLA_TEST_PARENT_PID", str(os.getpid()))
    pytester.makepyfile(test_crash=PROJECT)
    # -v and -rsx: the terminal reads a skip's reason from its report, as xdist-free pytest made it
    result = run(pytester, f"--fla-isolate={granularity}", "-v", "-rsx")
    result.assert_outcomes(passed=2, failed=2, skipped=1, xfailed=1)
    out = result.stdout.str()
    assert "test_crash.py::test_abort FAILED" in out
    assert "test_crash.py::test_after PASSED" in out
    assert "killed by SIGABRT while running this test" in out
    assert "Assertion `isa<LayoutAttr>' failed" in out  # the end of its stderr
    assert "assert 1 == 2" in out  # ordinary failures keep their own report
    result.stdout.re_match_lines([r"SKIPPED \[1\] test_crash.py:\d+: needs 3 GB"])
    assert "XFAIL test_crash.py::test_expected_failure - known off-by-one" in out


def test_without_isolation_an_abort_ends_the_run(pytester):
    pytester.makepyfile(test_crash=PROJECT)
    result = run(pytester, "--fla-isolate=none")
    assert result.ret not in (0, 1)  # the whole process died: no test after it ran
    assert "Fatal Python error: Aborted" in result.stderr.str()


RUN_LOG_PROJECT = '''
import os, pytest

@pytest.mark.parametrize("i", range(8))
def test_logged(i):
    with open(os.environ["FLA_TEST_RUN_LOG"], "a") as f:
        f.write(f"{i}\\n")
'''


def test_module_batches_under_xdist_run_each_test_once(pytester, monkeypatch):
    """Every xdist worker collects the whole session: a module batch made of the module's
    items (not the worker's) ran each test once per worker."""
    log = pytester.path / "runs.log"
    monkeypatch.setenv("FLA_TEST_RUN_LOG", str(log))
    pytester.makepyfile(test_logged=RUN_LOG_PROJECT)
    result = run(pytester, "--fla-isolate=module", "-n", "2")
    result.assert_outcomes(passed=8)
    assert sorted(log.read_text().split(), key=int) == [str(i) for i in range(8)]


SLOW_START_PROJECT = '''
import time

time.sleep(1.0)  # stands in for a child's imports and collection


def test_takes_a_while():
    time.sleep(0.5)
'''


def test_the_report_splits_a_childs_time_into_start_up_tests_and_exit(pytester):
    """Where an isolated run's time goes: the child's time before its first test (imports,
    collection) and after its last, apart from the tests, per test and summed in one line."""
    pytester.makepyfile(test_slow_start=SLOW_START_PROJECT)
    result = run(pytester, "--fla-isolate=test", "-p", "no:xdist", "--fla-report=report.json")
    result.assert_outcomes(passed=1)
    (timed,) = json.loads((pytester.path / "report.json").read_text())["tests"]
    startup, exiting, total = timed["startup_seconds"], timed["exit_seconds"], timed["process_seconds"]
    assert 1.0 <= startup < total - 0.5  # the module's sleep at import, not the test's
    assert 1.0 <= timed["collect_seconds"] <= startup  # the import was the collection's
    assert 0 <= exiting < total - startup - 0.5
    assert timed["sanitizer_startup_seconds"] == 0  # no tool ran
    assert re.search(r"child processes: [\d.]+s in all; [\d.]+s \(\d+%\) starting up before their first test "
                     r"\([\d.]+s \(\d+%\) the interpreter and imports, [\d.]+s \(\d+%\) collection\), "
                     r"[\d.]+s \(\d+%\) in the tests", result.stdout.str())


KERNEL_SOURCE = '''
import triton.language as tl
from triton.runtime.jit import JITFunction


def _fill(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), tl.arange(0, BLOCK))


fill = JITFunction(_fill)  # jitted even where the plugin chose the interpreter (no GPU here)
'''

KERNEL_TIME_PROJECT = '''
import time


def test_compiles_and_loads():
    # Triton's first import in this child is here, in a test, as a kernel library's often is
    import triton.compiler
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import CompiledKernel

    from kernel_source import fill

    # a cache miss, compiled for a card this machine need not have (as a launch would compile
    # for its own)
    source = triton.compiler.ASTSource(fill, {"x": "*i32"}, {"BLOCK": 64})
    triton.compiler.compile(source, target=GPUTarget("cuda", 80, 32))

    class Loading:  # stands in for a compiled kernel whose module load takes 0.3 s
        @property
        def module(self):
            time.sleep(0.3)
            return "loaded"

    CompiledKernel._init_handles(Loading())


def test_neither():
    time.sleep(0.2)
'''


def test_the_report_times_each_tests_compiles_and_kernel_loads(pytester, monkeypatch):
    """Of a test's time, how much went to Triton's compile (a cold cache, or the tool's
    small shapes after the plain run's) and to loading kernels onto the device (which the
    sanitizer instruments): measured in the child from Triton's import on, per test, summed
    in the last line."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(pytester.path / "triton-cache"))  # a cold cache
    pytester.makepyfile(kernel_source=KERNEL_SOURCE, test_kernel_time=KERNEL_TIME_PROJECT)
    result = run(pytester, "--fla-isolate=module", "-p", "no:xdist", "--fla-report=report.json")
    result.assert_outcomes(passed=2)
    timed = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "report.json").read_text())["tests"]}
    both = timed["test_compiles_and_loads"]
    # under the test's own time: its process's time is shared out evenly over the module's
    # tests, so a test that compiles more than its share would overrun that
    assert 0.05 < both["parts_seconds"]["compiling"] < both["duration"]
    assert 0.3 <= both["parts_seconds"]["loading"] < 0.6  # the stand-in's sleep, counted once
    assert timed["test_neither"]["parts_seconds"] == {}
    assert both["sanitizer_parts_seconds"] == {}  # no tool ran
    assert re.search(r"in the tests \(of which [\d.]+s \(\d+%\) compiling kernels, [\d.]+s \(\d+%\) loading kernels\)",
                     result.stdout.str())
    assert (both["parts_seconds"]["compiles"], both["parts_seconds"].get("compiles_from_cache", 0)) == (1, 0)
    assert "; 1 compile, 0 of them from Triton's cache" in result.stdout.str()
    # the same run on the cache the first filled: the compile is Triton's cache's, and quick
    again = run(pytester, "--fla-isolate=module", "-p", "no:xdist", "--fla-report=again.json")
    again.assert_outcomes(passed=2)
    (warm,) = [t for t in json.loads((pytester.path / "again.json").read_text())["tests"]
               if t["nodeid"].endswith("test_compiles_and_loads")]
    assert (warm["parts_seconds"]["compiles"], warm["parts_seconds"]["compiles_from_cache"]) == (1, 1)
    assert warm["parts_seconds"]["compiling"] < both["parts_seconds"]["compiling"]
    assert "; 1 compile, 1 of them from Triton's cache" in again.stdout.str()


@pytest.mark.parametrize("events, split", [
    ([{"ready": 12.0}, {"begin": "t"}, {"done": 19.0}], (2.0, 1.0)),
    ([], (10.0, 0.0)),  # died (or was killed) before its tests were collected
    ([{"ready": 13.0}], (3.0, 0.0)),  # died in a test: no exit of its own
    ([{"ready": 9.0}, {"done": 21.0}], (0.0, 0.0)),  # clocks that disagree stay within the child's time
])
def test_a_childs_phases_from_its_events(events, split):
    from pytest_fla.running.isolation import phases

    assert phases(events, spawned=10.0, ended=20.0) == split


@pytest.mark.parametrize("events, collecting", [
    ([{"configured": 11.0}, {"ready": 12.5}], 1.5),
    ([{"configured": 11.0}], 0.0),  # died while collecting: no split
    ([{"configured": 13.0}, {"ready": 12.0}], 0.0),  # clocks that disagree count nothing
    ([{"configured": 0.0}, {"ready": 12.0}], 2.0),  # never more than the start-up
])
def test_a_childs_collection_from_its_events(events, collecting):
    from pytest_fla.running.isolation import collection_seconds

    assert collection_seconds(events, startup=2.0) == collecting


def test_children_keep_bytecode_in_a_shared_cache_where_none_is_written_or_installed(tmp_path, monkeypatch):
    """Under PYTHONDONTWRITEBYTECODE, with torch installed without bytecode (the H100
    machine), every child compiled torch from source, 5 s a child: the children then
    write bytecode to one cache in the temp directory."""
    from pytest_fla.running.isolation import bytecode_cache, installed_with_bytecode

    monkeypatch.syspath_prepend(str(tmp_path))
    for name, compiled in (("plain_package", False), ("compiled_package", True)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("VALUE = 1\n")
        if compiled:
            import py_compile

            py_compile.compile(str(tmp_path / name / "__init__.py"))
    assert not installed_with_bytecode("plain_package") and installed_with_bytecode("compiled_package")
    assert not installed_with_bytecode("no_such_package_here")

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    cache = bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1"}, package="plain_package")
    assert cache["PYTHONDONTWRITEBYTECODE"] == "" and cache["PYTHONPYCACHEPREFIX"].startswith(str(tmp_path))
    # bytecode written beside the sources, installed with the package, or a prefix chosen: unchanged
    assert bytecode_cache({}, package="plain_package") == {}
    assert bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1"}, package="compiled_package") == {}
    assert bytecode_cache({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/mine"}, package="plain_package") == {}

    # and a child started with it writes there, not beside the sources
    import subprocess
    import sys

    env = {**os.environ, **cache}
    subprocess.run([sys.executable, "-c", "import plain_package"], env={**env, "PYTHONPATH": str(tmp_path)}, check=True)
    assert list((tmp_path / "pytest-fla-pycache").rglob("__init__*.pyc"))
    assert not (tmp_path / "plain_package" / "__pycache__").exists()


ORDER_PROJECT = '''
import os, pytest

def _log(name):
    with open(os.environ["FLA_TEST_RUN_LOG"], "a") as f:
        f.write(name + "\\n")

@pytest.mark.parametrize("op", ["a", "b"])
def test_quick(op):
    _log(f"quick-{op}")

@pytest.mark.parametrize("op", ["a", "b"])
def test_slow(op):
    _log(f"slow-{op}")

def test_unrecorded():
    _log("unrecorded")
'''

# An earlier run's --fla-report: isolated tests by their processes' seconds, others by their own
RECORDED = {"tests": [
    {"nodeid": "test_order.py::test_quick[a]", "process_seconds": 1.0, "duration": 0.1},
    {"nodeid": "test_order.py::test_quick[b]", "process_seconds": 1.0, "duration": 0.1},
    {"nodeid": "test_order.py::test_slow[a]", "process_seconds": 30.0, "duration": 25.0},
    {"nodeid": "test_order.py::test_slow[b]", "process_seconds": None, "duration": 20.0},
]}


@pytest.mark.parametrize("how", [("-p", "no:xdist"), ("-n", "1")], ids=["in_process", "xdist"])
def test_durations_run_the_longest_batches_first(pytester, monkeypatch, how):
    """Batches by their recorded seconds, longest first (slow: 50 s; the unrecorded test
    counts as the median test, 20 s; quick: 2 s), each batch's tests in their order; under
    xdist the batches go out in that order, not by test count."""
    import json

    log = pytester.path / "runs.log"
    monkeypatch.setenv("FLA_TEST_RUN_LOG", str(log))
    pytester.makepyfile(test_order=ORDER_PROJECT)
    (pytester.path / "durations.json").write_text(json.dumps(RECORDED))
    result = run(pytester, "--fla-isolate=batch", *how)
    result.assert_outcomes(passed=5)
    assert log.read_text().split() == ["quick-a", "quick-b", "slow-a", "slow-b", "unrecorded"]
    log.unlink()
    result = run(pytester, "--fla-isolate=batch", "--fla-durations=durations.json", *how)
    result.assert_outcomes(passed=5)
    assert log.read_text().split() == ["slow-a", "slow-b", "unrecorded", "quick-a", "quick-b"]


def test_recorded_seconds_split_a_slow_check_into_batches():
    """A check's tests go in runs of BATCH_SECONDS recorded seconds (one test that alone
    passes it still makes a batch), and so do the small groups merged across ops; unrecorded
    tests count nothing, so without durations the batches are as before."""
    from pytest_fla.running import distribute

    ids = [f"t.py::test_varlen[op-{i}]" for i in range(6)]
    limit = distribute.BATCH_SECONDS
    assert len(set(distribute.batch_keys(ids, "batch").values())) == 1
    assert len(set(distribute.batch_keys(ids, "batch", {}).values())) == 1
    keys = distribute.batch_keys(ids, "batch", {nodeid: 0.4 * limit for nodeid in ids})
    assert [keys[i] for i in ids] == [f"t.py::test_varlen[op]#{k}" for k in (0, 0, 1, 1, 2, 2)]
    keys = distribute.batch_keys(ids, "batch", {ids[0]: 2 * limit, ids[1]: 0.5 * limit})
    assert [keys[i][-1] for i in ids] == ["0", "1", "1", "1", "1", "1"]
    small = [f"t.py::test_huge_grid[op{i}]" for i in range(4)]  # one test per op: merged
    assert len(set(distribute.batch_keys(small, "batch").values())) == 1
    keys = distribute.batch_keys(small, "batch", {nodeid: 0.6 * limit for nodeid in small})
    assert len(set(keys.values())) == 4


SPLIT_PROJECT = """
import os, pytest

@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("op", ["a"])
def test_slow(op, case):
    with open(os.environ["FLA_TEST_RUN_LOG"], "a") as f:
        f.write(f"{case} {os.getpid()}\\n")
"""


def test_recorded_seconds_put_a_slow_check_in_several_children(pytester, monkeypatch):
    """End to end: the four tests of one check run in one child without durations, and in
    two (two tests each) when an earlier run recorded them at 0.4 BATCH_SECONDS apiece."""
    import json

    from pytest_fla.running import distribute

    log = pytester.path / "runs.log"
    monkeypatch.setenv("FLA_TEST_RUN_LOG", str(log))
    pytester.makepyfile(test_split=SPLIT_PROJECT)
    recorded = {"tests": [{"nodeid": f"test_split.py::test_slow[a-{i}]", "process_seconds": 0.4 * distribute.BATCH_SECONDS}
                          for i in range(4)]}
    (pytester.path / "durations.json").write_text(json.dumps(recorded))

    def children(*extra):
        log.unlink(missing_ok=True)
        run(pytester, "--fla-isolate=batch", "-p", "no:xdist", *extra).assert_outcomes(passed=4)
        pids = dict(line.split() for line in log.read_text().splitlines())
        return [pids[str(i)] for i in range(4)]

    pids = children()
    assert len(set(pids)) == 1
    pids = children("--fla-durations=durations.json")
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[0] != pids[2]


def test_durations_that_cannot_be_read_are_a_usage_error(pytester):
    pytester.makepyfile(test_order=ORDER_PROJECT)
    result = run(pytester, "--fla-durations=missing.json", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--fla-durations: cannot read missing.json" in result.stderr.str()


STUCK_PROJECT = """
import os, signal, time

def test_stops_making_progress():
    os.kill(os.getpid(), signal.SIGUSR1)  # what one sends a child that waits too long
    time.sleep(0.5)
    os.abort()
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGUSR1"), reason="SIGUSR1 is POSIX")
def test_a_child_writes_its_stacks_on_sigusr1(pytester):
    """A child that stops making progress can be asked where it waits: SIGUSR1 writes
    every thread's Python stack to its stderr, whose end the parent reports."""
    pytester.makepyfile(test_stuck=STUCK_PROJECT)
    result = run(pytester, "--fla-isolate=test", "-p", "no:xdist")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "Current thread" in out and "in test_stops_making_progress" in out


EARLY_SIGNAL_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from pytest_fla.running.isolation import dump_stacks_on_signal
time.sleep(1.0)  # still starting (importing) when the signal comes
dump_stacks_on_signal()
time.sleep(0.5)
print("alive")
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="signal masks are POSIX")
@pytest.mark.parametrize("held", [True, False], ids=["held", "not-held"])
def test_a_child_signalled_before_its_handler_is_registered(tmp_path, held):
    """A SIGUSR1 sent to a child that has not yet registered its stack dump (a tool asking
    every child for its stacks, one of them still importing) is held until it has, when the
    child was started under ``stacks_signal_held``: the child lives and writes its stacks.
    Started without it, the signal's default action kills the child."""
    import contextlib
    import signal
    import subprocess
    import sys

    from pytest_fla.running.isolation import stacks_signal_held

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "child.py"
    script.write_text(EARLY_SIGNAL_CHILD.format(root=root))
    with stacks_signal_held() if held else contextlib.nullcontext():
        child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.kill(child.pid, signal.SIGUSR1)
    out, err = child.communicate(timeout=60)
    if held:
        assert child.returncode == 0 and "alive" in out
        assert "Current thread" in err or "Thread 0x" in err
    else:
        assert child.returncode == -signal.SIGUSR1


def test_the_float64_reference_counts_to_its_part_of_a_tests_time():
    """A check's float64 reference (forward, and its autograd) is timed apart from the kernel's
    run: at the sanitizer's small shapes it can be most of a test."""
    import torch

    from pytest_fla.checks import generic
    from pytest_fla.report import time_split
    from pytest_fla.ops.spec import Sample

    def slow_double(x):
        time.sleep(0.01)
        return x * 2

    sample = Sample({"x": torch.ones(3)})
    before = time_split.totals()
    generic.run_with_grads(slow_double, sample, ["x"])  # the kernel's side
    assert time_split.REFERENCE not in time_split.since(before)
    generic.run_with_grads(slow_double, sample, ["x"], upcast=True)  # the reference's
    assert time_split.since(before)[time_split.REFERENCE] >= 0.01


def test_a_reference_elsewhere_gets_its_inputs_there_and_gives_its_results_back(monkeypatch):
    """Under the sanitizer the float64 reference runs on the CPU (FLA_REFERENCE_DEVICE): its
    inputs go there and its outputs come back to the kernel's device for the comparison."""
    import torch

    from pytest_fla import environment
    from pytest_fla.running.devices import home_device, moved

    value = {"a": (torch.ones(2), [torch.zeros(1), 3]), "b": None}
    on_meta = moved(value, "meta")
    assert on_meta["a"][0].device.type == on_meta["a"][1][0].device.type == "meta"
    assert on_meta["a"][1][1] == 3 and on_meta["b"] is None and isinstance(on_meta["a"], tuple)
    assert home_device([None, 2, torch.ones(1, device="meta"), torch.ones(1)]).type == "meta"

    from pytest_fla.ops.spec import Sample, OpSpec  # noqa: F401 - the spec's reference call

    seen = []

    def reference(x):
        seen.append(x.device.type)
        return torch.zeros(2, dtype=torch.float64)  # a result on the CPU, whatever it was given

    spec = type("Spec", (), {"reference_for": lambda self, dtype=None: reference})()
    monkeypatch.setenv(environment.REFERENCE_DEVICE, "meta")
    (out,) = OpSpec.call_reference(spec, Sample({"x": torch.ones(2)}))
    assert seen == ["meta"] and out.device.type == "cpu"  # computed there, given back here


REPORT_WHILE_RUNNING = """
import json, os, time


def test_a_fails():
    assert False, "planted"


def test_b_sees_the_failure_in_the_report():
    # under xdist the controller writes it as the worker's report of test_a arrives
    for _ in range(100):
        if os.path.exists(os.environ["REPORT_PATH"]):
            break
        time.sleep(0.1)
    report = json.load(open(os.environ["REPORT_PATH"]))
    assert report["finished"] is False
    [record] = [t for t in report["tests"] if t["nodeid"].endswith("test_a_fails")]
    assert record["outcome"] == "failed" and "planted" in record["reason"]
"""


@pytest.mark.parametrize("workers", [(), ("-n", "2", "--dist", "loadfile")], ids=["one_process", "workers"])
def test_the_report_is_written_while_the_run_goes(pytester, monkeypatch, workers):
    """--fla-report is on disk from the first failure on (a run killed at a time limit has no
    session end to write it), marked unfinished until the run ends."""
    path = pytester.path / "report.json"
    monkeypatch.setenv("REPORT_PATH", str(path))
    pytester.makepyfile(test_running=REPORT_WHILE_RUNNING)
    result = run(pytester, f"--fla-report={path}", *workers)
    result.assert_outcomes(passed=1, failed=1)
    assert json.loads(path.read_text())["finished"] is True
