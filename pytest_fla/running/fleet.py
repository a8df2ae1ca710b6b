"""One run over several GPU hosts: ``--fla-arch=fleet`` with the user's xdist gateways.

Each ``--tx`` gateway (``ssh=``, ``socket=``, ``popen``; ``--rsyncdir`` as usual) is a host.
Before the session the controller opens each gateway once and asks it what it has
(``fleet_probe``: hostname, GPUs through torch.cuda, driver, torch, Triton, compute-sanitizer),
stops with a usage error when the hosts' torch or Triton differ (unless
``--fla-fleet-mixed-versions``), and then plans xdist's workers (``plan``):

* on every host, one worker per GPU (``-n N``: N per GPU), pinned to it through
  ``CUDA_VISIBLE_DEVICES`` and running that GPU's arch natively;
* a host without a GPU runs the numeric checks under the interpreter;
* an arch named beside ``fleet`` that no host has (``--fla-arch=fleet,sm100``) runs emulated
  on the first host whose GPU can emulate it, else compile-only (on the hosts in turn);
* all the workers of one arch form its group, and each keeps every n-th of the tests
  (``FLA_SHARD``): a test runs once per arch, on one host that has it.

The workers are xdist's, started from the planned specs (the user's spec plus ``env:``
settings) under ``--dist each``; xdist's own scheduling, crash handling and
``--max-worker-restart`` apply (default 0 in a fleet: a restart of a host that went down
would fail to connect and end the whole run). The controller tags nothing: each worker
tags its reports with its host (``FLA_FLEET_HOST``, read by ``report.annotate``), and
``FleetWatch`` reports the tests a worker that went down never ran.

``FLA_FLEET_STAND_IN=sm80`` (``sm90x2``, ``sm80,sm90``) in a gateway's environment is the
test hook: that host reports those GPUs instead of probing, and runs them as a machine
without a GPU can, the numeric checks under Triton's interpreter with that arch's kernel
configs (mode ``interpreter``); nothing is run on a GPU. Used by the plugin's tests, with
popen gateways standing in for hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from .. import environment, targets
from .distribute import with_env, xdist_loaded
from ..targets import COMPILE_ONLY, EMULATED, INTERPRETER, NATIVE, Target, arch_name

FLEET = "fleet"
# A host imports torch and initialises CUDA to answer: generous for a cold import on a busy machine.
PROBE_SECONDS = 300.0


@dataclass(frozen=True)
class HostGpu:
    id: str  # as CUDA_VISIBLE_DEVICES names it on its host
    arch: int
    name: str


@dataclass(frozen=True)
class Host:
    """One ``--tx`` gateway and what its probe found there."""

    name: str  # unique in the fleet: the hostname, numbered where gateways share one
    spec: str
    hostname: str
    gpus: tuple[HostGpu, ...]
    stand_in: bool
    driver: str | None
    torch: str | None
    triton: str | None
    python: str
    sanitizer: str | None  # compute-sanitizer's path there

    def describe(self) -> str:
        if self.gpus:
            names = {}
            for gpu in self.gpus:
                names.setdefault(f"{gpu.name} ({arch_name(gpu.arch)})", []).append(gpu.id)
            gpus = ", ".join(f"{len(ids)}x {name} [GPU {','.join(ids)}]" for name, ids in names.items())
        else:
            gpus = "no GPU"
        return (f"{self.name}: {gpus}; driver {self.driver or '-'}, torch {self.torch or '-'}, "
                f"Triton {self.triton or '-'}, Python {self.python} (--tx {self.spec})")

    def to_json(self) -> dict:
        return {
            "name": self.name, "spec": self.spec, "hostname": self.hostname, "stand_in": self.stand_in,
            "gpus": [{"id": g.id, "arch": arch_name(g.arch), "name": g.name} for g in self.gpus],
            "driver": self.driver, "torch": self.torch, "triton": self.triton, "python": self.python,
        }


@dataclass(frozen=True)
class FleetWorker:
    spec: str  # the execnet spec xdist starts it from
    host: str
    target: Target
    gpu: str | None  # the GPU it is pinned to (None: it touches none)


@dataclass
class Fleet:
    hosts: list[Host]
    targets: list[Target]
    workers: list[FleetWorker] = field(default_factory=list)

    def workers_of(self, target: Target) -> list[FleetWorker]:
        return [w for w in self.workers if w.target == target]


def requested(arch_option: str) -> bool:
    return FLEET in targets.arch_words(arch_option)


def extra_archs(arch_option: str) -> list[int]:
    """The archs named beside ``fleet`` (``all`` is every known one; ``native`` is implied)."""
    archs: list[int] = []
    for word in targets.arch_words(arch_option):
        if word in (FLEET, "native"):
            continue
        archs.extend(targets.ALL_ARCHS if word == "all" else [targets.parse_arch(word)])
    return list(dict.fromkeys(archs))


def probe_hosts(specs: list[str]) -> list[dict]:
    """Each spec's probe answer, the gateways opened all at once and closed after."""
    import execnet

    from . import fleet_probe

    group = execnet.Group()
    try:
        channels = []
        for spec in specs:
            try:
                gateway = group.makegateway(spec)
            except Exception as error:
                raise pytest.UsageError(f"--fla-arch=fleet: cannot open --tx {spec}: {error}") from None
            channel = gateway.remote_exec(fleet_probe)
            channel.send(environment.FLEET_STAND_IN)
            channels.append(channel)
        answers = []
        for spec, channel in zip(specs, channels):
            try:
                answers.append(channel.receive(timeout=PROBE_SECONDS))
            except Exception as error:
                raise pytest.UsageError(f"--fla-arch=fleet: the host of --tx {spec} did not answer: {error}") from None
        return answers
    finally:
        group.terminate(timeout=10.0)


