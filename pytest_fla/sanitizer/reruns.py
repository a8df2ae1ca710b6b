"""Which tests re-run under compute-sanitizer, and their verdicts.

A test is re-run under each tool when it passed plainly, launched a Triton kernel and is not
marked ``fla_plain_only`` (or always, with ``--fla-sanitizer-all-tests``); its kernels are
already compiled and cached by the plain run. A ``large_memory`` check is not run at all
(``LARGE_NOT_RUN``) unless that option asks. Tests that ran plainly in one child (a batch or
a module) re-run under the tool in one child too: start-up (torch, CUDA, collection) is
most of a sanitizer run's time. Launches are blocking under the tool, so a report comes
while the kernel's test runs: it lands on that test, which re-runs alone to confirm. A
report that comes outside every test, and a batch whose child dies, fall back to tests run
alone, so a finding is always pinned on the test that caused it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import sanitizer
from ..running.isolation import ChildTime, ItemOutcome, run_batch, test_output

NOT_LAUNCHED = "not run: the test launched no Triton kernel (--fla-sanitizer-all-tests runs it)"
# A large_memory check cannot shrink to the tool's small shapes (2**31 elements is its
# point): under the tool it took 25-30 s each on the H100 with the GPU held alone. Its plain
# run holds the GPU alone too, and each hold first waits for every check in flight while new
# ones queue behind it: other workers idle, for nothing the tool sees. The plain suite runs it.
LARGE_NOT_RUN = ("not run under --fla-sanitizer: a large_memory check cannot shrink to the tool's "
                 "small shapes, and its plain run holds the GPU alone, every other check waiting; "
                 "the plain suite runs it (--fla-sanitizer-all-tests runs it, under the tool too)")


# Marks a test the tools do not re-run: it runs plainly only (the marker's reason says why),
# unless --fla-sanitizer-all-tests asks.
PLAIN_ONLY = "fla_plain_only"


def plain_only_reason(item) -> str:
    marker = item.get_closest_marker(PLAIN_ONLY)
    reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "marked plain-only")
    return f"not run under the tool: {reason} (--fla-sanitizer-all-tests runs it)"


def skipped_under_tools(config, item) -> str | None:
    """Why ``item`` is not run at all in this sanitizer session, or None."""
    if item.get_closest_marker("large_memory") is not None and not config.option.fla_sanitizer_all_tests:
        return LARGE_NOT_RUN
    return None


@dataclass
class Verdict:
    """What the tools made of one test."""

    failure: str | None = None  # what fails the test, if anything
    section: tuple | None = None  # the tools' text, shown with the test's report
    time: ChildTime = field(default_factory=ChildTime)  # of the tools' runs of it (its share of a batch's run)


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
        elif item.get_closest_marker(PLAIN_ONLY) is not None and not every_test:
            result[item.nodeid] = Verdict(section=("compute-sanitizer", plain_only_reason(item)))
        else:
            candidates.append(item)
    failures = {item.nodeid: [] for item in candidates}
    texts = {item.nodeid: [] for item in candidates}
    seconds = {item.nodeid: ChildTime() for item in candidates}
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
    """item -> (failure or None, the tool's text, its ChildTime) for one tool: the items in
    one child. A report lands on the test that was running when it came (the child's output
    between that test's start mark and the next), which then re-runs alone to confirm it;
    a report that lands on no test (before the first, after the last, past the print
    limit) re-runs every test of the batch alone."""
    if not items:
        return {}
    outcomes = _run(config, items, tool)
    spent = {item: outcomes[item.nodeid].time for item in items}
    found = _placed(tool, items, outcomes) if len(items) > 1 else {items[0]: _verdict(tool, outcomes[items[0].nodeid])}
    if found is None:
        alone = {item: _run(config, [item], tool)[item.nodeid] for item in items}
        found = {item: _verdict(tool, outcome) for item, outcome in alone.items()}
        spent = {item: spent[item] + outcome.time for item, outcome in alone.items()}
    elif len(items) > 1:
        for item, (failure, text) in found.items():
            if failure is None:
                found[item] = (None, text + f" (run with {len(items)} tests in one process)")
            elif not outcomes[item.nodeid].died:  # a death is pinned on its test already
                alone = _run(config, [item], tool)[item.nodeid]
                spent[item] = spent[item] + alone.time
                confirmed = _verdict(tool, alone)
                found[item] = confirmed if confirmed[0] else (
                    f"{failure}\n(reported while it ran in one process with {len(items) - 1} other tests; "
                    "run alone it was clean)", text)
    return {item: (*found[item], spent[item]) for item in items}


def _placed(tool: str, items, outcomes) -> dict | None:
    """item -> (failure or None, text) from its own part of its batch child's output; None
    if a report of that child lands on none of them."""
    wholes, placed, found = {}, {}, {}
    for item in items:
        outcome = outcomes[item.nodeid]
        whole = wholes.setdefault(outcome.stdout, sanitizer.parse(tool, outcome.stdout, outcome.exit_code))
        own = sanitizer.parse(tool, test_output(outcome.stdout, item.nodeid) or "").findings
        placed[outcome.stdout] = placed.get(outcome.stdout, 0) + len(own)
        own_result = whole.part(own, finished=whole.errors is not None or outcome.cut_after)
        found[item] = _verdict(tool, outcome, own_result)
    for stdout, whole in wholes.items():
        if len(whole.findings) != placed[stdout] or (whole.errors or 0) > len(whole.error_findings):
            return None
    return found


def _run(config, items, tool: str) -> dict:
    return run_batch(config, items, wrapper=sanitizer.command(tool), env=sanitizer.environment(),
                     stall_seconds=config.option.fla_sanitizer_stall or None)


def _verdict(tool: str, outcome: ItemOutcome, found: sanitizer.SanitizerResult | None = None) -> tuple[str | None, str]:
    found = found or sanitizer.parse(tool, outcome.stdout, outcome.exit_code)
    text = found.describe()
    if outcome.stalls and not outcome.died:
        text += (f"\n(its first run under the tool stalled and was killed; it ran again:"
                 f" {outcome.stalls[0]})")
    if outcome.died:
        gave_up = found.describe() + "\n" if found.gave_up else ""
        return f"under compute-sanitizer {tool}: {outcome.died}\n{gave_up}{outcome.stderr_tail}", text
    if not found.clean:
        return found.describe(), text
    if not passed(outcome):
        return f"under compute-sanitizer {tool} the test did not pass", text
    return None, text
