"""The end-of-run report: ops x checks per arch, the modes used, the slowest checks.

Each test report is tagged, in the process that ran the test, with its op (the
``fla_op`` marker), its check (the test function's name less ``test_``), and the arch
target and mode of that process, and in a fleet its host and GPU (``user_properties``,
which travel through xdist and child processes). The process that sees every report
(the xdist controller, or the only process) folds them into a matrix, prints it, and
writes it as JSON with ``--fla-report``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .. import environment, targets
from . import time_split, verdicts

PROPERTY_PREFIX = "fla_"
PROCESS_SECONDS_PROPERTY = "fla_process_seconds"  # an isolated test's child processes, wall time
SANITIZER_SECONDS_PROPERTY = "fla_sanitizer_seconds"  # of which under compute-sanitizer
STARTUP_SECONDS_PROPERTY = "fla_startup_seconds"  # of which before the children's first test
SANITIZER_STARTUP_PROPERTY = "fla_sanitizer_startup_seconds"  # of that, the tool's children
EXIT_SECONDS_PROPERTY = "fla_exit_seconds"  # of which after the children's last test
COLLECT_SECONDS_PROPERTY = "fla_collect_seconds"  # of the start-up, collecting the tests
PARTS_PROPERTY = "fla_parts_seconds"  # of which in the tests: part of the work -> seconds (time_split)
SANITIZER_PARTS_PROPERTY = "fla_sanitizer_parts_seconds"  # of those, under the tool
SLOWEST = 5
RUNS_ON_GPU = (targets.NATIVE, targets.EMULATED)


def timing_properties(plain, tool) -> dict:
    """The properties an isolated test's call report carries: where its child processes'
    time went, from the plain children's and the tool's children's ``isolation.ChildTime``."""
    both = plain + tool
    return {
        PROCESS_SECONDS_PROPERTY: round(both.seconds, 3),
        SANITIZER_SECONDS_PROPERTY: round(tool.seconds, 3),
        STARTUP_SECONDS_PROPERTY: round(both.startup, 3),
        SANITIZER_STARTUP_PROPERTY: round(tool.startup, 3),
        EXIT_SECONDS_PROPERTY: round(both.exit, 3),
        COLLECT_SECONDS_PROPERTY: round(both.collecting, 3),
        PARTS_PROPERTY: {name: round(seconds, 3) for name, seconds in both.parts.items()},
        SANITIZER_PARTS_PROPERTY: {name: round(seconds, 3) for name, seconds in tool.parts.items()},
    }


def op_and_check(item) -> tuple[str | None, str]:
    marker = item.get_closest_marker("fla_op")
    op = marker.args[0] if marker and marker.args else None
    check = getattr(item, "fla_check", None) or getattr(item, "originalname", None) or item.name
    return op, check.removeprefix("test_")


def annotate(item, report) -> None:
    """Tag ``report`` with the op, check, arch and mode (once per report); in a fleet
    (``FLA_FLEET_HOST``) also the host and the GPU it ran on."""
    if any(name == "fla_arch" for name, _ in report.user_properties):
        return
    op, check = op_and_check(item)
    target = targets.run_target(item.config)
    report.user_properties.extend(
        [
            ("fla_op", op),
            ("fla_check", check),
            ("fla_arch", target.name if target else "unknown"),
            ("fla_mode", target.mode if target else "unknown"),
        ]
    )
    host = os.environ.get(environment.FLEET_HOST)
    if host:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if target and target.mode in RUNS_ON_GPU else None
        report.user_properties.extend([("fla_host", host), ("fla_gpu", gpu or None)])


def classify(item, call, report) -> None:
    """Tag a failed ``report`` with its verdict (``verdicts``): from the exception where
    the call raised one here, else from the failure's message."""
    props = dict(report.user_properties)
    if not report.failed or props.get("fla_op") is None or verdicts.PROPERTY in props:
        return  # only an op's checks say something of a library
    excinfo = getattr(call, "excinfo", None)
    if excinfo is not None:
        verdict, why = verdicts.of_exception(excinfo, checks=(str(item.path),))
    else:
        verdict, why = verdicts.from_message(outcome_reason(report)) or (None, None)
    if verdict is not None:
        report.user_properties.extend([(verdicts.PROPERTY, verdict), (verdicts.WHY_PROPERTY, why)])


