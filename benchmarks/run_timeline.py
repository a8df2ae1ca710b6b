"""Where an isolated run's time went, from its ``--fla-report`` JSON.

Each test record carries when it began (its setup, in the child that ran it), which xdist
worker ran it, its duration there, and its child processes' wall seconds (plain, and under
compute-sanitizer). Grouped into the batches the plugin ran (``pytest_fla.running.distribute``),
that is a timeline per worker:

    python benchmarks/run_timeline.py benchmarks/results/<dir>/<report>.json[.gz] [--collected ids.txt]

prints, per worker, its batches in order (start-end seconds from the run's first test, plain
child and tool seconds), then the worker-seconds spent in plain children, in the tool's
children and in neither (waiting, or a batch still running when the run was cut). With
``--collected`` (the run's node ids, one a line: ``pytest --collect-only -q``), the batches
that never finished, which a run cut by its time limit leaves out of its report.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json

from pytest_fla.running.distribute import batch_keys


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["tests"]


def batches_by_worker(tests: list[dict], granularity: str = "batch") -> dict:
    """worker -> [(batch key, its tests in the order they began)], in the order they ran."""
    keys = batch_keys([t["nodeid"] for t in tests], granularity)
    by_worker = collections.defaultdict(list)
    for test in sorted((t for t in tests if t.get("started") is not None), key=lambda t: t["started"]):
        runs = by_worker[test.get("worker") or "-"]
        key = keys[test["nodeid"]]
        if not runs or runs[-1][0] != key:
            runs.append((key, []))
        runs[-1][1].append(test)
    return by_worker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--collected", help="the run's node ids, one a line: lists the batches that never finished")
    ap.add_argument("--granularity", default="batch", choices=["batch", "module"])
    args = ap.parse_args()
    tests = load(args.report)
    timed = [t for t in tests if t.get("started") is not None]
    if not timed:
        raise SystemExit("no test in this report says when it began (a report from before the timeline fields)")
    t0 = min(t["started"] for t in timed)
    end = max(t["started"] + t["duration"] for t in timed) - t0
    plain = tool = 0.0
    by_worker = batches_by_worker(tests, args.granularity)
    for worker in sorted(by_worker, key=lambda w: (len(w), w)):
        spans = []
        for key, members in by_worker[worker]:
            start = members[0]["started"] - t0
            stop = max(m["started"] + m["duration"] for m in members) - t0
            child = sum((m["process_seconds"] or 0) - (m["sanitizer_seconds"] or 0) for m in members)
            under = sum(m["sanitizer_seconds"] or 0 for m in members)
            plain, tool = plain + child, tool + under
            spans.append(f"{start:5.0f}-{stop:5.0f} plain {child:4.0f} tool {under:4.0f} {key.split('::')[-1]}")
        print(f"{worker}:")
        for span in spans:
            print(f"  {span}")
    workers = len(by_worker)
    print(f"\n{len(tests)} tests on {workers} workers; the last finished test ended {end:.0f} s after the first began")
    print(f"worker-seconds: plain children {plain:.0f}, tool children {tool:.0f}, "
          f"neither {max(workers * end - plain - tool, 0):.0f} (of {workers * end:.0f})")
    if args.collected:
        with open(args.collected) as f:
            collected = [line.strip() for line in f if "::" in line]
        done = {t["nodeid"] for t in tests}
        keys = batch_keys(collected, args.granularity)
        missing = collections.Counter(keys[n] for n in collected if n not in done)
        sizes = collections.Counter(keys.values())
        print(f"\nbatches that never finished ({sum(missing.values())} tests):")
        for key, count in missing.items():
            print(f"  {key}: {count} of {sizes[key]} tests")


if __name__ == "__main__":
    main()
