"""pytest-fla: the plugin's entry point (options, the header, and the hooks that wire
the modules together).

Processes of a run:

* the controller (the process you start) resolves ``--fla-arch`` into targets; with one
  target it runs the tests itself, with several it starts one xdist worker per target
  (``-n N``: N for a target that runs the numeric checks); under ``--fla-arch=fleet`` it
  probes the hosts of the user's ``--tx`` gateways and starts one worker per GPU on each
  (``running/fleet.py``);
* a worker runs every test under its own target (``FLA_RUN_TARGET`` and friends), or its
  share of them (``FLA_SHARD``);
* a child (``--fla-child``) runs a batch of tests for ``--fla-isolate`` or the sanitizer
  and streams their reports back to the process that started it.

Nothing here imports torch or triton, or touches CUDA, at import time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import pytest

from . import report as run_report
from . import environment, repro, sanitizer, targets
from .sanitizer import interpreter as interpreter_memcheck
from .checks import compile_per_arch, poison, switches
from .collection import projects, quick
from .ops import registry
from .report import time_split, verdicts
from .running import distribute, fleet, gpu_memory
from .running.devices import is_interpreter
from .targets import autotune, interpreter, interpreter_exp, interpreter_versions, toolchain
from .fixtures import (  # noqa: F401 - fixtures are found as this plugin's attributes
    cu_seqlens,
    device_mismatch,
    fla_chunk_size,
    fla_device,
    fla_poison_allocations,
    huge_batch,
    parametrize_cu_seqlens,
    rotary_dims,
)

ISOLATE_CHOICES = ("test", "batch", "module", "none")


@dataclass
class RunState:
    role: str  # "controller", "worker" or "child"
    targets: list = field(default_factory=list)  # the run's targets (controller only)
    target: targets.Target | None = None  # the target this process runs tests under
    tools: list = field(default_factory=list)  # sanitizer tools
    isolate: str = "none"
    report: run_report.RunReport | None = None
    batches: dict = field(default_factory=dict)  # nodeid -> ItemOutcome run ahead (a batch or module)
    batch_keys: dict | None = None  # nodeid -> its batch, under --fla-isolate=batch or module


RUN = pytest.StashKey[RunState]()
TARGETS = pytest.StashKey[list]()
FLEET = pytest.StashKey[fleet.Fleet]()  # under --fla-arch=fleet: the hosts and their workers (controller)


def pytest_addhooks(pluginmanager):
    from . import hookspec

    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser):
    group = parser.getgroup("fla", "pytest-fla: linear-attention kernel checks")
    group.addoption(
        "--fla-arch",
        default="native",
        help="arch targets: native (default), one arch (sm80), a list (sm80,sm90) or all "
        f"({', '.join(targets.arch_name(a) for a in targets.ALL_ARCHS)}); each runs native, emulated, "
        "compile-only or under the interpreter, as the machine allows (see the header). fleet: every "
        "--tx gateway is a host, each of its GPUs runs its own arch natively, once per arch across hosts "
        "(fleet,sm100 adds archs no host has, emulated or compile-only)",
    )
    group.addoption(
        "--fla-fleet-mixed-versions",
        action="store_true",
        help="under --fla-arch=fleet, run although the hosts' torch or Triton versions differ (by default "
        "the run stops before any test: their cells would not compare)",
    )
    group.addoption(
        "--fla-sanitizer",
        default=None,
        metavar="TOOLS",
        help="re-run each test under compute-sanitizer with these tools "
        f"({','.join(sanitizer.TOOLS)}); any report fails the test. Tests run at the small shapes, "
        "a batch of them per subprocess (see --fla-isolate)",
    )
    group.addoption(
        "--fla-sanitizer-all-tests",
        action="store_true",
        help="under --fla-sanitizer, re-run also the tests that launched no Triton kernel "
        "(by default they are not: they hold nothing of the kernels under test) and run the "
        "large_memory checks, under the tool too (by default they are skipped: they cannot shrink "
        "to small shapes, and their plain run holds the GPU alone)",
    )
    group.addoption(
        "--fla-sanitizer-stall",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="under --fla-sanitizer, a child under the tool that uses under a CPU second and starts "
        "or ends no test for this long is killed, with where its processes waited, and its test "
        "runs once more; a second stall fails it (0: wait for ever; default 120)",
    )
    group.addoption("--fla-blocking", action="store_true", help="CUDA_LAUNCH_BLOCKING=1: faults show at their launch")
    group.addoption(
        "--fla-small-shapes",
        action="store_true",
        help="on a GPU, every case at its small dims (the CPU's, the sizes the sanitizer runs) instead of "
        "its GPU dims: narrow heads and masked block edges, where GPU-only faults show "
        f"({environment.SMALL_SHAPES}=1)",
    )
    group.addoption(
        "--fla-bf16-emulated",
        action="store_true",
        help="under the interpreter, check bf16 too, with the GPU's bf16 arithmetic patched into it "
        "(pytest_fla/targets/interpreter_bf16.py: rounded conversions, float32-accumulated dots); by "
        "default bf16 is checked on the GPU only, the interpreter's own bf16 being wrong",
    )
    group.addoption(
        "--fla-isolate",
        choices=ISOLATE_CHOICES,
        default=None,
        help="run each test (or batch: a check's tests for one op, a check with a few tests per op "
        "across ops; or module) in a subprocess, so a "
        "device fault or a crash fails only its own test (default: none; batch under --fla-sanitizer)",
    )
    group.addoption("--fla-report", default=None, metavar="PATH", help="write the ops x checks report as JSON")
    group.addoption(
        "--fla-repro-dir",
        default=None,
        metavar="DIR",
        help="a forward or backward check that finds a defect is run again at smaller dims, each as small as "
        "still fails, and written to DIR as a reproducer (pytest_fla/repro/shrink.py)",
    )
    group.addoption(
        "--fla-durations",
        default=None,
        metavar="PATH",
        help="run the longest batches (or tests) first, timed by an earlier run's --fla-report: "
        "a run waits for its last batch, and a long one started last keeps it going alone",
    )
    group.addoption(
        "--fla-autotune",
        choices=autotune.CHOICES,
        default=os.environ.get(environment.AUTOTUNE) or None,
        help="how a library's @triton.autotune picks its config: tuned (Triton's own timing of every config, "
        "the default on a GPU) or first (the first config that survives pruning and runs, none timed: one "
        "compile per key where tuned compiles every config, and the same config in every run; always so under "
        "the interpreter). pytest_fla/targets/autotune.py",
    )
    group.addoption(
        "--fla-dist",
        choices=distribute.DIST_CHOICES,
        default="test",
        help="with -n: what xdist hands a worker at a time: tests (test, xdist's own load scheduling) or whole "
        "ops (op: an op's tests in one dtype, on one worker, so each kernel compiles and autotunes on one "
        "worker rather than on every worker at once)",
    )
    group.addoption("--fla-ops", default=None, metavar="OPS", help="run only the tests of these ops (comma list)")
    group.addoption(
        "--fla-quick",
        action="store_true",
        help="a first run in minutes: each check once per op (its first case, fp32), every error input, every "
        "kernel compiled once per arch in bf16; no tests of no op, no reproducers (pytest_fla/collection/quick.py)",
    )
    group.addoption(
        "--fla-compile-scope",
        choices=compile_per_arch.SCOPES,
        default=None,
        help="what the compile checks compile for each arch: every distinct launch an op makes over its "
        "compile cases and dtypes (launches, the default), or each kernel once per dtype, its first launch "
        "(kernels: a quick run, as for a Triton release beside the pinned one), or each kernel once per arch "
        "for the whole run (run: the default with --fla-quick)",
    )
    group.addoption(
        "--fla-compile-dtypes",
        default=None,
        metavar="DTYPES",
        help=f"the dtypes the compile checks run each op in (default {','.join(compile_per_arch.COMPILE_DTYPES)}; "
        f"{quick.COMPILE_DTYPES} with --fla-quick)",
    )
    group.addoption(
        "--fla-impl",
        default=None,
        metavar="NAME",
        help="whose kernels the op specs call, for a repository whose pytest_fla_specs hook knows several "
        "implementations (it reads this value); this repository: kernels (default) or fla (fla-core)",
    )
    parser.addini(
        poison.INI,
        type="linelist",
        default=list(poison.DEFAULT_TARGETS),
        help="allocations poisoned with NaN during op tests: `torch` (torch.empty and friends, the default) "
        "or `package.module:FLAG` flags the library's allocation helper reads",
    )
    for ini, (default, _, _) in switches.OPTIONS.items():
        parser.addini(ini, type="linelist", default=list(default), help=switches.HELP[ini])
    group.addoption("--fla-child", default=None, help=argparse.SUPPRESS)


def _role(config) -> str:
    if getattr(config.option, "fla_child", None) or getattr(config.known_args_namespace, "fla_child", None):
        return "child"
    if hasattr(config, "workerinput") or _xdist_worker_process():
        return "worker"
    return "controller"


def _xdist_worker_process() -> bool:
    """True in an xdist worker even before xdist gives its config ``workerinput`` (which
    happens after the early hooks): xdist sets the variable and execnet starts the worker
    as ``python -c``. A pytest started from inside a worker's test inherits the variable
    but not that command line."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and sys.argv[:1] == ["-c"]


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Set up this process's target before conftests can import torch or triton."""
    options = early_config.known_args_namespace
    role = _role(early_config)
    # The one read of the target from the environment: a worker's or a child's was set there by
    # the process that started it, before this one imported anything (xdist's workerinput comes
    # after these early hooks). From here on the run's state holds it.
    early_config.stash[targets.RUN_TARGET] = targets.current_target()
    if role == "child":
        return
    if options.fla_blocking:
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    if options.fla_small_shapes:  # before workers and children start: they inherit it
        os.environ.update(sanitizer.SHAPES_ENV)
    if fleet.requested(options.fla_arch):
        early_config.stash[TARGETS] = []  # the controller's come from its hosts (pytest_cmdline_main)
        if role == "worker":
            fleet.prepare_worker(targets.run_target(early_config))
        return
    if role == "worker":
        # before probe_gpu below: the driver reads CUDA_VISIBLE_DEVICES once, at cuInit
        distribute.pin_worker_to_gpu(targets.run_target(early_config))
    gpu = targets.probe_gpu()
    try:
        run_targets = targets.resolve_targets(options.fla_arch, gpu)
    except ValueError as error:
        raise pytest.UsageError(f"--fla-arch: {error}") from None
    early_config.stash[TARGETS] = run_targets
    if gpu is not None:
        os.environ[environment.GPUS] = ",".join(distribute.visible_gpus(gpu))
    if len(run_targets) == 1:
        early_config.stash[targets.RUN_TARGET] = run_targets[0]
        targets.apply_environment(targets.target_environment(run_targets[0]))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    run_targets = config.stash.get(TARGETS, [])
    if _role(config) != "controller" or config.option.collectonly:
        return
    if fleet.requested(config.option.fla_arch):
        config.stash[FLEET] = fleet.start(config)
        config.stash[TARGETS] = config.stash[FLEET].targets
    elif len(run_targets) > 1:
        distribute.use_one_worker_per_target(config, run_targets)