def check_of(nodeid: str) -> str:
    """The check a test id names, where its item is not at hand: its function less ``test_``."""
    return nodeid.partition("::")[2].partition("[")[0].removeprefix("test_")


def worker_properties(report) -> dict:
    """The arch, mode and host of the xdist worker behind a report that carries none: the
    one xdist's controller writes for the test a worker was running when it died."""
    env = getattr(getattr(getattr(report, "node", None), "gateway", None), "spec", None)
    target = getattr(env, "env", {}).get(environment.RUN_TARGET)
    if not target:
        return {}
    target = targets.decode_target(target)
    props = {"fla_op": None, "fla_check": check_of(report.nodeid), "fla_arch": target.name, "fla_mode": target.mode}
    if env.env.get(environment.FLEET_HOST):
        props["fla_host"] = env.env[environment.FLEET_HOST]
    return props


@dataclass
class TestRecord:
    nodeid: str
    op: str | None
    check: str
    arch: str
    mode: str
    outcome: str = "passed"
    duration: float = 0.0
    reason: str | None = None  # why it was skipped, or its failure message on one line
    # isolated runs only: wall time of its child processes, and of those under the sanitizer
    process_seconds: float | None = None
    sanitizer_seconds: float | None = None
    # of the process seconds: before the children's first test (the interpreter, imports,
    # collection; under the tool, its start), of that the tool's children's, and after their last
    startup_seconds: float | None = None
    sanitizer_startup_seconds: float | None = None
    collect_seconds: float | None = None  # of the start-up, collecting the tests
    exit_seconds: float | None = None
    # of the rest (the tests): part of the work -> seconds (time_split), and of those the tool's
    parts_seconds: dict | None = None
    sanitizer_parts_seconds: dict | None = None
    # when it began (epoch seconds: its setup's start, in the process that ran it) and on
    # which xdist worker: with the durations, a timeline of the run (where workers waited)
    started: float | None = None
    worker: str | None = None
    # in a fleet: the host it ran on (``fleet.Host.name``) and the GPU there
    host: str | None = None
    gpu: str | None = None
    # a failure's verdict on the library (``verdicts``: defect, contract, refused, ...) and why
    verdict: str | None = None
    verdict_why: str | None = None


OUTCOMES = ("passed", "failed", "skipped", "lost")  # lost: a fleet worker that was to run it went down


