"""Every document or path the repository's text cites exists in the repository: a reader
who clones it can follow every reference (no page that lives elsewhere)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini"}
TOP_DIRS = ("pytest_fla", "kernels", "reference", "tests", "docs", "benchmarks", "ci", "examples")
# A document by name (docs/ops.md, README.md), or a path into one of the repository's
# folders; not a path built at run time ($LOGS/x.md) nor an absolute one.
DOCUMENT = re.compile(r"(?<![\w/.${}-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
REPO_PATH = re.compile(r"(?<![\w/.${}-])((?:%s)/(?:[\w.-]+/)*[\w.-]+\.\w+)" % "|".join(TOP_DIRS))


def repo_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def resolves(cited: str, citing: Path, names: set[str]) -> bool:
    if (ROOT / cited).exists() or (citing.parent / cited).exists():
        return True
    # a bare file name (README.md) may name any file of that name in the repository
    return "/" not in cited and cited in names


def dangling_citations() -> list[str]:
    files = repo_files()
    names = {f.name for f in files}
    found = []
    for path in files:
        if path.suffix not in TEXT_SUFFIXES:
            continue
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in (DOCUMENT, REPO_PATH):
                for cited in pattern.findall(line):
                    cited = cited.rstrip(".")
                    if not resolves(cited, path, names):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    return sorted(set(found))


def test_every_cited_document_is_in_the_repository():
    dangling = dangling_citations()
    assert not dangling, "citations of files the repository does not hold:\n" + "\n".join(dangling)


def test_the_check_sees_a_dangling_citation():
    page = ROOT / "docs" / "ops.md"
    assert resolves("docs/ops.md", ROOT / "README.md", set())
    elsewhere = "SPEC" + ".md"  # (spelled apart, or this file would cite it)
    assert not resolves(elsewhere, page, {"README.md"})
    assert DOCUMENT.findall(f"the contract ({elsewhere}, Layers) and $LOGS/errors.md") == [elsewhere]
    assert REPO_PATH.findall("see `pytest_fla/targets/__init__.py`; not /tmp/pytest_fla/x.py") == ["pytest_fla/targets/__init__.py"]
