"""The conformance suite over every release of the peer library: a release x op matrix of defects.

    python benchmarks/peer_history.py run --wheels .whl/fla-core --out DIR [--ops a,b] [--checks forward,backward]
                                          [--releases 0.5.2,0.6.0] [--workers N] [--timeout S]
    python benchmarks/peer_history.py run --compile sm80,sm90 --out DIR ...   # the compile checks alone
    python benchmarks/peer_history.py matrix DIR [--markdown PATH] [--json PATH]

``run`` installs each release's wheel (``fla_core-<release>-*.whl``) into a folder of its
own, one release at a time, and runs ``tests/test_conformance.py`` and the peer's
reproducers (``tests/peer/repro``) with ``--fla-impl=fla`` over it, each release's
``--fla-report`` kept as ``DIR/report_<release>.json``; a release whose finished report is
already there is not run again, and one cut by a device call's time limit goes on in the
next call from where it was (its tests kept, but for its defects, which run again). The peer's autotuned kernels run at their first config that runs
(``--fla-autotune=first``: one compile per kernel and key instead of tens, and the same
config in every run, so a verdict holds from one run to the next), and each worker is
handed whole ops (``--fla-dist=op``), so an op's kernels compile on one worker, not on all.
``--autotune tuned`` times every config instead (cached on disk,
``TRITON_CACHE_AUTOTUNING``: once per release, not once per worker and child process). With
no GPU the kernels run under Triton's interpreter (where the peer's ops run there at all:
the matrix's ``environment`` verdicts say which do not).

``--compile ARCHS`` runs ``tests/test_compile.py`` instead: every kernel of the release
captured over this repo's compile cases (float32 states) and compiled offline for each arch
(``--fla-arch=ARCHS``; compile-only on a machine without the arch, a CPU one included); a
kernel that does not compile, or is over the arch's shared memory or grid limits, is a defect.

``matrix`` reads those reports: per release and op, the defects (the only findings) and
the checks that found them; the other verdicts counted apart; an op the release lacks is
``absent``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from pytest_fla.report.verdicts import culprit

ROOT = Path(__file__).resolve().parents[1]
WHEEL_RE = re.compile(r"fla_core-(?P<release>\d+(?:\.\d+)+)-")
ABSENT_RE = re.compile(r"absent in fla-core")
# the checks a history run makes by default: everything but the 2**31-element ones (tens of
# GiB and minutes per op) and the CPU-only ones
DEFAULT_MARKERS = "not large_memory"


def release_key(release: str) -> tuple:
    return tuple(int(p) for p in release.split("."))


def wheels(folder: Path) -> dict:
    """release -> its wheel in ``folder``."""
    found = {}
    for path in folder.glob("fla_core-*.whl"):
        match = WHEEL_RE.match(path.name)
        if match:
            found[match.group("release")] = path
    return dict(sorted(found.items(), key=lambda item: release_key(item[0])))


def install(wheel: Path, target: Path) -> None:
    if (target / "fla").is_dir():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", str(target), str(wheel)], check=True)


def finished(report: Path) -> bool:
    """The release's run ended, and ran every test (none left after a device fault)."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return False
    return bool(data.get("finished")) and not any(_not_run(test) for test in data.get("tests", []))


def kept_tests(report: Path) -> list[dict]:
    """The tests of a cut run's report (not finished) that a resumed run does not run again:
    every one but a defect other than a device fault (run again, so that a fix of the checks
    or verdicts since, which only ever takes a failure out of ``defect``, reaches every
    finding) and a test not run after a device fault in its process."""
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        return []
    if data.get("finished") and not any(_not_run(test) for test in data.get("tests", [])):
        return []
    return [test for test in data.get("tests", []) if not _run_again(test)]


# the reason fault_guard gives the tests it did not run after a device fault (its SKIP_REASON)
FAULT_SKIP = "CUDA context was lost to a device fault in"


def _not_run(test: dict) -> bool:
    return test["outcome"] == "skipped" and FAULT_SKIP in (test.get("reason") or "")


def _run_again(test: dict) -> bool:
    if test["outcome"] == "skipped":
        return _not_run(test)
    # a device fault is the library's whatever the checks: run again, it would fault again
    return test.get("verdict") == "defect" and test.get("verdict_why") != "device fault"


def merge_into(report: Path, earlier: list[dict]) -> None:
    """Put the ``earlier`` run's kept tests back into the resumed run's ``report``, and its
    verdict counts over both."""
    if not earlier:
        return
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError):
        data = {"tests": [], "finished": False}
    ran = {test["nodeid"] for test in data.get("tests", [])}
    data["tests"] = [test for test in earlier if test["nodeid"] not in ran] + data.get("tests", [])
    counts = Counter(test.get("verdict") or "unclassed" for test in data["tests"]
                     if test["outcome"] == "failed" and test.get("op") is not None)
    data["verdicts"] = dict(counts)
    report.write_text(json.dumps(data, indent=1) + "\n")


