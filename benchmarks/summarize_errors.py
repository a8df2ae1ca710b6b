"""Summarise the errors recorded by ``FLA_RECORD_ERRORS`` into the table docs/tolerances.md quotes.

    python benchmarks/summarize_errors.py errors.jsonl

Per (dtype, kind): how many comparisons, the largest relative RMS error and the largest
max-abs error (relative to max |ref|) measured, and which test and tensor it was.
"""

import json
import sys
from collections import defaultdict


def main(path):
    worst = defaultdict(lambda: {"n": 0, "rel_rms": (0.0, ""), "max_abs": (0.0, "")})
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        print(f"no errors recorded at {path}")
        return
    for line in lines:
        r = json.loads(line)
        w = worst[(r["dtype"], r["kind"])]
        w["n"] += 1
        where = f"{r['test'].split('::')[-1]} {r['tensor']}"
        for key in ("rel_rms", "max_abs"):
            if r[key] > w[key][0]:
                w[key] = (r[key], where)
    print("| dtype | kind | comparisons | max rel RMS | where | max abs / max|ref| | where |")
    print("|---|---|---|---|---|---|---|")
    for (dtype, kind), w in sorted(worst.items()):
        print(f"| {dtype} | {kind} | {w['n']} | {w['rel_rms'][0]:.2e} | {w['rel_rms'][1]} | {w['max_abs'][0]:.2e} | {w['max_abs'][1]} |")


if __name__ == "__main__":
    main(sys.argv[1])
