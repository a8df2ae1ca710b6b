"""What a mutation run prints and writes: a line per mutant, the score table, the JSON.

Score of an op: killed (timeouts included) over the mutants that count, which are all
run mutants less the equivalent and the invalid ones (and less tool errors, which are
listed apart and should be none): ``killed / (total - equivalent - invalid)``. The
``ratchet`` column counts the kills whose first failure was the error ratchet's
(``checks.tolerance``): accuracy lost inside the checks' limits.
"""

from __future__ import annotations

import json
from pathlib import Path

from .runner import Outcome
from .sites import Mutant

COLUMNS = ("killed", "timeout", "survived", "equivalent", "invalid", "error")
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


def table(ops: dict) -> str:
    """The per-op table, then the totals (``ops``: op -> {"sites", "mutants": [...]})."""
    header = ("op", "sites", "run", "killed", "ratchet", *COLUMNS[1:], "score")
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
        rows.append((op, data["sites"], run, *(counts[c] for c in ("killed", "ratchet", *COLUMNS[1:])),
                     _percent(score(counts))))
    run = f"{total['total']} (+{not_run} not run)" if not_run else total["total"]
    rows.append(("all", sites, run, *(total[c] for c in ("killed", "ratchet", *COLUMNS[1:])), _percent(score(total))))
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    out = [" | ".join(str(h).ljust(w) for h, w in zip(header, widths)),
           "-|-".join("-" * w for w in widths)]
    out += [" | ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(out)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


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