def pytest_command(args, report: Path) -> list[str]:
    paths = ["tests/test_compile.py"] if args.compile else ["tests/test_conformance.py", "tests/peer"]
    command = [sys.executable, "-m", "pytest", *paths, "--fla-impl=fla",
               "-p", "no:cacheprovider", "-p", "no:randomly", "-q", "-rN", "-m", args.markers,
               f"--fla-report={report}", f"--fla-isolate={args.isolate}", f"--fla-autotune={args.autotune}"]
    if args.compile:  # each kernel of the release compiled offline for each arch (a process each)
        command += [f"--fla-arch={args.compile}", f"--fla-compile-scope={args.compile_scope}"]
    if args.workers:
        command.append(f"--fla-dist={args.dist}")
    if args.ops:
        command.append(f"--fla-ops={args.ops}")
    if args.checks:
        command += ["-k", " or ".join(f"test_{check}" for check in args.checks.split(",")) + " or repro"]
    if args.workers:
        command += ["-n", str(args.workers)]
    return command + args.pytest_args


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    found = wheels(Path(args.wheels))
    wanted = args.releases.split(",") if args.releases else list(found)
    missing = [r for r in wanted if r not in found]
    if missing:
        print(f"peer_history: no wheel for {', '.join(missing)} in {args.wheels}", file=sys.stderr)
        return 2
    gpu = _has_gpu()
    for release in wanted:
        report = out / f"report_{release}.json"
        if finished(report):
            print(f"== fla-core {release}: done before ({report.name})")
            continue
        earlier = kept_tests(report)
        site = Path(args.sites) / release
        install(found[release], site)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
                   TRITON_CACHE_AUTOTUNING="1", PYTHONUNBUFFERED="1")
        if not gpu and not args.compile:  # the compile checks need the real Triton (the plugin decides per target)
            env["TRITON_INTERPRET"] = "1"
        start = time.monotonic()
        command = pytest_command(args, report) + [f"--deselect={test['nodeid']}" for test in earlier]
        with open(out / f"tests_{release}.log", "a" if earlier else "w") as log:
            try:
                code = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                code = "timed out"
        merge_into(report, earlier)
        print(f"== fla-core {release}: pytest exit {code} after {time.monotonic() - start:.0f} s"
              + (f" ({len(earlier)} tests kept from an earlier cut run)" if earlier else ""))
    summary = matrix(out)
    for suffix, text in ((".md", summary["markdown"]), (".json", json.dumps(summary["data"], indent=1) + "\n")):
        (out / f"matrix{suffix}").write_text(text)
    print(summary["markdown"])
    return 0


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def load(out: Path) -> dict:
    """release -> its report (the ones present in ``out``)."""
    reports = {}
    for path in out.glob("report_*.json"):
        release = path.stem.removeprefix("report_")
        try:
            reports[release] = json.loads(path.read_text())
        except ValueError:
            continue
    return dict(sorted(reports.items(), key=lambda item: release_key(item[0])))


def matrix(out: Path) -> dict:
    """The release x op matrix of defects (markdown and data) from the reports in ``out``."""
    reports = load(out)
    data: dict = {}
    ops: set = set()
    for release, report in reports.items():
        cells: dict = defaultdict(lambda: {"defects": defaultdict(list), "verdicts": Counter(), "tests": 0, "absent": 0,
                                           "not_run": []})
        for test in report["tests"]:
            op = test["op"]
            if op is None:
                continue
            ops.add(op)
            cell = cells[op]
            cell["tests"] += 1
            if test["outcome"] == "skipped" and ABSENT_RE.search(test["reason"] or ""):
                cell["absent"] += 1
            if _not_run(test):  # an unrun check is no evidence of no defect: the cell says so
                cell["not_run"].append(test["check"])
            if test["outcome"] == "failed":
                verdict = test.get("verdict") or "unclassed"
                cell["verdicts"][verdict] += 1
                if verdict == "defect":
                    # a defect counts against the op it is of: an agreement check's against the
                    # other kernel where only that one is off the reference
                    at_fault = culprit(test.get("verdict_why"), op)
                    ops.add(at_fault)
                    found_by = test["check"] if at_fault == op else f"{test['check']} ({op}'s)"
                    cells[at_fault]["defects"][found_by].append({"test": test["nodeid"].split("::")[-1],
                                                                 "why": test.get("verdict_why"), "reason": test["reason"]})
        data[release] = {
            "finished": report.get("finished", False) and not any(_not_run(t) for t in report["tests"]),
            "not_run_after_fault": sum(_not_run(t) for t in report["tests"]),
            "totals": dict(Counter(t["outcome"] for t in report["tests"])),
            "verdicts": report.get("verdicts", {}),
            "ops": {op: {"absent": c["tests"] > 0 and c["absent"] == c["tests"], "tests": c["tests"], "verdicts": dict(c["verdicts"]),
                         "defects": {check: found for check, found in c["defects"].items()},
                         "not_run": sorted(c["not_run"])}
                    for op, c in cells.items()},
        }
    return {"data": data, "markdown": markdown(data, sorted(ops))}