def pytest_configure(config):
    config.addinivalue_line("markers", "fla_op(name): the op a test checks (a row of the report matrix)")
    config.addinivalue_line("markers", "fla_compile(arch): an offline compile check for one arch, e.g. 'sm86'")
    config.addinivalue_line("markers", "large_memory: needs a GPU with tens of GiB free (tensors over 2**31 elements)")
    config.addinivalue_line("markers", "fla_plain_only(reason): under --fla-sanitizer, run plainly only, not under "
                            "the tool (unless --fla-sanitizer-all-tests)")
    try:
        poison.configure(config.getini(poison.INI))
        switches.configure_from(config)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    compile_per_arch.scope_and_dtypes(config)  # a usage error before any test
    role = _role(config)
    state = RunState(role=role, targets=config.stash.get(TARGETS, []), target=targets.run_target(config))
    if config.option.fla_sanitizer and role != "child":
        try:
            state.tools = sanitizer.parse_tools(config.option.fla_sanitizer)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
        if sanitizer.executable() is None and FLEET not in config.stash:  # a fleet's hosts were asked
            raise pytest.UsageError("--fla-sanitizer: compute-sanitizer is not on the PATH")
    if config.option.fla_sanitizer_stall < 0:
        raise pytest.UsageError(f"--fla-sanitizer-stall: {config.option.fla_sanitizer_stall:g} seconds; "
                                "give 0 (wait for ever) or more")
    state.isolate = config.option.fla_isolate or ("batch" if state.tools else "none")
    if role == "child":
        state.isolate = "none"
        from .running.isolation import ChildReporter

        config.pluginmanager.register(ChildReporter(config, config.option.fla_child), "fla-child")
    if role != "child" and state.isolate == "none":
        from .running.fault_guard import FaultGuard

        config.pluginmanager.register(FaultGuard(), "fla-fault-guard")
    config.stash[repro.SANITIZER_TOOLS] = state.tools
    if is_interpreter():
        config.addinivalue_line("filterwarnings", interpreter.NUMPY_SCALAR_WARNING)
        interpreter_memcheck.install_process_fixes()
        if config.option.fla_bf16_emulated:
            from .targets import interpreter_bf16

            if not interpreter_bf16.install():
                raise pytest.UsageError("--fla-bf16-emulated: this Triton's interpreter has not the shape "
                                        "pytest_fla/targets/interpreter_bf16.py patches (Triton 3.6 to 3.9 have it)")
    if config.option.fla_autotune == "first" and not is_interpreter():
        if not autotune.install_first_that_runs():
            raise pytest.UsageError("--fla-autotune=first: this Triton's autotuner has not the shape "
                                    "pytest_fla/targets/autotune.py patches (Triton 3.6 to 3.9 have it)")
        os.environ[environment.AUTOTUNE] = "first"  # for the children (isolated tests, reproducers) this process starts
    if state.target is not None and state.target.mode == targets.EMULATED:
        from .targets.emulation import enforce_shared_memory_limit

        enforce_shared_memory_limit(targets.SHARED_MEMORY_LIMIT[state.target.arch])
    if role == "controller":
        if distribute.xdist_loaded(config):
            config.pluginmanager.register(DistinctCollected(), "fla-distinct-collected")
        state.report = run_report.RunReport(state.targets)
        config.pluginmanager.register(ReportCollector(state.report, config.option.fla_report), "fla-report")
        if FLEET in config.stash:
            state.report.hosts = [host.to_json() for host in config.stash[FLEET].hosts]
            config.pluginmanager.register(fleet.FleetWatch(state.report), "fla-fleet")
    if _splits_test_time(config, role):
        # of each test's time, what went to compiling kernels and loading them, from Triton's
        # import on (a process whose tests never import it does not pay for its import)
        from .running.launches import time_kernels_from_import

        time_kernels_from_import()
    config.stash[RUN] = state


