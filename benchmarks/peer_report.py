"""Summarise a ``--fla-report`` JSON as markdown: which checks each op fails, and why.

    python benchmarks/peer_report.py report.json [more.json ...]     (prints the markdown)

Several reports (one per op, from ``gpu_run.sh peer`` with ``FLA_PEER_PER_OP=1``) are
summarised as one run; gzipped ones (``.json.gz``, as kept under ``benchmarks/results/``) too.

Made for the peer library's run (``--fla-impl=fla``), where failures are the finding:
each failed test's message is sorted into a kind (no error raised, an error of another
type or wording, a device fault, a wrong result, ...), and each (op, check) row gives
its counts and the first message of each kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter, defaultdict

# (kind, pattern on the failure message), first match wins
KINDS = (
    ("device fault", r"illegal memory access|an illegal instruction|device-side assert|misaligned address|"
                     r"the device faulted|the test process (?:stopped|was killed|exited)|Fatal Python error"),
    ("launch refused", r"invalid argument|invalid configuration argument|too many resources requested"),
    ("silent: no error raised", r"DID NOT RAISE"),
    ("raised, not naming the argument", r"Regex pattern did not match"),
    ("launched before the error", r"kernel launch\(es\) before the error"),
    ("non-finite output", r"NaN/Inf where the reference is finite|were never written"),
    ("wrong result", r"relative RMS error|differs between two identical runs|shape .* != reference|expected None"),
    ("host sync", r"device-to-host sync"),
    ("not supported", r"unexpected keyword argument|is causal only"),
    ("out of memory", r"out of memory|OutOfMemory"),
)


def kind_of(message: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, message or ""):
            return kind
    return "other error"


def summarise(report: dict) -> str:
    tests = report["tests"]
    rows: dict = defaultdict(lambda: {"outcomes": Counter(), "kinds": Counter(), "first": {}})
    for test in tests:
        row = rows[(test["op"], test["check"])]
        row["outcomes"][test["outcome"]] += 1
        if test["outcome"] == "failed":
            kind = kind_of(test["reason"])
            row["kinds"][kind] += 1
            row["first"].setdefault(kind, (test["nodeid"].split("::")[-1], test["reason"] or ""))
    archs = ", ".join(f"{a['name']} ({a['mode']})" for a in report.get("archs", []))
    totals = Counter(t["outcome"] for t in tests)
    out = [f"Targets: {archs}. Tests: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped.", ""]
    out += ["| op | check | passed | failed | skipped | why it failed (kind: count) |", "|---|---|---|---|---|---|"]
    for (op, check), row in sorted(rows.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        kinds = "; ".join(f"{kind}: {n}" for kind, n in row["kinds"].most_common()) or ""
        o = row["outcomes"]
        out.append(f"| {op} | {check} | {o['passed']} | {o['failed']} | {o['skipped']} | {kinds} |")
    out += ["", "First message of each kind, per op and check:", ""]
    for (op, check), row in sorted(rows.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        for kind, (test, message) in row["first"].items():
            message = " ".join(message.split())[:300].replace("|", "\\|")
            out.append(f"- {op} / {check} / {kind}: `{test}`: {message}")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="--fla-report JSON files (one run's parts)")
    args = parser.parse_args()
    merged = {"tests": [], "archs": []}
    for path in args.reports:
        try:
            with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
                report = json.load(f)
        except (OSError, ValueError) as e:  # a part cut before it wrote its report
            print(f"(no report in {path}: {type(e).__name__})\n")
            continue
        merged["tests"] += report["tests"]
        merged["archs"] = merged["archs"] or report.get("archs", [])
    print(summarise(merged), end="")


if __name__ == "__main__":
    main()
