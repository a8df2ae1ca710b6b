"""The GPU share between processes: shared holders run together, an exclusive holder runs
alone and goes before shared holders that came after it (or, patient, after them). Plain
processes and lock files; no GPU needed; the plugin's choice of patience: pytester."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import time

import pytest

from pytest_fla.running.gpu_share import GpuShare, physical_gpu


def _hold(directory, mode, seconds, log, start_after=0.0):
    time.sleep(start_after)
    share = GpuShare("test", directory, release=lambda: log.put((mode, "release", time.monotonic())))
    outer = contextlib.nullcontext() if mode == "nested_bare" else share.shared()
    with outer:
        if mode.startswith("nested"):
            with share.alone():
                with share.alone(), share.shared():
                    pass
                log.put((mode, "in", time.monotonic()))  # still alone after the nested holds
                time.sleep(seconds)
                log.put((mode, "out", time.monotonic()))
        elif mode in ("alone", "patient"):
            with share.alone(patient=mode == "patient"):
                log.put((mode, "in", time.monotonic()))
                time.sleep(seconds)
                log.put((mode, "out", time.monotonic()))
        else:
            log.put((mode, "in", time.monotonic()))
            time.sleep(seconds)
            log.put((mode, "out", time.monotonic()))


def _run(tmp_path, plan):
    ctx = multiprocessing.get_context("fork")
    log = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), *p[:2], log, p[2])) for p in plan]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, "a holder hung or failed (deadlock?)"
    events = [log.get(timeout=5) for _ in range(2 * len(plan))]  # every holder's "in" and "out"
    while True:
        try:
            events.append(log.get(timeout=0.5))
        except queue.Empty:
            return sorted(events, key=lambda e: e[2])


def _releases(events, mode):
    return [t for m, w, t in events if m == mode and w == "release"]


def _intervals(events, mode):
    ins = [t for m, w, t in events if m == mode and w == "in"]
    outs = [t for m, w, t in events if m == mode and w == "out"]
    return list(zip(sorted(ins), sorted(outs)))


def test_shared_holders_overlap(tmp_path):
    events = _run(tmp_path, [("shared", 0.6, 0.0), ("shared", 0.6, 0.0)])
    (a0, a1), (b0, b1) = _intervals(events, "shared")
    assert b0 < a1, "two shared holders ran one after the other"


def test_an_exclusive_holder_runs_alone_and_before_later_shared_ones(tmp_path):
    # shared holder first; then one waiting to be alone; then another shared one, which
    # must wait behind the exclusive one (writer preference), not slip in beside the first
    events = _run(tmp_path, [("shared", 0.8, 0.0), ("alone", 0.4, 0.2), ("late", 0.2, 0.4)])
    (s0, s1), = _intervals(events, "shared")
    (x0, x1), = _intervals(events, "alone")
    (l0, l1), = _intervals(events, "late")
    assert x0 >= s1, "the exclusive holder started while a shared one still ran"
    assert l0 >= x1, "a later shared holder ran beside (or before) the waiting exclusive one"


def test_a_patient_exclusive_holder_lets_later_shared_ones_go_first(tmp_path):
    # the same arrivals; patient, the exclusive holder waits until no shared holder is
    # left, the later one included, and still runs alone
    events = _run(tmp_path, [("shared", 0.8, 0.0), ("patient", 0.3, 0.2), ("late", 0.8, 0.4)])
    (s0, s1), = _intervals(events, "shared")
    (x0, x1), = _intervals(events, "patient")
    (l0, l1), = _intervals(events, "late")
    assert l0 < s1, "the later shared holder waited although the exclusive one was patient"
    assert x0 >= max(s1, l1), "the patient exclusive holder ran beside a shared one"


@pytest.mark.parametrize("exclusive", ["alone", "patient"])
def test_holders_give_their_cached_memory_back_to_an_exclusive_one(tmp_path, exclusive):
    # the shared holder leaves while the exclusive one waits, the late one arrives behind
    # it (or, the exclusive one patient, runs before it): both release (torch's empty_cache
    # and the stack reset in a run) before the exclusive holder starts, which gave back its
    # own before it began to wait; the free memory it reads is then all there is
    events = _run(tmp_path, [("shared", 0.8, 0.0), (exclusive, 0.4, 0.2), ("late", 0.2, 0.4)])
    (x0, x1), = _intervals(events, exclusive)
    (s0, s1), = _intervals(events, "shared")
    assert [t for t in _releases(events, "shared") if t > s0] and max(_releases(events, "shared")) <= x0, \
        "the shared holder left without giving its memory back before the exclusive one ran"
    assert _releases(events, "late") and min(_releases(events, "late")) <= x0
    assert _releases(events, exclusive) and min(_releases(events, exclusive)) < s1, \
        "the exclusive holder kept its memory while it waited"


def test_shared_holders_keep_their_cached_memory_with_no_exclusive_one(tmp_path):
    events = _run(tmp_path, [("shared", 0.4, 0.0), ("late", 0.2, 0.1)])
    assert not _releases(events, "shared") and not _releases(events, "late"), \
        "memory given back with no one waiting to be alone: the next check pays the allocations again"


def test_two_exclusive_holders_inside_shared_holds_do_not_deadlock(tmp_path):
    events = _run(tmp_path, [("alone", 0.3, 0.0), ("alone", 0.3, 0.0)])
    (a0, a1), (b0, b1) = _intervals(events, "alone")
    assert b0 >= a1, "two exclusive holders overlapped"


@pytest.mark.parametrize("mode", ["nested", "nested_bare"])
def test_nested_holds_keep_an_exclusive_hold_exclusive(tmp_path, mode):
    events = _run(tmp_path, [(mode, 0.6, 0.0), ("shared", 0.1, 0.2)])
    (n0, n1), = _intervals(events, mode)
    (s0, s1), = _intervals(events, "shared")
    assert s0 >= n1, "a shared holder got in while the nested exclusive hold was still on"


def test_pinned_workers_lock_their_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert physical_gpu(0) == "3" and physical_gpu(1) == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpu(1) == "1"


def test_a_failed_large_check_frees_its_tensors_before_its_error_is_kept():
    """pytest keeps a failed test's traceback; without clearing its frames, a failed
    2**31-element check held its tensors (48 GiB on the H100) for the rest of the run."""
    import gc
    import weakref

    import torch

    from pytest_fla.running.gpu_memory import released_on_error

    held = []

    def failing_check():
        big = torch.ones(1000)
        held.append(weakref.ref(big))
        assert big.sum() == 0, "a wrong answer"  # rewritten by pytest: it takes a locals() snapshot

    with pytest.raises(AssertionError) as kept:
        with released_on_error():
            failing_check()
    gc.collect()
    assert kept.value.__traceback__ is not None  # the error and its traceback are still there
    assert held[0]() is None, "the failed check's tensor outlived it"

    held.clear()
    with pytest.raises(AssertionError) as unguarded:
        failing_check()  # the same failure, unguarded: its kept traceback keeps the tensor
    gc.collect()
    assert unguarded.value.__traceback__ is not None and held[0]() is not None


PATIENCE_PROJECT = """
import json

