"""Summarise the errors recorded by ``FLA_RECORD_ERRORS`` into the table docs/tolerances.md quotes.

    python benchmarks/summarize_errors.py errors.jsonl      (or errors.jsonl.gz)

Per (dtype, kind): how many comparisons, the largest relative RMS error and the largest
max-abs error (relative to max |ref|) measured, and which test and tensor it was; then the
same per (op, dtype, kind), the op read from the test id (``test_forward[op-dtype-case]``).
"""

import gzip
import json
import sys
from collections import defaultdict


def main(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            records = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    except FileNotFoundError:
        print(f"no errors recorded at {path}")
        return
    print_table(records, lambda r: (r["dtype"], r["kind"]), ("dtype", "kind"), with_where=True)
    print()
    print_table(records, lambda r: (op_of(r["test"]), r["dtype"], r["kind"]), ("op", "dtype", "kind"), with_where=False)


def op_of(test_id: str) -> str:
    params = test_id.split("[", 1)[1].rstrip("]") if "[" in test_id else ""
    return params.split("-", 1)[0] or "?"


def print_table(records, key_of, key_names, with_where):
    worst = defaultdict(lambda: {"n": 0, "rel_rms": (0.0, ""), "max_abs": (0.0, "")})
    for r in records:
        w = worst[key_of(r)]
        w["n"] += 1
        where = f"{r['test'].split('::')[-1]} {r['tensor']}"
        for key in ("rel_rms", "max_abs"):
            if r[key] > w[key][0]:
                w[key] = (r[key], where)
    heads = list(key_names) + ["comparisons", "max rel RMS"] + (["where"] if with_where else []) \
        + ["max abs / max|ref|"] + (["where"] if with_where else [])
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for key, w in sorted(worst.items()):
        cells = list(key) + [str(w["n"]), f"{w['rel_rms'][0]:.2e}"] + ([w["rel_rms"][1]] if with_where else []) \
            + [f"{w['max_abs'][0]:.2e}"] + ([w["max_abs"][1]] if with_where else [])
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