_STAND_IN_RE = re.compile(r"^(sm_?\d{2,3})(?:x(\d+))?$")


def stand_in_gpus(text: str) -> tuple[HostGpu, ...]:
    """``sm80``, ``sm90x2`` or ``sm80,sm90`` -> the stand-in GPUs (ids 0, 1, ...)."""
    archs = []
    for word in (w.strip().lower() for w in text.split(",") if w.strip()):
        match = _STAND_IN_RE.match(word)
        if match is None:
            raise ValueError(f"{environment.FLEET_STAND_IN}={text!r}: expected archs such as sm80, sm90x2 or sm80,sm90")
        archs += [targets.parse_arch(match.group(1))] * int(match.group(2) or 1)
    return tuple(HostGpu(str(i), arch, "stand-in") for i, arch in enumerate(archs))


def hosts_from_answers(specs: list[str], answers: list[dict]) -> list[Host]:
    """Hosts named by hostname, numbered ``#1``, ``#2`` where several gateways share one."""
    counts: dict[str, int] = {}
    for answer in answers:
        counts[answer["hostname"]] = counts.get(answer["hostname"], 0) + 1
    seen: dict[str, int] = {}
    hosts = []
    for spec, answer in zip(specs, answers):
        if answer.get("error"):
            raise ValueError(f"--tx {spec} ({answer['hostname']}): torch cannot look for GPUs: {answer['error']}")
        hostname = answer["hostname"]
        seen[hostname] = seen.get(hostname, 0) + 1
        name = hostname if counts[hostname] == 1 else f"{hostname}#{seen[hostname]}"
        if answer["stand_in"]:
            gpus = stand_in_gpus(answer["stand_in"])
        else:
            gpus = tuple(HostGpu(g["id"], g["arch"], g["name"]) for g in answer["gpus"])
        hosts.append(Host(name, spec, hostname, gpus, bool(answer["stand_in"]), answer["driver"], answer["torch"],
                          answer["triton"], answer["python"], answer["sanitizer"]))
    return hosts


