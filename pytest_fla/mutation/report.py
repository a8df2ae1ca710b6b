"""What a mutation run prints and writes: a line per mutant, the score table, the JSON.

Score of an op: killed (timeouts included) over the mutants that count, which are all
run mutants less the equivalent and the invalid ones (and less tool errors, which are
listed apart and should be none): ``killed / (total - equivalent - invalid)``. The
``ratchet`` column counts the kills whose first failure was the error ratchet's
(``checks.tolerance``): accuracy lost inside the checks' limits. A run of rewrites
(``--rewrites``: edits that change at most the rounding) ends in ``false fails`` instead,
the share of them killed.

Each mutant's record also says how its errors compare with the baseline's
(``error_growth``): the largest ratio of its relative RMS errors to the recorded ones, each
plus the ratchet's floor; the largest share of the ratchet's limit that one of its changed
errors reached (``limit_used``; 1 or more: the ratchet fails it; 0: nothing changed), which
is how near a rewrite came to a false fail; and how many of its comparisons differ from the
record at all (none: the edit changed no value the checks see).
"""

from __future__ import annotations

import json
from pathlib import Path

from .runner import Outcome
from .sites import Mutant

COLUMNS = ("killed", "timeout", "survived", "equivalent", "invalid", "error")
SHOWN = ("killed", "ratchet", *COLUMNS[1:])  # the table's count columns
RATCHET_MARK = "error ratchet:"


def by_ratchet(detail: str | None) -> bool:
    """Whether a kill's first failure was the error ratchet's, not a limit's."""
    return RATCHET_MARK in (detail or "")


def line(op: str, mutant: Mutant, outcome: Outcome, note: str = "", status: str | None = None) -> str:
    """One mutant's line; ``status`` overrides the outcome's (``equivalent``)."""
    status = (status or outcome.status).upper()
    what = f"{op}: {status:<10} {mutant.describe()}"
    if outcome.status == "killed":
        what += f"  by {outcome.killed_by}" + (" (error ratchet)" if by_ratchet(outcome.detail) else "")
    elif outcome.status in ("invalid", "error", "timeout"):
        what += f"  ({outcome.detail})"
    if note:
        what += f"  [{note}]"
    return f"{what}  {outcome.seconds:.1f}s"


def tally(results: list[dict]) -> dict:
    counts = {c: 0 for c in COLUMNS}
    counts["ratchet"] = 0
    for result in results:
        counts[result["outcome"]] += 1
        counts["ratchet"] += result["outcome"] == "killed" and by_ratchet(result.get("detail"))
    counts["total"] = len(results)
    return counts


def score(counts: dict) -> float | None:
    """Killed (with timeouts) over the mutants that count; None where none counts."""
    killed = counts["killed"] + counts["timeout"]
    judged = killed + counts["survived"]
    return killed / judged if judged else None


def table(ops: dict, rewrites: bool = False) -> str:
    """The per-op table, then the totals (``ops``: op -> {"sites", "mutants": [...]});
    ``rewrites``: the last column is the false fails (killed over judged)."""
    header = ("op", "sites", "run", *SHOWN, "false fails" if rewrites else "score")
    rows = []
    total = {c: 0 for c in (*COLUMNS, "ratchet", "total")}
    sites = not_run = 0
    for op, data in ops.items():
        counts = tally(data["mutants"])
        for key in total:
            total[key] += counts[key]
        sites += data["sites"]
        not_run += data.get("not_run", 0)
        run = f"{counts['total']} (+{data['not_run']} not run)" if data.get("not_run") else counts["total"]
        rows.append((op, data["sites"], run, *(counts[c] for c in SHOWN), _percent(score(counts))))
    run = f"{total['total']} (+{not_run} not run)" if not_run else total["total"]
    rows.append(("all", sites, run, *(total[c] for c in SHOWN), _percent(score(total))))
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    out = [" | ".join(str(h).ljust(w) for h, w in zip(header, widths)),
           "-|-".join("-" * w for w in widths)]
    out += [" | ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def error_growth(baseline: str | Path, measured: str | Path) -> dict:
    """How a run's recorded errors (``measured``) compare with the baseline's, comparison by
    comparison (matched as ``checks.tolerance`` matches them): the largest relative-RMS
    ratio, each error plus the ratchet's floor; the largest share of the ratchet's limits
    (relative RMS and max) that a changed error reached; and how many of them differ at all."""
    from pytest_fla.checks.tolerance import ratchet_floor, ratchet_limits, read_errors

    before = read_errors(baseline)
    after = read_errors(measured) if Path(measured).exists() else {}  # none: died before comparing
    worst, used, changed, compared = 1.0, 0.0, 0, 0
    for key, errors in after.items():
        floor = ratchet_floor(key[2])
        for recorded, now in zip(before.get(key, []), errors):
            compared += 1
            changed += recorded != now
            worst = max(worst, (now[0] + floor) / (recorded[0] + floor))
            if recorded != now:  # an unchanged error is always within its limit
                rms_limit, max_limit = ratchet_limits(recorded, key[2])
                used = max(used, now[0] / rms_limit, now[1] / max_limit)
    return {"rms_ratio": round(worst, 3), "limit_used": round(used, 3), "changed": changed, "compared": compared}


def result_entry(mutant: Mutant, outcome: Outcome, equivalent_reason: str | None) -> dict:
    """One mutant's record for the JSON; ``outcome`` is rewritten to ``equivalent`` for a
    listed survivor."""
    status = outcome.status
    if status == "survived" and equivalent_reason is not None:
        status = "equivalent"
    entry = {**mutant.as_dict(), "outcome": status, "seconds": round(outcome.seconds, 2),
             "killed_by": outcome.killed_by, "detail": outcome.detail}
    if equivalent_reason is not None:
        entry["equivalent_reason"] = equivalent_reason
        if status != "equivalent":
            entry["stale_equivalence_entry"] = True
    return entry


def write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".part")
    temporary.write_text(json.dumps(document, indent=1) + "\n")
    temporary.replace(path)
