"""Which mutants a run takes, and the kept list of equivalent ones.

Selection: every site of an op is listed; a run takes at most ``max_per_op`` of them,
drawn by a generator seeded with ``seed`` and the op's name, in turns over the operators
(in a shuffled order) and, within an operator, over the functions that have its sites:
the few mutants an affordable run takes are spread over bug classes and kernels, and the
same sites give the same choice on every machine.

The equivalence list is a TOML file of ``[[equivalent]]`` tables, each an ``id`` (a
mutant id, :mod:`.sites`), a ``reason``: why no input can tell the mutant from the
original (a mask a later mask already covers, a constant that cancels), and optionally
``ops``, the ops it holds for (all where absent). A listed mutant
that survives is ``equivalent``; one that is killed is reported as a stale entry.
"""

from __future__ import annotations

import random
import tomllib
from collections import defaultdict, deque
from pathlib import Path

from .sites import Mutant

DEFAULT_EQUIVALENT = Path("tests") / "mutation_equivalent.toml"


def select(mutants: list[Mutant], op: str, limit: int | None, seed: int) -> list[Mutant]:
    """At most ``limit`` of ``mutants`` (all of them with None), spread as the module says,
    in their listed order."""
    if limit is None or len(mutants) <= limit:
        return list(mutants)
    chosen = {m.id for m in spread(mutants, op, seed)[:limit]}
    return [m for m in mutants if m.id in chosen]


def spread(mutants: list[Mutant], op: str, seed: int) -> list[Mutant]:
    """Every one of ``mutants``, in the order the selection takes them: its first ``n``
    are the ``n`` selected, and the next ones replace those that turn out invalid."""
    rng = random.Random(f"{seed}:{op}")
    groups: dict[str, dict[tuple, list[Mutant]]] = defaultdict(lambda: defaultdict(list))
    for mutant in sorted(mutants, key=lambda m: m.id):
        groups[mutant.operator][(mutant.path, mutant.function)].append(mutant)
    turns = {}
    for operator, by_function in groups.items():
        functions = sorted(by_function)
        rng.shuffle(functions)
        for pool in by_function.values():
            rng.shuffle(pool)
        turns[operator] = deque(functions)
    operators = sorted(groups)
    rng.shuffle(operators)
    order: list[Mutant] = []
    while operators:
        for operator in list(operators):
            functions = turns[operator]
            function = functions.popleft()
            pool = groups[operator][function]
            order.append(pool.pop())
            if pool:
                functions.append(function)
            if not functions:
                operators.remove(operator)
    return order


def load_equivalent(path: Path | None) -> dict[tuple[str, str | None], str]:
    """``{(mutant id, op or None): reason}`` from the kept list (empty where there is
    none); an entry with ``ops = [...]`` holds for those ops only (code shared by ops
    that use it differently: a scalar decay that one op's per-channel path never reads)."""
    if path is None or not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    entries = {}
    for entry in data.get("equivalent", []):
        if not entry.get("id") or not entry.get("reason"):
            raise SystemExit(f"{path}: every [[equivalent]] entry needs an id and a reason: {entry}")
        for op in entry.get("ops") or [None]:
            entries[(entry["id"], op)] = entry["reason"]
    return entries


def equivalent_reason(entries: dict, mutant_id: str, op: str) -> str | None:
    """Why ``mutant_id`` is equivalent for ``op``, or None where the list does not say so."""
    return entries.get((mutant_id, op), entries.get((mutant_id, None)))
