"""The layers import downwards only: the kernel library (``kernels/``) and the float64
references (``reference/``) import nothing from the plugin that tests them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "pytest_fla"


def imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every import statement in ``source``, wherever it stands
    (a function body's lazy import included); relative imports stay inside their package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def plugin_imports(package: str) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {module}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line, module in imported_modules(path.read_text())
            if module == PLUGIN or module.startswith(PLUGIN + ".")]


@pytest.mark.parametrize("package", ["kernels", "reference"])
def test_the_library_imports_nothing_from_the_plugin(package):
    found = plugin_imports(package)
    assert not found, f"{package}/ imports the test plugin:\n" + "\n".join(found)


def test_the_scan_sees_every_form_of_import():
    source = ("import pytest_fla\nfrom pytest_fla.targets import ALL_ARCHS\n"
              "def f():\n    import pytest_fla.api as api\nfrom . import _arch\nimport pytest_flat\n")
    modules = sorted(module for _, module in imported_modules(source))
    assert modules == ["pytest_fla", "pytest_fla.api", "pytest_fla.targets", "pytest_flat"]
