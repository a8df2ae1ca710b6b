"""Which tests re-run under compute-sanitizer, and their verdicts.

A test is re-run under each tool when it passed plainly and launched a Triton kernel (or
always, with ``--fla-sanitizer-all-tests``); its kernels are already compiled and cached
by the plain run. Tests that ran plainly in one child (a module batch) re-run under the
tool in one child too: start-up (torch, CUDA, collection) is most of a sanitizer run's
time. When that child reports anything, or dies, each of its tests re-runs alone under
the tool, so a finding is pinned on the test that caused it.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import sanitizer
from .isolation import ItemOutcome, run_batch

NOT_LAUNCHED = "not run: the test launched no Triton kernel (--fla-sanitizer-all-tests runs it)"


@dataclass
class Verdict:
    """What the tools made of one test."""

    failure: str | None = None  # what fails the test, if anything
    section: tuple | None = None  # the tools' text, shown with the test's report
    seconds: float = 0.0  # wall time of the tools' runs of it (its share of a batch's run)


def passed(outcome: ItemOutcome) -> bool:
    return any(r["when"] == "call" and r["outcome"] == "passed" for r in outcome.reports)


def verdicts(config, items, plain: dict, tools: list[str]) -> dict:
    """nodeid -> Verdict for ``items``, whose plain outcomes are ``plain``."""
    every_test = config.option.fla_sanitizer_all_tests
    result, candidates = {}, []
    for item in items:
        outcome = plain[item.nodeid]
        if outcome.died or not passed(outcome):
            result[item.nodeid] = Verdict()
        elif outcome.triton_launches() == 0 and not every_test:
            result[item.nodeid] = Verdict(section=("compute-sanitizer", NOT_LAUNCHED))
        else:
            candidates.append(item)
    failures = {item.nodeid: [] for item in candidates}
    texts = {item.nodeid: [] for item in candidates}
    seconds = {item.nodeid: 0.0 for item in candidates}
    for tool in tools:
        for item, (failure, text, spent) in _under_tool(config, candidates, tool).items():
            texts[item.nodeid].append(text)
            seconds[item.nodeid] += spent
            if failure:
                failures[item.nodeid].append(failure)
    for item in candidates:
        section = ("compute-sanitizer", "\n\n".join(texts[item.nodeid]))
        result[item.nodeid] = Verdict("\n\n".join(failures[item.nodeid]) or None, section, seconds[item.nodeid])
    return result


def _under_tool(config, items, tool: str) -> dict:
    """item -> (failure or None, the tool's text, seconds) for one tool: the items in one
    child, then one by one if that child was not clean."""
    if not items:
        return {}
    outcomes = _run(config, items, tool)
    found = {item: _verdict(tool, outcomes[item.nodeid]) for item in items}
    spent = {item: outcomes[item.nodeid].process_seconds for item in items}
    if len(items) > 1 and all(failure is None for failure, _ in found.values()):
        note = f" (run with {len(items)} tests in one process)"
        found = {item: (None, text + note) for item, (_, text) in found.items()}
    elif len(items) > 1:
        alone = {item: _run(config, [item], tool)[item.nodeid] for item in items}
        found = {item: _verdict(tool, outcome) for item, outcome in alone.items()}
        spent = {item: spent[item] + outcome.process_seconds for item, outcome in alone.items()}
    return {item: (*found[item], spent[item]) for item in items}


def _run(config, items, tool: str) -> dict:
    return run_batch(config, items, wrapper=sanitizer.command(tool), env=sanitizer.environment())


def _verdict(tool: str, outcome: ItemOutcome) -> tuple[str | None, str]:
    found = sanitizer.parse(tool, outcome.stdout)
    if outcome.died:
        return f"under compute-sanitizer {tool}: {outcome.died}\n{outcome.stderr_tail}", found.describe()
    if not found.clean:
        return found.describe(), found.describe()
    if not passed(outcome):
        return f"under compute-sanitizer {tool} the test did not pass", found.describe()
    return None, found.describe()