# What changes a kernel's results between hosts: its compiler, and torch (the references,
# the allocator, the inputs drawn).
RESULT_VERSIONS = (("triton", "Triton"), ("torch", "torch"))


def version_disagreement(hosts: list[Host]) -> str | None:
    """What the hosts disagree on, one line per package (None when they agree)."""
    lines = []
    for attribute, label in RESULT_VERSIONS:
        by_version: dict[str, list[str]] = {}
        for host in hosts:
            by_version.setdefault(getattr(host, attribute) or "not installed", []).append(host.name)
        if len(by_version) > 1:
            lines.append(f"{label}: " + "; ".join(f"{v} on {', '.join(names)}" for v, names in by_version.items()))
    return "\n".join(lines) or None


def plan(hosts: list[Host], extra: list[int], per_gpu: int) -> Fleet:
    """The fleet's targets and workers (see the module's docstring)."""
    slots: dict[str, list[tuple[Host, str | None]]] = {}  # target name -> (host, GPU) of each worker
    by_name: dict[str, Target] = {}

    def add(target: Target, host: Host, gpu: str | None, count: int) -> None:
        known = by_name.setdefault(target.name, target)
        if known.mode != target.mode:
            raise ValueError(f"{target.name} is {known.mode} on one host and {target.mode} on {host.name}: "
                             f"a stand-in ({environment.FLEET_STAND_IN}) cannot share an arch with a real GPU")
        slots.setdefault(target.name, []).extend([(host, gpu)] * count)

    for host in hosts:
        if not host.gpus:
            add(Target(INTERPRETER, None, INTERPRETER, "numeric checks on the CPU under TRITON_INTERPRET=1"),
                host, None, per_gpu)
        for gpu in host.gpus:
            name = arch_name(gpu.arch)
            if host.stand_in:
                target = Target(name, gpu.arch, INTERPRETER, f"stand-in hosts ({environment.FLEET_STAND_IN}): "
                                f"numeric checks under TRITON_INTERPRET=1 with {name}'s kernel configs, no GPU")
            else:
                target = Target(name, gpu.arch, NATIVE, "the hosts' own GPUs")
            add(target, host, gpu.id, per_gpu)
    compile_hosts = 0
    for arch in extra:
        name = arch_name(arch)
        if name in by_name:
            continue
        emulating = [(host, gpu) for host in hosts if not host.stand_in for gpu in host.gpus
                     if targets.choose_mode(arch, targets.Gpu(1, gpu.arch))[0] == EMULATED]
        if emulating:
            host = emulating[0][0]
            for gpu in (g for h, g in emulating if h is host):
                add(Target(name, arch, EMULATED, f"emulated on {host.name}'s {arch_name(gpu.arch)} GPUs "
                            f"(TRITON_OVERRIDE_ARCH={name}, {name}'s shared-memory limit)"), host, gpu.id, per_gpu)
        else:
            host = hosts[compile_hosts % len(hosts)]
            compile_hosts += 1
            add(Target(name, arch, COMPILE_ONLY, f"no host has a GPU that runs {name} code: compiled offline "
                        f"on {host.name}"), host, None, per_gpu)
    for host in hosts:
        count = sum(h is host for places in slots.values() for h, _ in places)
        if count > 1 and host.spec.startswith("socket="):
            raise ValueError(f"--tx {host.spec} would run {count} workers, and execnet's socket server runs one "
                             "gateway at a time: start a server per GPU (each with its CUDA_VISIBLE_DEVICES) and "
                             "give -n 1, or use ssh")
    fleet = Fleet(hosts, list(by_name.values()))
    for name, places in slots.items():
        target = by_name[name]
        for k, (host, gpu) in enumerate(places):
            env = {environment.RUN_TARGET: target.encode(), environment.FLEET_HOST: host.name,
                   "CUDA_VISIBLE_DEVICES": gpu if gpu is not None and target.mode != INTERPRETER else ""}
            if len(places) > 1:
                env[environment.SHARD] = f"{k}/{len(places)}"
            fleet.workers.append(FleetWorker(with_env(host.spec, env), host.name, target, gpu))
    return fleet