@dataclass
class RunReport:
    targets: list
    records: dict = field(default_factory=dict)  # (nodeid, arch) -> TestRecord
    hosts: list = field(default_factory=list)  # in a fleet: each host's probe (``fleet.Host.to_json``)

    def add(self, report) -> None:
        props = dict(report.user_properties) or worker_properties(report)
        if "fla_arch" not in props:
            return
        key = (report.nodeid, props["fla_arch"])
        record = self.records.get(key)
        if record is None:
            record = TestRecord(report.nodeid, props["fla_op"], props["fla_check"], props["fla_arch"], props["fla_mode"])
            self.records[key] = record
        record.duration += report.duration
        start = getattr(report, "start", None)
        if start is not None and (record.started is None or start < record.started):
            record.started = start
        node = getattr(report, "node", None)  # set by xdist's controller
        record.worker = getattr(getattr(node, "gateway", None), "id", None) or record.worker
        record.host = props.get("fla_host", record.host)
        record.gpu = props.get("fla_gpu", record.gpu)
        if PROCESS_SECONDS_PROPERTY in props:
            record.process_seconds = props[PROCESS_SECONDS_PROPERTY]
            record.sanitizer_seconds = props.get(SANITIZER_SECONDS_PROPERTY)
            record.startup_seconds = props.get(STARTUP_SECONDS_PROPERTY)
            record.sanitizer_startup_seconds = props.get(SANITIZER_STARTUP_PROPERTY)
            record.collect_seconds = props.get(COLLECT_SECONDS_PROPERTY)
            record.exit_seconds = props.get(EXIT_SECONDS_PROPERTY)
            record.sanitizer_parts_seconds = props.get(SANITIZER_PARTS_PROPERTY)
        if PARTS_PROPERTY in props:  # an isolated test's (its children's), or one run in its worker
            record.parts_seconds = props[PARTS_PROPERTY]
        if report.failed:
            if record.outcome != "failed":
                record.reason = outcome_reason(report)
                record.verdict = props.get(verdicts.PROPERTY)
                record.verdict_why = props.get(verdicts.WHY_PROPERTY)
                if record.verdict is None and record.op is not None:  # a report made where no exception was at hand
                    record.verdict, record.verdict_why = verdicts.from_message(record.reason) or (None, None)
            record.outcome = "failed"
        elif report.skipped and record.outcome != "failed":
            record.outcome = "skipped"
            record.reason = outcome_reason(report)

    def add_lost(self, nodeid: str, arch: str, host: str | None, reason: str) -> None:
        """A test that a fleet worker was to run under ``arch`` and never did: its op and
        check as the run saw them elsewhere (another arch's run of it), else its check
        from the test's name alone (and no op: it stays out of the matrix)."""
        seen = next((r for (other, _), r in self.records.items() if other == nodeid), None)
        op = seen.op if seen else None
        check = seen.check if seen else check_of(nodeid)
        mode = next((t.mode for t in self.targets if t.name == arch), "unknown")
        self.records[(nodeid, arch)] = TestRecord(nodeid, op, check, arch, mode, outcome="lost", reason=reason,
                                                  host=host)

    def lost(self) -> list[TestRecord]:
        return [r for r in self.records.values() if r.outcome == "lost"]

    def matrix(self) -> dict:
        """arch -> op -> check -> {"passed": n, "failed": n, "skipped": n} (and ``"lost": n``
        where a fleet worker went down; in a fleet, ``"hosts"``: where the cell ran)."""
        table: dict = {}
        for record in self.records.values():
            if record.op is None:
                continue
            cell = table.setdefault(record.arch, {}).setdefault(record.op, {}).setdefault(
                record.check, {"passed": 0, "failed": 0, "skipped": 0}
            )
            cell[record.outcome] = cell.get(record.outcome, 0) + 1
            if record.outcome == "failed":
                by_verdict = cell.setdefault("verdicts", {})
                key = record.verdict or "unclassed"
                by_verdict[key] = by_verdict.get(key, 0) + 1
            if record.host is not None:
                hosts = cell.setdefault("hosts", [])
                if record.host not in hosts:
                    hosts.append(record.host)
                    hosts.sort()
        return table

    def to_json(self) -> dict:
        return {
            **({"hosts": self.hosts} if self.hosts else {}),
            "archs": [
                {"name": t.name, "arch": t.arch, "mode": t.mode, "reason": t.reason} for t in self.targets
            ],
            "tests": [
                {
                    "nodeid": r.nodeid,
                    "op": r.op,
                    "check": r.check,
                    "arch": r.arch,
                    "mode": r.mode,
                    "outcome": r.outcome,
                    "duration": round(r.duration, 4),
                    "reason": r.reason,
                    "verdict": r.verdict,
                    "verdict_why": r.verdict_why,
                    "process_seconds": r.process_seconds,
                    "sanitizer_seconds": r.sanitizer_seconds,
                    "startup_seconds": r.startup_seconds,
                    "sanitizer_startup_seconds": r.sanitizer_startup_seconds,
                    "collect_seconds": r.collect_seconds,
                    "exit_seconds": r.exit_seconds,
                    "parts_seconds": r.parts_seconds,
                    "sanitizer_parts_seconds": r.sanitizer_parts_seconds,
                    "started": None if r.started is None else round(r.started, 3),
                    "worker": r.worker,
                    **({"host": r.host, "gpu": r.gpu} if self.hosts else {}),
                }
                for r in self.records.values()
            ],
            "matrix": self.matrix(),
            "verdicts": verdicts.counts(self.records.values()),
        }

    def write_json(self, path: str, finished: bool = True) -> None:
        """The report as JSON, replaced whole (a reader never sees half a file); ``finished``
        False for a run still going: what a run killed at its time limit leaves."""
        temporary = f"{path}.partial"
        with open(temporary, "w") as f:
            json.dump({**self.to_json(), "finished": finished}, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)

    def lines(self) -> list[str]:
        """The terminal summary: one ops x checks table per arch, then the slowest checks."""
        out = []
        modes = {t.name: t for t in self.targets}
        matrix = self.matrix()
        order = [t.name for t in self.targets if t.name in matrix] + [a for a in matrix if a not in modes]
        for arch in order:
            ops = matrix[arch]
            target = modes.get(arch)
            out.append(f"{arch} ({target.mode if target else 'unknown'}):")
            checks = sorted({check for cells in ops.values() for check in cells})
            rows = [["op"] + checks]
            for op in sorted(ops):
                rows.append([op] + [cell_text(ops[op].get(check)) for check in checks])
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            for row in rows:
                out.append("  " + "  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip())
        lost: dict = {}
        for record in self.lost():
            lost.setdefault((record.arch, record.reason), []).append(record)
        for (arch, reason), records in lost.items():
            out.append(f"{arch}: {len(records)} test{'s' if len(records) != 1 else ''} {reason}")
        timed = sorted(self.records.values(), key=cost, reverse=True)[:SLOWEST]
        if timed:
            out.append("slowest checks:")
            out += [f"  {cost(r):8.2f}s  {r.arch:<11} {r.nodeid}{cost_detail(r)}" for r in timed]
        for split in (child_time_split(self.records.values()), in_process_time_split(self.records.values())):
            if split:
                out.append(split)
        verdict_line = verdicts_summary(self.records.values())
        if verdict_line:
            out.append(verdict_line)
        return out


def verdicts_summary(records) -> str | None:
    """One line: the failures by verdict, the defects (the findings) first, with the ops
    they were found in; None where nothing failed."""
    records = list(records)
    found = verdicts.counts(records)
    if not found:
        return None
    order = [v for v in verdicts.VERDICTS + ("unclassed",) if v in found]
    defect_ops = sorted({r.op for r in records if r.outcome == "failed" and r.verdict == verdicts.DEFECT and r.op})
    parts = [f"{found[v]} {v}" for v in order]
    where = f" (defects in {', '.join(defect_ops)})" if defect_ops else ""
    return f"failures by verdict: {', '.join(parts)}{where}; only defects are findings on the library"


def in_process_time_split(records) -> str | None:
    """One line: where the time of the tests run in the run's own processes (not isolated)
    went, by part of their work; or None without such tests."""
    timed = [r for r in records if r.process_seconds is None and r.parts_seconds is not None]
    if not timed:
        return None
    total = sum(r.duration for r in timed)
    spent = summed_parts(timed, "parts_seconds")
    shares = named_shares(spent, total)
    compiles = time_split.compiles_text(spent)
    return (f"tests run in their workers: {total:.0f}s in all"
            + (f", of which {', '.join(shares)}" if shares else "")
            + (f"; {compiles}" if compiles else ""))


def summed_parts(records, name: str) -> dict:
    """Each part's seconds (``time_split``) summed over ``records``' ``name`` dicts."""
    total: dict = {}
    for r in records:
        for part, seconds in (getattr(r, name) or {}).items():
            total[part] = total.get(part, 0.0) + seconds
    return total


def share(seconds: float, total: float) -> str:
    return f"{seconds:.0f}s ({100 * seconds / total:.0f}%)" if total > 0 else f"{seconds:.0f}s"


def named_shares(spent: dict, total: float) -> list[str]:
    """Each part as "12s (3%) drawing inputs", in name order (the counts left out)."""
    return [f"{share(spent[name], total)} {time_split.LABELS.get(name, name)}"
            for name in sorted(spent) if name not in time_split.COUNTS]


def child_time_split(records) -> str | None:
    """One line: where the isolated tests' child processes spent their time (start-up; the
    tests, and parts of their work; exit), the tool's children's apart; or None without
    isolated tests."""
    timed = [r for r in records if r.process_seconds is not None and r.startup_seconds is not None]
    if not timed:
        return None

    def summed(name: str) -> float:
        return sum(getattr(r, name) or 0.0 for r in timed)

    total = summed("process_seconds")

    def part(seconds: float) -> str:
        return share(seconds, total)

    startup, exiting = summed("startup_seconds"), summed("exit_seconds")
    spent = summed_parts(timed, "parts_seconds")
    in_tests = named_shares(spent, total)
    collecting = summed("collect_seconds")
    line = (f"child processes: {total:.0f}s in all; {part(startup)} starting up before their first test "
            f"({part(startup - collecting)} the interpreter and imports, {part(collecting)} collection), "
            f"{part(total - startup - exiting)} in the tests"
            f"{' (of which ' + ', '.join(in_tests) + ')' if in_tests else ''}, {part(exiting)} exiting after their last")
    compiles = time_split.compiles_text(spent)
    if compiles:
        line += f"; {compiles}"
    tool = summed("sanitizer_seconds")
    if tool:
        tool_spent = summed_parts(timed, "sanitizer_parts_seconds")
        line += ("; under the sanitizer " + ", of which ".join([part(tool), ", ".join(
            [f"{part(summed('sanitizer_startup_seconds'))} starting up"] + named_shares(tool_spent, total))]))
        tool_compiles = time_split.compiles_text(tool_spent)
        if tool_compiles:
            line += f" ({tool_compiles})"
    return line


def cost(record: TestRecord) -> float:
    """What a test cost the run: its child processes' wall time when isolated."""
    return record.process_seconds if record.process_seconds is not None else record.duration


def cost_detail(record: TestRecord) -> str:
    if record.process_seconds is None:
        return ""
    tool = f", {record.sanitizer_seconds:.2f}s under the sanitizer" if record.sanitizer_seconds else ""
    return f" (its processes, start-up included; the test itself {record.duration:.2f}s{tool})"


REASON_CHARS = 400


def outcome_reason(report) -> str | None:
    """A skip's reason, or a failure's message on one line, short enough for a JSON record.

    So that a CI reader learns from the report alone why a check did not pass (a
    memory-bound skip, say, states the bytes needed and free)."""
    longrepr = report.longrepr
    if report.skipped:
        if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
            text = str(longrepr[2]).removeprefix("Skipped: ")
        else:
            text = getattr(report, "wasxfail", "") or str(longrepr or "")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        lines = (crash.message if crash is not None else str(longrepr or "")).strip().splitlines()
        text = " ".join(line.strip() for line in lines)
    text = text.strip()
    return text[:REASON_CHARS] or None


VERDICT_LETTERS = {"defect": "D", "contract": "C", "refused": "R", "environment": "E", "harness": "H", "unclassed": "?"}


def verdict_text(cell: dict) -> str:
    """`` (D2 C1)``: a failed cell's failures by verdict, defects first."""
    found = cell.get("verdicts") or {}
    order = [v for v in verdicts.VERDICTS + ("unclassed",) if v in found]
    return f" ({' '.join(VERDICT_LETTERS[v] + str(found[v]) for v in order)})" if order else ""


def cell_text(cell: dict | None) -> str:
    """``pass 4``, ``FAIL 1/5``, ``skip 3``, ``LOST 2/5``, or ``-`` for no test; in a fleet
    followed by the hosts it ran on (``pass 4 @gpu-a,gpu-b``)."""
    if not cell:
        return "-"
    total = sum(cell.get(outcome, 0) for outcome in OUTCOMES)
    lost = f" LOST {cell['lost']}/{total}" if cell.get("lost") else ""
    if cell["failed"]:
        text = f"FAIL {cell['failed']}/{total}{verdict_text(cell)}{lost}"
    elif cell["passed"]:
        skipped = f" +{cell['skipped']} skip" if cell["skipped"] else ""
        text = f"pass {cell['passed']}{skipped}{lost}"
    elif cell["skipped"]:
        text = f"skip {cell['skipped']}{lost}"
    else:
        text = lost.strip()
    return text + (f" @{','.join(cell['hosts'])}" if cell.get("hosts") else "")
