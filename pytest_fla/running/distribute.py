"""Spreading a run over processes with pytest-xdist.

Several arch targets: one xdist worker per target (``--dist each``), each started
with its target's environment, so every worker collects the same tests and runs
them under its own target; with ``-n N``, N workers for a target that runs the numeric
checks, each keeping every N-th test, and N shared out among the compile-only targets.
One target and ``-n auto``: one worker per visible GPU, each pinned to its GPU through
``CUDA_VISIBLE_DEVICES`` before anything touches CUDA.
"""

from __future__ import annotations

import functools
import os

import pytest

from .. import environment, targets


def tx_spec(target: targets.Target, extra_env: dict[str, str]) -> str:
    return with_env("popen", {**targets.target_environment(target), **extra_env})


def with_env(spec: str, env: dict[str, str]) -> str:
    """The execnet gateway ``spec`` with ``env`` set in the worker (``env:``; the last
    setting of a name wins) and without an ``id=``: xdist names each worker."""
    for key, value in env.items():
        if "//" in value:
            raise pytest.UsageError(f"{key}={value!r}: a value with '//' cannot be passed to an xdist worker")
    parts = [part for part in spec.split("//") if not part.startswith("id=")]
    return "//".join(parts + [f"env:{key}={value}" for key, value in env.items()])


def xdist_loaded(config) -> bool:
    """Whether pytest-xdist is in the run: by its entry point (``xdist``), or named by its
    module (``-p xdist.plugin``, the form a run with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``
    loads it by)."""
    return config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin")


def use_one_worker_per_target(config, run_targets: list[targets.Target]) -> None:
    """Workers per target (``--dist each``), each running its share of the target's tests:
    ``-n N`` (default 1) for a target that runs the numeric checks, and N shared out among
    the compile-only targets, at least one each.

    The numeric target is most of a run's work: under ``--fla-arch=all`` on two cores its one
    worker ran alone for most of the run, the compile-only ones done, the other core idle.
    A lone compile-only target (``--fla-arch=sm90``) with one worker left a core idle too."""
    if not xdist_loaded(config):
        raise pytest.UsageError("--fla-arch with several targets runs one worker per target: install pytest-xdist")
    shares = getattr(config.option, "numprocesses", None) or 1
    if shares in ("auto", "logical"):
        shares = os.cpu_count() or 1
    compile_only = sum(t.mode == targets.COMPILE_ONLY for t in run_targets)
    specs = []
    for target in run_targets:
        n = max(1, int(shares) // compile_only) if target.mode == targets.COMPILE_ONLY else int(shares)
        specs += [tx_spec(target, {environment.SHARD: f"{k}/{n}"} if n > 1 else {}) for k in range(n)]
    config.option.tx = specs
    config.option.dist = "each"
    config.option.numprocesses = None  # the workers are the specs above, not xdist's -n


def my_share(items: list) -> tuple[list, list]:
    """In a worker that runs one share of its target's tests: (its items, the others)."""
    shard = os.environ.get(environment.SHARD, "")
    if not shard:
        return items, []
    k, n = (int(part) for part in shard.split("/"))
    return items[k::n], [item for i, item in enumerate(items) if i % n != k]


def visible_gpus(gpu: targets.Gpu) -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()][: gpu.count]
    return [str(i) for i in range(gpu.count)]


def pin_worker_to_gpu(target: targets.Target | None) -> None:
    """In an xdist worker running ``target``: see only GPU ``worker index % GPU count`` (set
    by the controller)."""
    gpus = [g for g in os.environ.get(environment.GPUS, "").split(",") if g]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not gpus or not worker.startswith("gw") or (target and target.mode == targets.COMPILE_ONLY):
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[int(worker[2:]) % len(gpus)]


def queued_here(session) -> set[int] | None:
    """In an xdist worker: the indices into ``session.items`` that xdist has handed this
    worker and it has not run yet; None outside a worker (every item is this process's).

    A ``--fla-isolate=module`` batch must hold only these: under ``-n N`` each worker
    collects the whole session, and a batch of every item in the module made each test
    run once per worker. Reads xdist's worker queue (pytest-xdist 3); where that is not
    there, an empty set, and a batch is the test (and the next one) alone.
    """
    if not hasattr(session.config, "workerinput"):
        return None
    for plugin in session.config.pluginmanager.get_plugins():
        queue = getattr(plugin, "torun", None)
        if type(plugin).__name__ == "WorkerInteractor" and queue is not None and hasattr(queue, "lock"):
            with queue.lock() as pending:
                return {i for i in pending if isinstance(i, int)}
    return set()


# A batch (--fla-isolate=batch) is a check's tests for one op: one test function and the
# first part of its parameters (the op, in the conformance suite). They share kernels, so a
# child pays start-up (torch, CUDA, collection; most of an isolated test's time) once for
# them and compiles or instruments each kernel once. At most this many tests per batch, so
# that work still spreads over workers.
BATCH_LIMIT = 24
# A check with one or two tests per op (huge grid, 2**31 elements, host syncs, every output
# written, determinism) would be a child per op: two start-ups (plain, then under the tool,
# 14-29 s each under memcheck on the H100) for a test or two. Groups under SMALL_GROUP tests
# are merged across ops, in the order collected, into batches of up to SMALL_BATCH.
SMALL_GROUP = 4
SMALL_BATCH = 8
# With --fla-durations, a batch also ends before its recorded seconds pass this: a check
# whose tests are each slow (chunk_kda's varlen checks under memcheck, about 49 s each on
# the H100 once its intra kernel compiled in two forms) goes to several children, where one
# child running all ten kept the run going after every other batch had finished.
BATCH_SECONDS = 120.0