import pytest

from pytest_fla.running import gpu_share


def record(name):
    with open("patience.jsonl", "a") as f:
        f.write(json.dumps([name, gpu_share._patient]) + "\\n")


@pytest.mark.large_memory
def test_big_1():
    record("big_1")


def test_regular():
    record("regular")


@pytest.mark.large_memory
def test_big_2():
    record("big_2")
"""

REVERSED_AFTER_THE_PLUGIN = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    items.reverse()
"""


@pytest.mark.parametrize("reordered", [False, True], ids=["plugin_order", "reordered_after_it"])
def test_exclusive_checks_are_patient_only_with_nothing_else_behind_them(pytester, reordered):
    import json

    from plugin_testing import run

    pytester.makepyfile(test_patience=PATIENCE_PROJECT)
    if reordered:
        pytester.makeconftest(REVERSED_AFTER_THE_PLUGIN)
    run(pytester).assert_outcomes(passed=3)
    seen = [tuple(json.loads(line)) for line in (pytester.path / "patience.jsonl").read_text().splitlines()]
    if reordered:  # big_2, big_1, regular: big_1 has a check that shares the GPU behind it
        assert seen == [("big_2", True), ("big_1", False), ("regular", True)]
    else:  # the plugin runs the large_memory checks last: regular, big_1, big_2
        assert seen == [("regular", True), ("big_1", True), ("big_2", True)]
