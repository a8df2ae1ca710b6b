"""The environment variables have one owner: ``pytest_fla/environment.py`` names each one the
plugin reads or sets, with its reason, and ``docs/design.md`` ("Environment variables") has a
row for every ``FLA_`` name in the code, and no row for a name the code does not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bFLA_[A-Z0-9_]*[A-Z0-9]\b")
SOURCES = ["pytest_fla", "kernels", "ci", "benchmarks"]
REASONS = ("before import", "crosses", "switch")


def code_files() -> list[Path]:
    files = [ROOT / "conftest.py"]
    for folder in SOURCES:
        files += [path for path in sorted((ROOT / folder).rglob("*"))
                  if path.is_file() and path.suffix in (".py", ".sh", ".yml")
                  and "results" not in path.relative_to(ROOT).parts]
    return files


def names_in_code() -> dict[str, str]:
    found = {}
    for path in code_files():
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def names_in_design() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in NAME.findall(row)}


def test_every_variable_in_the_code_has_a_row_in_the_design():
    documented = names_in_design()
    missing = {name: where for name, where in names_in_code().items() if name not in documented}
    assert not missing, "no row in docs/design.md's 'Environment variables': " + ", ".join(
        f"{name} ({where})" for name, where in sorted(missing.items()))


def test_every_row_of_the_design_is_a_variable_of_the_code():
    stale = names_in_design() - set(names_in_code())
    assert not stale, f"rows of docs/design.md for names no code has: {sorted(stale)}"


def test_every_variable_of_the_plugin_says_why_it_is_one():
    """Each constant of ``environment.py`` has a comment above it that opens with its reason."""
    lines = (ROOT / "pytest_fla" / "environment.py").read_text().splitlines()
    constants = [i for i, line in enumerate(lines) if re.match(r"[A-Z0-9_]+ = \"FLA_", line)]
    assert len(constants) >= 20
    def first_comment_line(i):
        while i > 0 and lines[i - 1].startswith("# ") and not lines[i - 1].startswith("# --"):
            i -= 1
        return lines[i] if lines[i].startswith("# ") else ""

    unexplained = [lines[i] for i in constants
                   if not any(reason in first_comment_line(i).split(":")[0] for reason in REASONS)]
    assert not unexplained, f"no reason (one of {REASONS}) above: {unexplained}"


def test_the_plugin_spells_a_variable_only_through_its_owner():
    """Outside ``environment.py`` a plugin module names an ``FLA_`` variable in its docstrings
    and comments only; its code reads ``environment.<NAME>``."""
    spelt = []
    for path in sorted((ROOT / "pytest_fla").rglob("*.py")):
        if path.name == "environment.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and NAME.search(node.value)):
                spelt.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not spelt, "an FLA_ variable spelt outside pytest_fla/environment.py:\n" + "\n".join(spelt)
