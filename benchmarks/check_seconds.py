"""Where a conformance run's test seconds went, by check and by op, from its ``--fla-report``
JSON (each test's duration in the worker that ran it):

    python benchmarks/check_seconds.py benchmarks/results/<dir>/<report>.json[.gz] [--check error_inputs]

prints, per check, the tests, their seconds (the sum, and its share of the run's), the median
and the largest, and where the report has them, the seconds of each part of the tests' work
(``pytest_fla.report.time_split``: drawing inputs, the float64 reference, compiling and loading
kernels, and the counts of compiles and of Triton's cache hits); with ``--check``, the same
per op within that check. A check whose median is far above what its work needs points at
the inputs it builds, not at the kernels (the error-input checks at GPU sizes: ``benchmarks/results/README.md``).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import statistics

from pytest_fla.report.time_split import COUNTS


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["tests"]


def table(tests: list[dict], key: str) -> str:
    groups = collections.defaultdict(list)
    parts = collections.defaultdict(lambda: collections.defaultdict(float))
    for test in tests:
        group = test.get(key) or "-"
        groups[group].append(test["duration"] or 0.0)
        for part, seconds in (test.get("parts_seconds") or {}).items():
            parts[group][part] += seconds
    names = sorted({part for spent in parts.values() for part in spent})
    total = sum(sum(d) for d in groups.values()) or 1.0
    lines = [f"| {key} | tests | seconds | share | median s | largest s |" + "".join(f" {n} |" if n in COUNTS else f" {n} s |" for n in names),
             "|---|---|---|---|---|---|" + "---|" * len(names)]
    for name, durations in sorted(groups.items(), key=lambda item: -sum(item[1])):
        lines.append(f"| {name} | {len(durations)} | {sum(durations):.0f} | {100 * sum(durations) / total:.0f}% "
                     f"| {statistics.median(durations):.2f} | {max(durations):.2f} |"
                     + "".join(f" {parts[name].get(n, 0.0):.0f} |" if n in COUNTS else f" {parts[name].get(n, 0.0):.1f} |"
                             for n in names))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--check", help="split this check's seconds by op")
    args = parser.parse_args()
    tests = load(args.report)
    print(f"{len(tests)} tests, {sum(t['duration'] or 0.0 for t in tests):.0f} s in all")
    print(table(tests, "check"))
    if args.check:
        print()
        print(table([t for t in tests if t.get("check") == args.check], "op"))


if __name__ == "__main__":
    main()