def pytest_report_header(config):
    state = config.stash.get(RUN, None)
    if state is None or state.role != "controller":
        return None
    lines = [toolchain.header_line()]
    planned = config.stash.get(FLEET, None)
    if planned is not None:
        lines += fleet.header_lines(planned)
    lines.append(f"fla targets ({len(state.targets)}):")
    lines += [f"  {t.name}: {t.mode} - {t.reason}" + (f"; {fleet.target_hosts(planned, t)}" if planned else "")
              for t in state.targets]
    if len(state.targets) > 1 and planned is None:
        lines.append("  one xdist worker per target (-n N: N for a target that runs the numeric checks, N shared "
                     "out among the compile-only ones; each a share of its tests); compile checks run in their "
                     "own arch's workers")
    if not any(targets.COMPILES[t.mode] for t in state.targets):
        lines.append("  compile checks: none here (deselected); --fla-arch=all adds compile-only targets")
    if state.tools:
        which = "each test" if config.option.fla_sanitizer_all_tests else "each test that launched a Triton kernel"
        how = {"module": "a module's tests in one subprocess", "batch": "a check's tests for one op in one subprocess",
               "test": "each in a subprocess"}[state.isolate]
        lines.append(f"fla sanitizer: {', '.join(state.tools)} ({which} re-run at small shapes, {how}; "
                     "a report lands on the test that was running)")
    if state.isolate != "none":
        lines.append(f"fla isolation: one subprocess per {state.isolate}")
    if config.option.fla_autotune == "first" and not is_interpreter():
        lines.append("fla autotune: each autotuned kernel at its first config that runs, none timed (--fla-autotune=first)")
    if config.option.fla_dist == "op" and distribute.xdist_loaded(config):
        lines.append("fla dist: each xdist worker runs whole ops (an op's tests in one dtype) at a time (--fla-dist=op)")
    if config.option.fla_small_shapes:
        lines.append("fla shapes: every case at its small dims on a GPU too (--fla-small-shapes)")
    if any(t.mode == targets.INTERPRETER for t in state.targets) and interpreter.wanted():
        lines.append("fla interpreter: helper calls reuse their launch's patched triton.language "
                     f"(pytest_fla/targets/interpreter.py; {environment.INTERPRETER_REPATCH}=1 for Triton's own "
                     "patching)")
    if any(t.mode == targets.INTERPRETER for t in state.targets) and config.option.fla_bf16_emulated:
        lines.append("fla interpreter bf16: checked, with the GPU's bf16 arithmetic patched in "
                     "(pytest_fla/targets/interpreter_bf16.py; --fla-bf16-emulated)")
    if any(t.mode == targets.INTERPRETER for t in state.targets) and interpreter_exp.supported():
        lines.append("fla interpreter exp: float32 tl.exp as a GPU computes it, exp2 of x * log2(e) rounded to "
                     "float32 (pytest_fla/targets/interpreter_exp.py)")
    fixes = interpreter_versions.needed() if any(t.mode == targets.INTERPRETER for t in state.targets) else []
    if fixes:
        lines.append(f"fla interpreter versions: patched to run kernels with {' and '.join(fixes)}, which this "
                     "Triton's interpreter fails and the others in the range run "
                     "(pytest_fla/targets/interpreter_versions.py)")
    if any(t.mode == targets.INTERPRETER for t in state.targets) and interpreter_memcheck.wanted():
        lines.append("fla interpreter memcheck: every load, store and atomic checked against its launch's tensor "
                     "arguments, every store against its program's unordered earlier ones of other values "
                     f"(pytest_fla/sanitizer/interpreter.py; {environment.INTERPRETER_MEMCHECK}=0 turns it off)")
    return lines


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--fla-dist=op``, or under batch or module isolation, ``-n N`` hands each worker
    whole ops or whole batches (unless a ``--dist`` mode was chosen): a worker then compiles
    an op's kernels alone, a batch child runs all of its batch."""
    state = config.stash.get(RUN, None)
    if state is None or config.getvalue("dist") != "load":
        return None
    if config.option.fla_dist == "op":
        return distribute.batch_scheduler(config, log, "op")
    if state.isolate not in ("batch", "module"):
        return None
    return distribute.batch_scheduler(config, log, state.isolate)