DIST_CHOICES = ("test", "op")
# test ids' dtype parameters: an op's kernels in one dtype are one set of compiles, shared by
# every check of that op (forward, backward, varlen, ...), and nothing with another dtype's
DTYPE_IDS = frozenset({"fp32", "bf16", "fp16", "fp64", "float32", "bfloat16", "float16", "float64"})


def op_key(nodeid: str) -> str:
    """The work unit ``--fla-dist=op`` hands a worker: the test's first parameter (the op, in
    the conformance suite) and its dtype parameter, across test functions and modules; a test
    without parameters goes with its module."""
    path, _, rest = nodeid.partition("::")
    _, bracket, params = rest.partition("[")
    if not bracket:
        return path
    parts = params.rstrip("]").split("-")
    dtype = next((part for part in parts[1:] if part in DTYPE_IDS), "")
    return f"{parts[0]}[{dtype}]"


def batch_keys(nodeids: list[str], granularity: str, seconds: dict[str, float] | None = None) -> dict[str, str]:
    """nodeid -> the batch it runs in: its op and dtype (``op``: ``op_key``), its module (``module``), or its test function and
    first parameter, in runs of at most BATCH_LIMIT tests, small groups of one function
    merged across parameters in runs of at most SMALL_BATCH (``batch``); where ``seconds``
    records them (``recorded_seconds``), a run also ends before BATCH_SECONDS. Tests not
    recorded count nothing toward it."""
    if granularity == "op":
        return {nodeid: op_key(nodeid) for nodeid in nodeids}
    if granularity == "module":
        return {nodeid: nodeid.partition("::")[0] for nodeid in nodeids}
    groups: dict[str, list[str]] = {}
    for nodeid in nodeids:
        path, _, rest = nodeid.partition("::")
        name, bracket, params = rest.partition("[")
        group = f"{path}::{name}" + (f"[{params.rstrip(']').split('-')[0]}]" if bracket else "")
        groups.setdefault(group, []).append(nodeid)
    keys, small = {}, {}  # small: function -> its small groups' tests, in order
    for group, members in groups.items():
        if len(members) >= SMALL_GROUP:
            keys.update({nodeid: f"{group}#{part}" for nodeid, part in _runs(members, BATCH_LIMIT, seconds or {})})
        else:
            small.setdefault(group.partition("[")[0], []).extend(members)
    for function, members in small.items():
        keys.update({nodeid: f"{function}[small]#{part}" for nodeid, part in _runs(members, SMALL_BATCH, seconds or {})})
    return keys


def _runs(members: list[str], limit: int, seconds: dict[str, float]):
    """``(nodeid, run index)``: consecutive runs of at most ``limit`` tests and, past their
    first test, BATCH_SECONDS recorded seconds."""
    part, count, total = 0, 0, 0.0
    for nodeid in members:
        cost = seconds.get(nodeid, 0.0)
        if count and (count == limit or total + cost > BATCH_SECONDS):
            part, count, total = part + 1, 0, 0.0
        count, total = count + 1, total + cost
        yield nodeid, part


def durations_of(config) -> dict[str, float] | None:
    """The recorded seconds of ``--fla-durations`` (None without it), read once a process."""
    path = config.getoption("fla_durations", None)
    return recorded_seconds(path) if path else None


@functools.lru_cache(maxsize=4)
def recorded_seconds(path: str) -> dict[str, float]:
    """nodeid -> the seconds an earlier run's ``--fla-report`` gives it: its child processes'
    wall time where it ran isolated (start-up and the tool's runs included), else its own.
    A path ending in ``.gz`` is read gzipped."""
    import gzip
    import json

    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            tests = json.load(f)["tests"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise pytest.UsageError(f"--fla-durations: cannot read {path}: {error}") from None
    seconds = {}
    for test in tests:
        value = test.get("process_seconds")
        seconds[test["nodeid"]] = float(value if value is not None else test.get("duration") or 0.0)
    return seconds


def longest_first(items: list, keys: dict[str, str], seconds: dict[str, float]) -> list:
    """``items`` with their batches (``keys``: nodeid -> batch) longest first, by the recorded
    ``seconds`` (a test not recorded counts as the median recorded one); the tests of a
    batch keep their order, batches of equal time theirs.

    A run's end waits for its last batch: started last, the longest ones (a chunked op's
    varlen checks, compiling each packing's kernels: 4-6.5 minutes of one memcheck worker on
    the H100) kept the run going minutes after the other workers had finished."""
    known = sorted(seconds.values())
    typical = known[len(known) // 2] if known else 0.0
    order: dict[str, int] = {}
    cost: dict[str, float] = {}
    for item in items:
        key = keys.get(item.nodeid, item.nodeid)
        order.setdefault(key, len(order))
        cost[key] = cost.get(key, 0.0) + seconds.get(item.nodeid, typical)
    return sorted(items, key=lambda item: (-cost[keys.get(item.nodeid, item.nodeid)],
                                           order[keys.get(item.nodeid, item.nodeid)]))


def batch_scheduler(config, log, granularity: str):
    """An xdist scheduler that hands each worker whole batches (xdist's ``loadscope`` with
    the batch as the scope), so a worker's batch is all of it rather than the 2-4 tests
    that ``load`` queues on a worker at a time. With ``--fla-durations`` the batches go out
    in the workers' collection order (longest first, ``longest_first``), not xdist's order
    by test count."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getoption("fla_durations", None) and hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False

    class BatchScheduling(LoadScopeScheduling):
        keys: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if not self.keys and self.collection:
                self.keys = batch_keys(list(self.collection), granularity, durations_of(config))
            return self.keys.get(nodeid) or batch_keys([nodeid], granularity)[nodeid]

    return BatchScheduling(config, log)
