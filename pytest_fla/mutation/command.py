"""``python -m pytest_fla mutate``: plant one bug at a time in an op's kernels and see
whether its checks catch it (``docs/design.md``, "Mutation testing").

For each op: its kernels' reached lines are found (:mod:`.sites`, in a child pytest that
collects only), its mutants listed and a spread few selected (:mod:`.plan`), its checks
run once unmutated (they must pass: the baseline, whose time sets the per-mutant limit),
then once per mutant (:mod:`.runner`), ``--jobs`` copies of the project at a time (an
invalid mutant is replaced by the op's next one, up to ``--max-per-op`` times). One
line per mutant while it runs, the score table last (:mod:`.report`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import shlex
import shutil
import sys
import signal
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import environment
from . import plan, report
from .runner import DEVICE_OPTIONS, Workspace, conformance_modules, make_workspaces, stop_children
from .sites import Mutant, mutants_of

DEFAULT_MAX_PER_OP = 12
DEFAULT_SEED = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fla-ops", default="", help="comma-separated ops (default: every op of the specs)")
    parser.add_argument("--root", default=".", type=Path, help="the project: where its tests and kernels are (default .)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the interpreter (TRITON_INTERPRET=1); cuda: native on the GPU, at the small shapes")
    parser.add_argument("--jobs", type=int, default=1, help="copies of the project run at once (default 1)")
    parser.add_argument("--max-per-op", type=int, default=DEFAULT_MAX_PER_OP,
                        help=f"mutants drawn per op (default {DEFAULT_MAX_PER_OP})")
    parser.add_argument("--all", action="store_true", help="every site, no sampling")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the selection (default 0)")
    parser.add_argument("--mutant", action="append", default=[], metavar="ID",
                        help="run this mutant id (repeatable; replaces the selection)")
    parser.add_argument("--survivors-of", type=Path, default=None, metavar="JSON",
                        help="run, per op, the mutants a recorded run (its --json) has as survived or equivalent "
                             "(replaces the selection): the survivors judged again after the checks change")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a mutant may run (default: 3 x the op's baseline + 60)")
    parser.add_argument("--equivalent", type=Path, default=None,
                        help=f"the kept list of equivalent mutants (default <root>/{plan.DEFAULT_EQUIVALENT})")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every mutant's outcome here, as it goes; the other ops of an earlier run's file stay")
    parser.add_argument("--list", action="store_true", help="list the selected mutants and run nothing")
    parser.add_argument("--rescore", type=Path, default=None, metavar="JSON",
                        help="run nothing: apply the equivalence list as it is now to a run's JSON, rewrite it, "
                             "print its table")
    parser.add_argument("--rewrites", action="store_true",
                        help="plant rewrites instead of bugs (edits equal in exact arithmetic: operators.REWRITES); "
                             "each should survive, so a kill is the checks' false fail")
    parser.add_argument("--no-error-ratchet", dest="error_ratchet", action="store_false",
                        help="judge mutants by the checks' limits only, not also against the baseline's recorded "
                             "errors (docs/tolerances.md, the error ratchet)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="start no mutant after this many seconds; the table counts those left (not_run)")


def run(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    equivalent = plan.load_equivalent(args.equivalent or root / plan.DEFAULT_EQUIVALENT)
    if args.rescore:
        return rescore(args.rescore, equivalent)
    workspaces, parent = make_workspaces(root, max(1, args.jobs))
    previous = signal.signal(signal.SIGTERM, _terminated)  # `timeout` stops the run: its children go too
    try:
        return _run(args, root, workspaces, equivalent)
    finally:
        stop_children()
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(parent, ignore_errors=True)


STOPPING = threading.Event()


def _terminated(signum, frame):
    STOPPING.set()  # the runs killed now are not outcomes
    stop_children()
    raise SystemExit(f"mutate: stopped by signal {signum}")


def _run(args, root: Path, workspaces: list[Workspace], equivalent: dict[str, str]) -> int:
    first = workspaces[0]
    tests = conformance_modules(first.path, first.files)
    reached = discover(workspaces, tests, args.device, args.fla_ops)
    wanted = _wanted(args, reached)  # op -> the ids to run (none: a selection)
    selected: dict[str, list[Mutant]] = {}
    reserves: dict[str, deque] = {}  # the next mutants of each op, to replace invalid ones
    sites: dict[str, int] = {}
    for op, lines in reached.items():
        every = mutants_of(first.path, {path: set(found) for path, found in lines.items()}, args.rewrites)
        sites[op] = len(every)
        reserves[op] = deque()
        if wanted:
            chosen = [m for m in every if m.id in wanted.get(op, ())]
        elif args.all:
            chosen = every
        else:
            order = plan.spread(every, op, args.seed)
            chosen = order[:args.max_per_op]
            reserves[op].extend(order[args.max_per_op:2 * args.max_per_op])
        if chosen or not wanted:
            selected[op] = chosen
    if wanted:
        missing = set().union(*wanted.values()) - {m.id for chosen in selected.values() for m in chosen}
        if missing:
            print(f"mutate: no site has the id(s): {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    if args.list:
        for op, chosen in selected.items():
            print(f"{op}: {len(chosen)} of {sites[op]} sites")
            for mutant in chosen:
                print(f"  {mutant.id}")
        return 0

    this_run = {
        "command": "python -m pytest_fla " + " ".join(shlex.quote(a) for a in args.argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": _machine(args.device), "versions": _versions(),
        "device": args.device, "seed": args.seed, "max_per_op": None if args.all else args.max_per_op,
        "error_ratchet": args.error_ratchet, "rewrites": args.rewrites, "ops": list(selected),
    }
    document = _continued(args.json, selected, wanted)
    document["runs"].append(this_run)
    lock = threading.Lock()
    free: queue.Queue = queue.Queue()
    for workspace in workspaces:
        free.put(workspace)

    def record(op: str, entry: dict) -> None:
        with lock:
            document["ops"][op]["mutants"].append(entry)
            if args.json:
                report.write_json(args.json, document)

    deadline = None if args.budget is None else time.monotonic() + args.budget

    def run_mutant(op: str, mutant: Mutant, timeout: float) -> None:
        if STOPPING.is_set():
            return
        if deadline is not None and time.monotonic() > deadline:
            with lock:
                document["ops"][op]["not_run"] = document["ops"][op].get("not_run", 0) + 1
            return
        workspace = free.get()
        measured = workspace.path.parent / f"errors-{workspace.path.name}.jsonl"
        env = {**ratchet[op], environment.RECORD_ERRORS: str(measured)} if op in ratchet else None
        try:
            measured.unlink(missing_ok=True)
            outcome = workspace.run_checks(op, tests, mutant, args.device, timeout, env)
            if outcome.status == "timeout":  # a slow moment of a shared machine is not a kill: once more, twice as long
                measured.unlink(missing_ok=True)
                outcome = workspace.run_checks(op, tests, mutant, args.device, 2 * timeout, env)
            growth = report.error_growth(ratchet[op][environment.ERROR_BASELINE], measured) if env else None
        finally:
            free.put(workspace)
        if STOPPING.is_set():
            return
        reason = None if args.rewrites else plan.equivalent_reason(equivalent, mutant.id, op)
        entry = report.result_entry(mutant, outcome, reason)
        if growth is not None:
            entry["error_growth"] = growth
        note = "equivalent: " + reason if entry["outcome"] == "equivalent" else (
            "listed as equivalent: a stale entry" if entry.get("stale_equivalence_entry") else "")
        if growth is not None and growth["compared"]:
            note = "; ".join(filter(None, (note, f"errors x{growth['rms_ratio']}, {growth['limit_used']:.0%} of the "
                                                f"ratchet's limit, {growth['changed']} of {growth['compared']} "
                                                "comparisons changed")))
        with lock:
            print(report.line(op, mutant, outcome, note, entry["outcome"]), flush=True)
            if outcome.status == "invalid" and reserves[op]:
                futures.append(pool.submit(run_mutant, op, reserves[op].popleft(), timeout))
        record(op, entry)

    failed_baseline = []
    futures: list = []
    ratchet: dict[str, dict] = {}  # op -> the environment holding its mutants to the baseline's errors

    def prepare(op: str, chosen: list[Mutant]) -> None:
        """The op's baseline; where it passes, its mutants join the pool's queue."""
        if STOPPING.is_set():
            return
        workspace = free.get()
        errors = workspace.path.parent / f"errors-{op}.jsonl"
        errors.unlink(missing_ok=True)
        try:
            baseline = workspace.run_checks(op, tests, None, args.device, None,
                                            {environment.RECORD_ERRORS: str(errors)} if args.error_ratchet else None)
        finally:
            free.put(workspace)
        if args.error_ratchet and errors.exists():
            ratchet[op] = {environment.ERROR_BASELINE: str(errors)}
        timeout = args.timeout or 3 * baseline.seconds + 60
        with lock:
            kept = document["ops"].get(op, {}).get("mutants", [])  # a rerun of given mutants keeps the others
            document["ops"][op] = {"sites": sites[op], "baseline_seconds": round(baseline.seconds, 1),
                                   "timeout": round(timeout), "mutants": kept}
            print(f"{op}: baseline {baseline.status} in {baseline.seconds:.1f}s "
                  f"({baseline.counts.get('passed', 0)} checks passed); {len(chosen)} of {sites[op]} sites",
                  flush=True)
            if baseline.status != "survived":
                failed_baseline.append(op)
                print(f"{op}: the unmutated checks do not pass ({baseline.status}: {baseline.detail}"
                      f"{' ' + str(baseline.killed_by) if baseline.killed_by else ''}); its mutants are not run",
                      flush=True)
                return
            futures.extend(pool.submit(run_mutant, op, mutant, timeout) for mutant in chosen)

    with ThreadPoolExecutor(max_workers=len(workspaces)) as pool:
        # baselines first, in the ops' order, each op's mutants queued behind them as it passes
        with lock:
            futures.extend(pool.submit(prepare, op, chosen) for op, chosen in selected.items())
        while True:  # an invalid mutant's replacement joins the list while it is waited on
            with lock:
                pending = [f for f in futures if not f.done()]
            if not pending:
                break
            pending[0].result()
        for future in futures:
            future.result()  # raise what a worker raised
    if args.json:
        report.write_json(args.json, document)
    print()
    ran = {op: data for op, data in document["ops"].items() if op in selected}
    print(report.table(ran, args.rewrites))
    if len(ran) < len(document["ops"]):
        print(f"\nwith the ops of the earlier runs in {args.json}:")
        print(report.table(document["ops"], args.rewrites))
    stale = [m["id"] for data in ran.values() for m in data["mutants"] if m.get("stale_equivalence_entry")]
    for mutant_id in stale:
        print(f"stale equivalence entry (the mutant was killed): {mutant_id}")
    return 1 if failed_baseline else 0


def rescore(path: Path, equivalent: dict) -> int:
    """Survivors and equivalent mutants of a recorded run, judged again by the list as it
    is now (an entry added after the run, an entry removed); the file is rewritten."""
    document = json.loads(path.read_text())
    rewrites = any(run.get("rewrites") for run in document.get("runs", []))
    if rewrites:  # rewrites are never equivalent mutants: the list does not apply
        print(report.table(document["ops"], rewrites))
        return 0
    for op, data in document["ops"].items():
        for entry in data["mutants"]:
            if entry["outcome"] in ("survived", "equivalent"):
                reason = plan.equivalent_reason(equivalent, entry["id"], op)
                entry["outcome"] = "survived" if reason is None else "equivalent"
                entry.pop("equivalent_reason", None)
                if reason is not None:
                    entry["equivalent_reason"] = reason
            elif entry["outcome"] in ("killed", "timeout"):
                entry.pop("stale_equivalence_entry", None)
                if plan.equivalent_reason(equivalent, entry["id"], op) is not None:
                    entry["stale_equivalence_entry"] = True
    report.write_json(path, document)
    print(report.table(document["ops"]))
    return 0


def _wanted(args, reached: dict) -> dict[str, set]:
    """Per op, the mutant ids given (``--mutant``: the same for every op) or the ones a
    recorded run left alive (``--survivors-of``); empty where the selection decides."""
    if args.survivors_of:
        recorded = json.loads(args.survivors_of.read_text())["ops"]
        return {op: {m["id"] for m in recorded[op]["mutants"] if m["outcome"] in ("survived", "equivalent")}
                for op in reached if op in recorded}
    return {op: set(args.mutant) for op in reached} if args.mutant else {}


def _continued(path: Path | None, ops, rerun: dict) -> dict:
    """The JSON document to write: the one at ``path`` with ``ops`` taken out (a run split
    over several commands, a group of ops each, ends in one file), or with only the
    ``rerun`` mutants of ``ops`` taken out where given (op -> ids: ``--mutant``,
    ``--survivors-of``; another op's mutant of the same id, a shared helper's, keeps its
    record); a new one where none is."""
    document = {"runs": [], "ops": {}}
    if path is not None and path.exists():
        try:
            earlier = json.loads(path.read_text())
        except json.JSONDecodeError:
            earlier = {}
        if isinstance(earlier.get("runs"), list) and isinstance(earlier.get("ops"), dict):
            if rerun:
                for op, data in earlier["ops"].items():
                    if op in ops:
                        data["mutants"] = [m for m in data["mutants"] if m["id"] not in rerun.get(op, ())]
                document = earlier
            else:
                document = {"runs": earlier["runs"],
                            "ops": {op: data for op, data in earlier["ops"].items() if op not in ops}}
    return document


def discover(workspaces: list[Workspace], tests: list[str], device: str, ops: str) -> dict:
    """``{op: {path: [reached jit lines]}}``, from collect-only child runs: the named ops
    split over the workspaces (every op in one run where none is named)."""
    names = [op for op in ops.split(",") if op]
    groups = [",".join(names[i::len(workspaces)]) for i in range(min(len(workspaces), len(names)))] or [""]
    with ThreadPoolExecutor(max_workers=len(groups)) as pool:
        parts = list(pool.map(_discover, workspaces[:len(groups)], [tests] * len(groups), [device] * len(groups), groups))
    found = {}
    for part in parts:
        found.update(part)
    # the order the ops were named in, the specs' order otherwise
    return {op: found[op] for op in names} if names else found


def _discover(workspace: Workspace, tests: list[str], device: str, ops: str) -> dict:
    out = workspace.path / "sites.json"
    env = {environment.MUTATION_SITES: str(out), environment.MUTATION_OPS: ops, environment.MUTATION_DEVICE: device,
           environment.MUTATION_ROOT: str(workspace.path)}
    if device == "cuda":
        env["TRITON_ALWAYS_COMPILE"] = "1"  # the code generator must visit every kernel
    args = [*tests, "--collect-only", "-q", *DEVICE_OPTIONS[device]] + ([f"--fla-ops={ops}"] if ops else [])
    code, seconds, tail = workspace.pytest(args, device, env, None)
    if code != 0 or not out.exists():
        raise SystemExit(f"mutate: finding the ops' kernels failed (pytest exited with {code}):\n{tail}")
    found = json.loads(out.read_text())
    if ops:
        unknown = set(ops.split(",")) - set(found)
        if unknown:
            raise SystemExit(f"mutate: no spec named {', '.join(sorted(unknown))}")
    return found


def _machine(device: str) -> str:
    cores = os.cpu_count()
    if device == "cuda":
        try:
            import torch

            return f"{torch.cuda.get_device_name(0)}, {cores} CPU cores"
        except Exception:  # noqa: BLE001 - a description only
            pass
    return f"{platform.machine()} CPU, {cores} cores"


def _versions() -> dict:
    import importlib.metadata as metadata

    return {name: metadata.version(name) for name in ("torch", "triton", "numpy")}