def cell_text(cell: dict | None) -> str:
    if cell is None:
        return "not run"
    if cell["absent"]:
        return "absent"
    text = ("**" + ", ".join(f"{check} {len(found)}" for check, found in sorted(cell["defects"].items())) + "**"
            if cell["defects"] else "-")
    unrun = Counter(cell.get("not_run") or ())
    if unrun:
        text += " (not run: " + ", ".join(f"{check} {n}" for check, n in sorted(unrun.items())) + ")"
    return text


def finished_text(row: dict) -> str:
    if row["finished"]:
        return "yes"
    left = row.get("not_run_after_fault", 0)
    return f"no ({left} not run after a device fault)" if left else "no"


def markdown(data: dict, ops: list) -> str:
    releases = list(data)
    out = ["Defects (the checks that found them, and how many tests) per fla-core release and op; "
           "`-`: none; `absent`: the release lacks the op; `not run`: the checks that did not run "
           "(their process lost to a device fault before them), which say nothing either way.", "",
           "| op | " + " | ".join(releases) + " |", "|---|" + "---|" * len(releases)]
    for op in ops:
        out.append(f"| {op} | " + " | ".join(cell_text(data[r]["ops"].get(op)) for r in releases) + " |")
    out += ["", "| release | passed | failed | skipped | defect | contract | refused | environment | harness | unclassed | finished |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for release, row in data.items():
        t, v = row["totals"], row["verdicts"]
        out.append(f"| {release} | {t.get('passed', 0)} | {t.get('failed', 0)} | {t.get('skipped', 0)} | "
                   + " | ".join(str(v.get(k, 0)) for k in ("defect", "contract", "refused", "environment", "harness", "unclassed"))
                   + f" | {finished_text(row)} |")
    out += ["", "First defect of each (release, op, check):", ""]
    for release, row in data.items():
        for op, cell in sorted(row["ops"].items()):
            for check, found in sorted(cell["defects"].items()):
                reason = " ".join((found[0]["reason"] or "").split())[:220].replace("|", "\\|")
                out.append(f"- {release} {op} / {check} ({found[0]['why']}): `{found[0]['test']}`: {reason}")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="run the suite over each release, then write the matrix")
    r.add_argument("--wheels", default=str(ROOT / ".whl" / "fla-core"), help="folder of fla_core-<release>-*.whl")
    r.add_argument("--out", required=True, help="folder for each release's report and log, and the matrix")
    r.add_argument("--sites", default="/tmp/fla-history", help="where each release is installed, a folder each")
    r.add_argument("--releases", help="comma-separated releases (default: every wheel found)")
    r.add_argument("--ops", help="--fla-ops for every release (default: all the release has)")
    r.add_argument("--checks", help="comma-separated checks, e.g. forward,backward,varlen (default: all)")
    r.add_argument("--markers", default=DEFAULT_MARKERS, help=f"the -m filter (default: {DEFAULT_MARKERS!r})")
    r.add_argument("--isolate", default="none",
                   help="--fla-isolate (default none: a device fault fails its own test and the tests after it in "
                   "its worker are skipped, run again by the next call; batch isolation's start-ups took 40%% of "
                   "a release's process time on an H200)")
    r.add_argument("--workers", type=int, default=0, help="xdist workers (default: none)")
    r.add_argument("--autotune", default="first", choices=("first", "tuned"),
                   help="--fla-autotune (default first: one config per kernel and key, the same in every run; "
                   "tuned: the peer's own timing of every config, tens of compiles per kernel)")
    r.add_argument("--dist", default="op", choices=("op", "test"),
                   help="--fla-dist with --workers (default op: each op's kernels compiled and autotuned on one worker)")
    r.add_argument("--timeout", type=float, default=None, help="seconds for each release's run")
    r.add_argument("--compile", metavar="ARCHS",
                   help="run the compile checks instead (tests/test_compile.py), for these --fla-arch targets, "
                        "e.g. sm80,sm90: offline on a CPU machine")
    r.add_argument("--compile-scope", default="kernels", choices=("launches", "kernels"),
                   help="--fla-compile-scope of a --compile run (default kernels: each kernel once per dtype)")
    r.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    m = commands.add_parser("matrix", help="the matrix from a run's reports")
    m.add_argument("out")
    m.add_argument("--markdown")
    m.add_argument("--json")
    args = parser.parse_args()
    if args.command == "run":
        return run(args)
    summary = matrix(Path(args.out))
    if args.markdown:
        Path(args.markdown).write_text(summary["markdown"])
    if args.json:
        Path(args.json).write_text(json.dumps(summary["data"], indent=1) + "\n")
    print(summary["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
