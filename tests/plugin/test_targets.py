"""--fla-arch: the targets a run gets, the mode of each, and each one's environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plugin_testing import cpu_only, run

from pytest_fla import environment, targets
from pytest_fla.targets import COMPILE_ONLY, EMULATED, INTERPRETER, NATIVE, Gpu

H200 = Gpu(count=1, arch=90)


def modes(spec, gpu):
    return {t.name: t.mode for t in targets.resolve_targets(spec, gpu)}


def test_all_on_a_hopper_gpu():
    assert modes("all", H200) == {
        "sm75": COMPILE_ONLY, "sm80": EMULATED, "sm86": EMULATED, "sm89": EMULATED,
        "sm90": NATIVE, "sm100": COMPILE_ONLY, "sm120": COMPILE_ONLY,
    }


def test_native_is_the_gpu_arch():
    assert modes("native", H200) == {"sm90": NATIVE}
    assert modes("native,sm80", H200) == {"sm90": NATIVE, "sm80": EMULATED}


def test_without_a_gpu_numerics_run_once_under_the_interpreter():
    assert modes("native", None) == {"interpreter": INTERPRETER}
    assert modes("all", None) == {"interpreter": INTERPRETER, **{f"sm{a}": COMPILE_ONLY for a in targets.ALL_ARCHS}}
    assert modes("sm80,sm90", None) == {"interpreter": INTERPRETER, "sm80": COMPILE_ONLY, "sm90": COMPILE_ONLY}


def test_emulation_needs_the_targets_shared_memory():
    # An sm86 card has less shared memory than sm80: emulating sm80 there would fail for
    # the host's reasons, not the target's.
    assert modes("sm80", Gpu(1, 86)) == {"sm80": COMPILE_ONLY}
    assert modes("sm80", Gpu(1, 120)) == {"sm80": COMPILE_ONLY}
    assert modes("sm86", Gpu(1, 120)) == {"sm86": EMULATED}
    assert modes("sm75", H200) == {"sm75": COMPILE_ONLY}  # not checked to run under emulation


def test_every_target_says_why():
    for target in targets.resolve_targets("all", H200):
        assert target.reason and target.name.removeprefix("sm") in target.reason or target.mode == NATIVE


@pytest.mark.parametrize("spec", ["sm81", "hopper", "sm_9"])
def test_unknown_archs_are_refused(spec):
    with pytest.raises(ValueError, match="unknown GPU arch"):
        targets.resolve_targets(spec, None)


def test_each_target_gets_its_own_environment():
    by_name = {t.name: targets.target_environment(t) for t in targets.resolve_targets("all", H200)}
    assert by_name["sm86"]["TRITON_OVERRIDE_ARCH"] == "sm86"
    assert by_name["sm90"]["TRITON_OVERRIDE_ARCH"] == ""
    assert by_name["sm100"]["CUDA_VISIBLE_DEVICES"] == ""  # compile-only never touches the GPU
    assert all(env["TRITON_INTERPRET"] == "" for env in by_name.values())
    assert all(env["FLA_TARGET_ARCH"] == name for name, env in by_name.items())
    caches = {env["TRITON_CACHE_DIR"] for env in by_name.values()}
    assert len(caches) == len(by_name)
    (interp,) = targets.resolve_targets("native", None)
    assert targets.target_environment(interp)["TRITON_INTERPRET"] == "1"


def test_a_target_survives_the_trip_through_the_environment():
    target = targets.resolve_targets("sm86", H200)[0]
    decoded = targets.decode_target(targets.target_environment(target)[environment.RUN_TARGET])
    assert (decoded.name, decoded.arch, decoded.mode) == ("sm86", 86, EMULATED)


def test_importing_the_plugin_initialises_nothing():
    code = (
        "import sys, pytest_fla.plugin, pytest_fla.__main__\n"
        "heavy = [m for m in ('torch', 'triton', 'kernels') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_kernels_budgets_are_the_plugins_limits():
    """The kernels choose configs from budgets of their own (they run without the plugin);
    a budget over the plugin's limit would pick configs that a real card of that arch
    cannot launch, one under it configs slower than the card allows."""
    import kernels._arch

    assert kernels._arch.SHARED_MEMORY_LIMIT == targets.SHARED_MEMORY_LIMIT
    assert kernels._arch.KNOWN_ARCHS == targets.ALL_ARCHS
    assert kernels._arch.shared_memory_limit(87) == targets.SHARED_MEMORY_LIMIT[86]  # nearest older


def test_arch_names_parse():
    assert targets.parse_arch("sm_80") == 80 and targets.parse_arch("90") == 90
    with pytest.raises(ValueError, match="unknown GPU arch 'sm70'"):
        targets.parse_arch("sm70")
    import kernels._arch

    assert kernels._arch.parse_arch("sm_90a") == 90 and kernels._arch.parse_arch(100) == 100


PIN_REPORT = '''
import os, pathlib

def test_a():
    pathlib.Path(f"pin-{os.environ['PYTEST_XDIST_WORKER']}-a.txt").write_text(os.environ["CUDA_VISIBLE_DEVICES"])

def test_b():
    pathlib.Path(f"pin-{os.environ['PYTEST_XDIST_WORKER']}-b.txt").write_text(os.environ["CUDA_VISIBLE_DEVICES"])
'''


@cpu_only
def test_auto_starts_one_worker_per_gpu_and_pins_each(pytester, monkeypatch):
    """The controller's GPU list (FLA_GPUS, as it found them) sets -n auto's worker count,
    and each worker sees only its own GPU. On a CPU machine the list is given by hand; the
    multi-GPU run of the same thing is in test_gpu_faults.py."""
    monkeypatch.setenv("FLA_GPUS", "3,5")
    pytester.makepyfile(test_pin=PIN_REPORT)
    result = run(pytester, "-n", "auto", "--dist", "each", "-v")
    result.assert_outcomes(passed=4)
    assert "created: 2/2 workers" in result.stdout.str()
    seen = {p.name.split("-")[1]: p.read_text() for p in pytester.path.glob("pin-*.txt")}
    assert seen == {"gw0": "3", "gw1": "5"}


def test_a_worker_collecting_nothing_last_does_not_end_the_run_as_empty():
    """With one worker per target, the interpreter's worker keeps none of the compile-only
    checks; xdist takes the session's test count from the last worker to finish
    collecting, so the run must not exit 5 when that worker is the empty one."""
    import types

    from pytest_fla import plugin

    counter = plugin.DistinctCollected()
    session = types.SimpleNamespace(testscollected=0)
    counter.pytest_sessionstart(session)
    for worker, ids in (("gw1", [f"t{i}" for i in range(30)]), ("gw2", [f"t{i}" for i in range(30)]), ("gw0", [])):
        counter.pytest_xdist_node_collection_finished(types.SimpleNamespace(gateway=types.SimpleNamespace(id=worker)), ids)
        session.testscollected = len(ids)  # what xdist does after the hook: the empty one last
    loop = counter.pytest_runtestloop(session)
    next(loop)
    with pytest.raises(StopIteration):
        loop.send(True)
    assert session.testscollected == 30


PER_ARCH_COMPILES = '''
import pytest

@pytest.mark.parametrize("i", range(4))
@pytest.mark.fla_compile("sm80")
def test_compiles_sm80(i):
    pass

@pytest.mark.parametrize("i", range(4))
@pytest.mark.fla_compile("sm90")
def test_compiles_sm90(i):
    pass

def test_runs_kernels():
    pass
'''


@cpu_only
def test_progress_counts_the_distinct_tests_of_every_target(pytester):
    """Each target's worker collects a different set (a compile-only one its own arch's
    compile checks and the rest, skipped; the interpreter's none of them): the progress is
    over the 9 distinct tests, never past 100% (it read 180% or 900% as the last worker to
    collect had 5 or 1)."""
    import re

    pytester.makepyfile(test_per_arch=PER_ARCH_COMPILES)
    result = run(pytester, "--fla-arch=sm80,sm90")
    out = result.stdout.str()
    assert "created: 3/3 workers" in out, out
    shown = [int(p) for p in re.findall(r"\[\s*(\d+)%\]", out)]
    assert shown and max(shown) == 100 and shown[-1] == 100, out
    result.assert_outcomes(passed=9, skipped=2)  # the kernel test runs once, under the interpreter


SHARE_REPORT = '''
import os, pathlib, pytest

@pytest.mark.parametrize("i", range(6))
def test_numeric(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    pathlib.Path(f"ran-{i}-{worker}.txt").write_text(os.environ.get("FLA_RUN_TARGET", ""))
'''


@cpu_only
def test_n_splits_the_numeric_target_over_n_workers(pytester):
    """With several targets, -n 2 gives the interpreter two workers, each running its share
    of the tests once; each compile-only target keeps one worker (the tests that run
    kernels skip there)."""
    pytester.makepyfile(test_share=SHARE_REPORT)
    result = run(pytester, "--fla-arch=sm80,sm90", "-n", "2", "-v")
    out = result.stdout.str()
    assert "created: 4/4 workers" in out
    ran = sorted(p.name for p in pytester.path.glob("ran-*.txt"))
    assert [name.split("-")[1] for name in ran] == [str(i) for i in range(6)]  # each test once
    assert len({name.split("-")[2] for name in ran}) == 2  # on two workers
    assert all(p.read_text().startswith("interpreter") for p in pytester.path.glob("ran-*.txt"))
    result.assert_outcomes(passed=6, skipped=12)


COMPILE_SHARE_REPORT = '''
import os, pathlib, pytest

@pytest.mark.parametrize("i", range(6))
@pytest.mark.fla_compile("sm90")
def test_compiles(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    pathlib.Path(f"compiled-{i}-{worker}.txt").write_text(os.environ.get("FLA_RUN_TARGET", ""))
'''


@cpu_only
def test_n_shares_a_lone_compile_only_target_over_n_workers(pytester):
    """-n 2 with one compile-only target: two workers compile, each its share once."""
    pytester.makepyfile(test_compile_share=COMPILE_SHARE_REPORT)
    result = run(pytester, "--fla-arch=sm90", "-n", "2", "-v")
    assert "created: 4/4 workers" in result.stdout.str()  # two for the interpreter, two for sm90
    ran = sorted(p.name for p in pytester.path.glob("compiled-*.txt"))
    assert [name.split("-")[1] for name in ran] == [str(i) for i in range(6)]
    assert len({name.split("-")[2] for name in ran}) == 2
    assert all(p.read_text().startswith("sm90") for p in pytester.path.glob("compiled-*.txt"))


SMALL_SHAPES_PROBE = """
from pytest_fla.ops.spec import Case

CASE = Case("probe", {"B": 1, "T": 8}, gpu_dims={"B": 2, "T": 4096})


def test_a_cuda_device_gets_the_small_dims():
    assert CASE.dims_for("cuda:0") == {"B": 1, "T": 8}
"""


@pytest.mark.parametrize("how", [(), ("-n", "2"), ("--fla-isolate=test",)], ids=["plain", "workers", "children"])
def test_small_shapes_reach_every_process(pytester, how):
    """--fla-small-shapes: the cases' small dims on a GPU, in xdist workers and isolated
    children too (each inherits the setting); without it a CUDA device gets the GPU dims."""
    pytester.makepyfile(test_probe=SMALL_SHAPES_PROBE)
    result = run(pytester, "--fla-small-shapes", *how)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*fla shapes: every case at its small dims on a GPU too*"])
    without = run(pytester, *how)
    without.assert_outcomes(failed=1)


def test_the_arch_option_is_split_in_one_place():
    from pytest_fla.running import fleet

    assert targets.arch_words(" SM80, ,all ,fleet") == ["sm80", "all", "fleet"]
    assert fleet.requested("sm80, FLEET") and not fleet.requested("sm80,fleetx")
    assert fleet.extra_archs("fleet, sm86,,native") == [86]