def user_specs(config) -> list[str]:
    """The user's ``--tx`` gateways, each a host (as given: xdist's own ``pytest_cmdline_main``
    may already have replaced ``config.option.tx`` with ``-n``'s popen gateways)."""
    specs = list(getattr(config.known_args_namespace, "tx", None) or [])
    if not specs:
        raise pytest.UsageError("--fla-arch=fleet runs on the hosts of your xdist gateways: give one --tx per host "
                                "(--tx ssh=gpu-a//python=/venv/bin/python --tx ssh=gpu-b//python=...)")
    for spec in specs:
        if re.match(r"^\d+\*", spec):
            raise pytest.UsageError(f"--tx {spec}: in a fleet each --tx is one host, which gets one worker per GPU; "
                                    "-n N gives N workers per GPU")
    return specs


def check_test_paths(config, specs: list[str]) -> None:
    """xdist maps the test paths of the command line onto its ``--rsyncdir`` roots for a
    gateway that is not a plain popen (``ssh=``, ``socket=``, a ``chdir=``), and without
    such roots fails mid-start with an internal error: say so before anything starts."""
    import os

    from execnet import XSpec

    roots = list(getattr(config.option, "rsyncdir", None) or [])
    try:
        roots += config.getini("rsyncdirs")
    except ValueError:  # not an ini option without xdist
        pass
    if roots:
        return
    remote = [s for s in specs if not XSpec(s).popen or XSpec(s).chdir]
    paths = [a for a in config.invocation_params.args
             if not str(a).startswith("-") and os.path.exists(str(a).partition("::")[0])]
    if remote and paths:
        raise pytest.UsageError(
            f"--tx {remote[0]}: xdist hands such a gateway test paths relative to its --rsyncdir roots, and there "
            f"are none: give no test paths ({', '.join(map(str, paths))}) and let each host run its checkout's "
            "testpaths (select with -k, -m or --fla-ops), or --rsyncdir the directories they are in")


def workers_per_gpu(config) -> int:
    """``-n N``, as given (xdist turns ``auto`` into a count of CPUs): N workers per GPU."""
    value = getattr(config.known_args_namespace, "numprocesses", None)
    if value in (None, "auto", "logical"):
        return 1
    return max(1, int(value))


def start(config) -> Fleet:
    """On the controller, before the session: probe the hosts, refuse what cannot run,
    and hand xdist the planned workers."""
    if not xdist_loaded(config):
        raise pytest.UsageError("--fla-arch=fleet runs on xdist's gateways: install pytest-xdist")
    try:
        extra = extra_archs(config.option.fla_arch)
    except ValueError as error:
        raise pytest.UsageError(f"--fla-arch: {error}") from None
    specs = user_specs(config)
    check_test_paths(config, specs)
    try:
        hosts = hosts_from_answers(specs, probe_hosts(specs))
        disagreement = version_disagreement(hosts)
        if disagreement and not config.option.fla_fleet_mixed_versions:
            raise ValueError("the hosts run different versions of what changes results, so their cells would not "
                             f"compare:\n{disagreement}\nalign them, or pass --fla-fleet-mixed-versions to run anyway")
        if config.option.fla_sanitizer:
            missing = [h.name for h in hosts if h.sanitizer is None]
            if missing:
                raise ValueError(f"--fla-sanitizer: compute-sanitizer is not on the PATH of {', '.join(missing)}")
        fleet = plan(hosts, extra, workers_per_gpu(config))
    except ValueError as error:
        raise pytest.UsageError(f"--fla-arch=fleet: {error}") from None
    config.option.tx = [w.spec for w in fleet.workers]
    config.option.dist = "each"
    config.option.numprocesses = None  # the workers are the specs above, not xdist's -n
    if getattr(config.option, "maxworkerrestart", None) is None:
        config.option.maxworkerrestart = "0"
    return fleet


