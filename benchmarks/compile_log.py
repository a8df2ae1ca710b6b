"""How much of a run's compile time went to kernels that another process was compiling too.

    FLA_COMPILE_LOG=compiles.jsonl pytest ... --fla-sanitizer=memcheck -n 16
    python benchmarks/compile_log.py compiles.jsonl [--earlier EARLIER.jsonl]

Every isolated test child appends one line per Triton compile call to ``FLA_COMPILE_LOG``
(``pytest_fla.running.launches``): pid, kernel, key (source, specialisation and options), seconds,
end time. A key's first call to end is the compile that filled the cache; a call of the same
key that began before that one ended found no cache entry either and compiled it again (a
duplicate); a call that began after found it (a hit, fast). Prints the totals and the kernels
with the most duplicated seconds.

``--earlier``: the log of an earlier run on the same Triton cache. A kernel this run compiled
(a first call over ``COMPILED_SECONDS``; a cache hit takes milliseconds) whose key the earlier
run had compiled too was not served by the cache; one whose key is new met a specialisation
(argument alignment or divisibility, a constexpr) the earlier run never did.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def summarize(lines) -> dict:
    calls = [json.loads(line) for line in lines if line.strip()]
    by_key = defaultdict(list)
    for call in calls:
        by_key[call["key"]].append(call)
    duplicated = defaultdict(float)
    first_seconds = duplicate_seconds = hit_seconds = 0.0
    duplicates = 0
    for key, group in by_key.items():
        first = min(group, key=lambda c: c["at"])
        first_seconds += first["seconds"]
        for call in group:
            if call is first:
                continue
            if call["at"] - call["seconds"] < first["at"]:
                duplicates += 1
                duplicate_seconds += call["seconds"]
                duplicated[call["kernel"]] += call["seconds"]
            else:
                hit_seconds += call["seconds"]
    return {
        "calls": len(calls), "keys": len(by_key), "processes": len({c["pid"] for c in calls}),
        "seconds": sum(c["seconds"] for c in calls), "first_seconds": first_seconds,
        "duplicates": duplicates, "duplicate_seconds": duplicate_seconds, "hit_seconds": hit_seconds,
        "most_duplicated": sorted(duplicated.items(), key=lambda kv: -kv[1])[:10],
    }


COMPILED_SECONDS = 0.2


def against_earlier(lines, earlier_lines) -> dict:
    """This run's compiles, split by whether the earlier run had compiled the same key."""
    earlier = {json.loads(line)["key"] for line in earlier_lines if line.strip()}
    first: dict = {}
    for call in (json.loads(line) for line in lines if line.strip()):
        if call["key"] not in first or call["at"] < first[call["key"]]["at"]:
            first[call["key"]] = call
    split = {"again": defaultdict(float), "new": defaultdict(float)}
    for key, call in first.items():
        if call["seconds"] > COMPILED_SECONDS:
            split["again" if key in earlier else "new"][call["kernel"]] += call["seconds"]
    return {name: sorted(kernels.items(), key=lambda kv: -kv[1]) for name, kernels in split.items()}


def main(path: str, earlier: str | None = None) -> None:
    with open(path) as f:
        lines = f.readlines()
    s = summarize(lines)
    print(f"compile calls {s['calls']} in {s['processes']} processes, {s['keys']} distinct kernels "
          f"(specialisation and options): {s['seconds']:.0f} s in all; the first compile of each "
          f"{s['first_seconds']:.0f} s, {s['duplicates']} duplicates (begun while another process compiled "
          f"the same) {s['duplicate_seconds']:.0f} s, cache hits {s['hit_seconds']:.0f} s")
    for kernel, seconds in s["most_duplicated"]:
        print(f"  {seconds:8.1f} s duplicated  {kernel}")
    if earlier:
        with open(earlier) as f:
            split = against_earlier(lines, f)
        for name, what in (("again", "compiled again though the earlier run had (the cache did not serve them)"),
                           ("new", "new specialisations (the earlier run never met them)")):
            kernels = split[name]
            print(f"{sum(sec for _, sec in kernels):.0f} s over {len(kernels)} kernels {what}")
            for kernel, seconds in kernels[:8]:
                print(f"  {seconds:8.1f} s  {kernel}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="FLA_COMPILE_LOG of the run")
    parser.add_argument("--earlier", help="FLA_COMPILE_LOG of an earlier run on the same Triton cache")
    args = parser.parse_args()
    main(args.log, args.earlier)
