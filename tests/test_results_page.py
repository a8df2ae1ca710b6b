"""The GPU results stay one current page (``benchmarks/results/README.md``): its length and
the folder's tracked files held to the limits its opening lines state, so that a run that
adds files beside the ones it re-measured, or a page that grows into a notebook, fails here.
One file per measurement, its latest run only; the rule itself: the page's opening lines."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = RESULTS / "README.md"
# the limits, stated here once and in the page's opening lines (checked below)
MAX_PAGE_LINES = 300
MAX_FILES = 55
OPENING_LINES = 12


def tracked_files(folder: Path) -> list[str]:
    """The folder's files as git tracks them; every file under it where this is not a git
    checkout (an unpacked archive, a wheel's sources)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--", str(folder)], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split("\n")
        if (ROOT / ".git").exists():
            return sorted(name for name in listed if name)
    except (OSError, subprocess.CalledProcessError):
        pass
    return sorted(str(Path(d, f).relative_to(ROOT)) for d, _, files in os.walk(folder) for f in files)


def page_lines() -> list[str]:
    return PAGE.read_text().splitlines()


def over_length(lines: list[str]) -> str | None:
    if len(lines) > MAX_PAGE_LINES:
        return (f"{PAGE.relative_to(ROOT)}: {len(lines)} lines, more than {MAX_PAGE_LINES}: keep each measurement's "
                "latest run only (earlier runs are in git), a partial re-run updating the rows it measured")
    return None


def over_count(files: list[str]) -> str | None:
    if len(files) > MAX_FILES:
        per_folder: dict = {}
        for f in files:
            folder = os.path.dirname(f.removeprefix("benchmarks/results/")) or "."
            per_folder[folder] = per_folder.get(folder, 0) + 1
        return (f"benchmarks/results/ holds {len(files)} tracked files, more than {MAX_FILES}: one file per "
                "measurement, a re-run replacing its files (bench.py --merge for the bench). Per folder:\n"
                + "\n".join(f"  {n} {d}" for d, n in sorted(per_folder.items())))
    return None


def test_the_page_is_within_its_length():
    lines = page_lines()
    assert len(lines) > 50, "the page is (nearly) empty: the length check would pass on nothing"
    assert over_length(lines) is None, over_length(lines)


def test_the_folder_is_within_its_file_count():
    files = tracked_files(RESULTS)
    assert "benchmarks/results/README.md" in files
    assert sum("/" in f.removeprefix("benchmarks/results/") for f in files) >= 10, "the count sees no subfolder's files"
    assert over_count(files) is None, over_count(files)


def test_the_page_states_the_limits_it_is_held_to():
    opening = " ".join(page_lines()[:OPENING_LINES])
    assert re.search(rf"\bat most {MAX_PAGE_LINES} lines\b", opening), f"the page's opening lines state no {MAX_PAGE_LINES}-line limit"
    assert re.search(rf"\bat most {MAX_FILES} tracked files\b", opening), f"the page's opening lines state no {MAX_FILES}-file limit"
    assert "tests/test_results_page.py" in opening


def test_the_checks_see_a_page_or_folder_over_its_limit():
    assert over_length(["line"] * MAX_PAGE_LINES) is None
    assert f"{MAX_PAGE_LINES + 1} lines" in over_length(["line"] * (MAX_PAGE_LINES + 1))
    files = [f"benchmarks/results/bench/run{i}.md" for i in range(MAX_FILES)]
    assert over_count(files) is None
    message = over_count(files + ["benchmarks/results/README.md"])
    assert f"{MAX_FILES + 1} tracked files" in message and f"{MAX_FILES} bench" in message