def prepare_worker(target: Target | None) -> None:
    """In a fleet worker running ``target``, before anything imports torch or triton: the
    rest of its target's environment, built on its own host (its Triton cache there, not
    the controller's)."""
    if target is not None:
        env = targets.target_environment(target)
        if target.mode != COMPILE_ONLY:
            env.pop("CUDA_VISIBLE_DEVICES", None)  # its GPU, as the plan pinned it
        targets.apply_environment(env)


def header_lines(fleet: Fleet) -> list[str]:
    gpus = sum(len(h.gpus) for h in fleet.hosts)
    lines = [f"fla fleet: {len(fleet.hosts)} hosts, {gpus} GPUs, {len(fleet.workers)} xdist workers (one per GPU, "
             "-n N: N per GPU, each pinned to it); each arch's tests shared out among its workers, once per arch"]
    lines += [f"  {host.describe()}" for host in fleet.hosts]
    return lines


def target_hosts(fleet: Fleet, target: Target) -> str:
    """``on gpu-a (GPU 0,1), gpu-b (GPU 0): 3 workers``."""
    places: dict[str, list[str]] = {}
    workers = fleet.workers_of(target)
    for worker in workers:
        ids = places.setdefault(worker.host, [])
        if worker.gpu is not None and worker.gpu not in ids and target.mode != INTERPRETER:
            ids.append(worker.gpu)
    where = ", ".join(f"{host} (GPU {','.join(ids)})" if ids else host for host, ids in places.items())
    return f"on {where}: {len(workers)} worker{'s' if len(workers) != 1 else ''}"


class FleetWatch:
    """On the controller: which tests each worker was to run, which it reported, and which
    were lost with a worker that went down (a host lost, or its process killed)."""

    def __init__(self, report):
        self.report = report
        self.collected: dict[object, tuple[str, list[str]]] = {}  # node -> (its target's name, its tests)
        self.down: dict[object, str] = {}  # node -> why it went down
        self.scheduled = False  # every worker's collection arrived, and xdist handed the tests out

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.collected[node] = (node.gateway.spec.env.get(environment.RUN_TARGET, "").partition(":")[0], list(ids))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        if error is not None:
            self.down[node] = str(error).strip().splitlines()[-1] if str(error).strip() else "went down"

    def pytest_runtest_logstart(self):
        self.scheduled = True

    @staticmethod
    def _where(node) -> str:
        return f"worker {node.gateway.id} on {node.gateway.spec.env.get(environment.FLEET_HOST)}"

    def lost(self) -> list[tuple[str, str, str | None, str]]:
        """``(nodeid, arch, host, why)`` of each test a worker that went down never ran."""
        done = set(self.report.records)
        lost = []
        for node, why in self.down.items():
            arch, ids = self.collected.get(node, ("", []))
            for nodeid in ids:
                if (nodeid, arch) not in done:
                    lost.append((nodeid, arch, node.gateway.spec.env.get(environment.FLEET_HOST),
                                 f"not run: {self._where(node)} went down ({why})"))
        return lost

    def early(self) -> list[str]:
        """The workers that went down before the tests were handed out: xdist then stops
        the others too (``--max-worker-restart`` reached) and nothing runs."""
        return [f"{self._where(node)} went down before the tests were handed out ({why}): xdist stopped the run"
                for node, why in self.down.items() if not self.scheduled]

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session):
        for nodeid, arch, host, why in self.lost():
            self.report.add_lost(nodeid, arch, host, why)
        if self.early() and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a run that ran nothing of a host passes nothing

    def pytest_terminal_summary(self, terminalreporter):
        for line in self.early():
            terminalreporter.write_line(f"fla fleet: {line}", red=True)