class DistinctCollected:
    """On the controller of an xdist run: the session's test count is the number of distinct
    tests its workers collected.

    xdist sets the count from whichever worker finished collecting last, and pytest's
    progress divides the distinct tests reported by it. Several targets run one worker each
    (``--dist each``) with different collections: a compile-only worker keeps only its own
    arch's compile checks, and under ``--fla-arch=all`` with ``tests/test_compile.py`` the
    progress read ``[700%]`` (seven archs' checks over one arch's count). A worker whose
    target keeps none of the selected tests collects nothing, and where it was the last one
    the run exited 5 (no tests collected): one run in three of
    ``tests/test_compile.py --fla-arch=sm80,sm90,sm100``."""

    def __init__(self):
        self.nodeids: set[str] = set()
        self.session = None

    def pytest_sessionstart(self, session):
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.nodeids.update(ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        # xdist hands out tests once every worker has collected: the set is complete here,
        # and the terminal reporter (after this) reads the count
        if self.nodeids and self.session is not None:
            self.session.testscollected = len(self.nodeids)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session):
        try:
            return (yield)
        finally:
            if self.nodeids:
                session.testscollected = len(self.nodeids)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per visible GPU (None: xdist's default, one per CPU).

    tryfirst: xdist's own implementation always answers, and the first answer wins."""
    gpus = [g for g in os.environ.get(environment.GPUS, "").split(",") if g]
    return len(gpus) or None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    """A check that none of the session's specs gives a test (``test_state_dtype`` where no
    op takes a state in another dtype) is not collected: parametrized over nothing, pytest
    would make it one skipped test, ``[NOTSET]``, "got empty parameter set"."""
    if not collector.istestfunction(obj, name) or getattr(obj, "fla_parametrize", None) is None:
        return None
    return None if registry.params_for(collector.config, obj) else []


def pytest_generate_tests(metafunc):
    if hasattr(metafunc.function, "fla_parametrize"):
        registry.parametrize(metafunc)
    if "cu_seqlens" in metafunc.fixturenames and not any(
        "cu_seqlens" in getattr(m, "args", ("",))[0] for m in metafunc.definition.iter_markers("parametrize")
    ):
        parametrize_cu_seqlens(metafunc)


def pytest_ignore_collect(collection_path, config):
    if collection_path.is_dir():
        projects.refuse_nested_project(collection_path, config)  # a project of its own: refused
    return None


def pytest_collect_file(file_path, parent):
    # A reproducer named on the command line is offered to the python collector instead.
    if repro.is_repro_file(file_path) and not parent.session.isinitpath(file_path):
        return repro.ReproFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    """A reproducer is never imported as a test module: it runs in a process of its own."""
    if repro.is_repro_file(module_path):
        return repro.ReproFile.from_parent(parent, path=module_path)
    return None


def _compile_arch(item) -> str | None:
    marker = item.get_closest_marker("fla_compile")
    return marker.args[0] if marker and marker.args else None


def pytest_collection_modifyitems(config, items):
    state = config.stash[RUN]
    ops = config.option.fla_ops
    wanted = {o.strip() for o in ops.split(",") if o.strip()} if ops else None
    here = state.target.name if state.target else None
    keep, drop = [], []
    for item in items:
        op, _ = run_report.op_and_check(item)
        arch = _compile_arch(item)
        if wanted is not None and op not in wanted:
            drop.append(item)
        elif arch is not None and not (arch == here and targets.COMPILES[state.target.mode]):
            drop.append(item)  # a compile check runs in its own arch's process, nowhere else
        else:
            keep.append(item)
    if config.option.fla_quick:
        keep, left_out = quick.split(keep, _compile_arch)
        drop += left_out
    if drop:
        config.hook.pytest_deselected(items=drop)
    if state.tools:
        from .sanitizer.reruns import skipped_under_tools

        for item in keep:
            reason = skipped_under_tools(config, item)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
    if config.option.fla_durations:
        granularity = state.isolate if state.isolate in ("batch", "module") else "test"
        seconds = distribute.durations_of(config)
        keys = distribute.batch_keys([i.nodeid for i in keep], granularity, seconds) if granularity != "test" else {}
        keep = distribute.longest_first(keep, keys, seconds)
    if state.role == "worker":  # a pytest started by a worker's test inherits the variable too
        keep, others = distribute.my_share(keep)
        if others:
            config.hook.pytest_deselected(items=others)
    # Checks that hold the GPU alone (large_memory) last: taking it mid-run waits for every
    # check in flight and idles the rest of the GPU meanwhile; at the end little is in flight.
    items[:] = [i for i in keep if i.get_closest_marker("large_memory") is None] + \
        [i for i in keep if i.get_closest_marker("large_memory") is not None]


def pytest_runtest_setup(item):
    target = item.config.stash[RUN].target
    if target is None or target.mode != targets.COMPILE_ONLY:
        return
    if _compile_arch(item) is None and not isinstance(item, repro.ReproItem):
        pytest.skip(f"runs kernels; {target.name} is compile-only here ({target.reason})")


def pytest_runtest_teardown(item, nextitem):
    gpu_memory.after_test(last=nextitem is None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    state = item.config.stash[RUN]
    from .running import gpu_share

    # patient where no check that shares the GPU follows in this process; a child knows only
    # its own batch, not the tests its worker runs after it: never patient
    gpu_share.set_patient(state.role != "child" and
                          (nextitem is None or nextitem.get_closest_marker("large_memory") is not None))
    if state.role == "child" or (state.isolate == "none" and not state.tools) or isinstance(item, repro.ReproItem):
        return None
    if state.target is not None and state.target.mode == targets.COMPILE_ONLY and _compile_arch(item) is None:
        return None  # skipped at setup: nothing to isolate
    from .running.isolation import replay, run_batch
    from .sanitizer.reruns import Verdict, skipped_under_tools, verdicts

    if state.tools and skipped_under_tools(item.config, item):
        return None  # skipped here, by its marker: no child for it

    # Under the sanitizer the plain run uses the tool's small shapes too: it compiles the very
    # kernels the tool then runs, outside the tool (numerics at GPU sizes: a plain run's job).
    env = {environment.COUNT_LAUNCHES: "1", **sanitizer.SHAPES_ENV} if state.tools else None
    if item.nodeid not in state.batches:
        batch = _batch(item, nextitem, state) if state.isolate in ("batch", "module") else [item]
        outcomes = run_batch(item.config, batch, env=env)
        if state.tools:
            for nodeid, verdict in verdicts(item.config, batch, outcomes, state.tools).items():
                outcomes[nodeid].verdict = verdict
        state.batches.update(outcomes)
    outcome = state.batches.pop(item.nodeid)
    verdict = outcome.verdict or Verdict()
    replay(item, outcome, extra_failure=verdict.failure, section=verdict.section, tool_time=verdict.time)
    return True


def _batch(item, nextitem, state) -> list:
    """``item`` and the tests of its batch (or module) still to run in this process (under
    xdist: the ones queued to this worker, and the next one, which xdist has already taken
    off the queue)."""
    from .sanitizer.reruns import skipped_under_tools

    items = item.session.items
    if state.batch_keys is None:
        state.batch_keys = distribute.batch_keys([i.nodeid for i in items], state.isolate,
                                                 distribute.durations_of(item.config))
    key = state.batch_keys.get(item.nodeid)
    queued = distribute.queued_here(item.session)
    return [item] + [
        other for index, other in enumerate(items)
        if other is not item and state.batch_keys.get(other.nodeid) == key and other.nodeid not in state.batches
        and (queued is None or index in queued or other is nextitem)
        and not (state.tools and skipped_under_tools(item.config, other))
    ]


def _splits_test_time(config, role: str) -> bool:
    """Whether this process records where each of its tests' time went (``time_split``): a
    child always (its parent reports it), any other process under ``--fla-report``."""
    return role == "child" or bool(config.option.fla_report)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test run in this process records where its time went (``time_split``: drawing
    inputs, the float64 reference, compiling and loading kernels), where that is wanted."""
    state = item.config.stash.get(RUN, None)
    if state is None or not _splits_test_time(item.config, state.role):
        return (yield)
    before = time_split.totals()
    try:
        return (yield)
    finally:
        item.user_properties.append((run_report.PARTS_PROPERTY, time_split.since(before)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    result = yield
    run_report.annotate(item, result)
    run_report.classify(item, call, result)
    if result.failed and call.when == "call" and dict(result.user_properties).get(verdicts.PROPERTY) == verdicts.DEFECT:
        from .repro import shrink

        saved = shrink.save(item, run_report.outcome_reason(result) or "")
        if saved is not None:
            result.sections.append(("fla reproducer", f"the smallest failing call, written to {saved}"))
    return result


class ReportCollector:
    """Feeds every test report this process sees (its own, or its workers') to the report,
    and keeps ``--fla-report`` written while the run goes: at each failure and at most
    every ``EVERY`` seconds, so a run killed at a device's time limit (SIGKILL: no session
    end) still leaves its failures and their reasons."""

    EVERY = 30.0

    def __init__(self, report: run_report.RunReport, path: str | None = None):
        self.report, self.path, self.written = report, path, time.monotonic()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report):
        self.report.add(report)
        if self.path and (report.failed or time.monotonic() - self.written > self.EVERY):
            self.report.write_json(self.path, finished=False)
            self.written = time.monotonic()


def pytest_terminal_summary(terminalreporter, config):
    state = config.stash.get(RUN, None)
    if state is None or state.report is None:
        return
    lines = state.report.lines()
    if lines:
        terminalreporter.write_sep("=", "fla: ops x checks per arch")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session):
    config = session.config
    state = config.stash.get(RUN, None)
    path = config.option.fla_report
    if state is not None and state.report is not None and path:
        state.report.write_json(path)
