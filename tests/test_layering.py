"""The layers import downwards only: the kernel library (``kernels/``) and the float64
references (``reference/``) import nothing from the plugin that tests them, and the plugin
nothing from them or from this repo's specs (``specs/``) (it reaches a library only through the specs it is handed and the
switches its ini names, ``docs/plugin-api.md``)."""

from __future__ import annotations

import ast
import re
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


LIBRARY = ("kernels", "reference", "specs")
# a dotted name or a path into one of LIBRARY, in a string the code uses (not in prose:
# docstrings are left out): "kernels._utils", f"kernels.{name}", "kernels/_arch.py"
LIBRARY_NAME = re.compile(r"(?<![\w.])(?:kernels|reference|specs)(?:\.[A-Za-z_{]|/)")
# calls that import a module named by a string
IMPORTERS = ("import_module", "__import__", "find_spec", "spec_from_file_location")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _is_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARY


def library_reaches(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every way ``source`` reaches this repo's library: an import
    statement, a call importing a module by name, a string naming one of its modules or
    files."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = [(line, f"import {module}") for line, module in imported_modules(source) if _is_library(module)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            target = node.args[0].value
            if name in IMPORTERS and isinstance(target, str) and _is_library(target):
                found.append((node.lineno, f"{name}({target!r})"))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
            if LIBRARY_NAME.search(text):
                found.append((node.lineno, f"f{text!r}"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and LIBRARY_NAME.search(node.value)):
            found.append((node.lineno, repr(node.value)))
    return sorted(set(found))


def test_the_plugin_reaches_nothing_of_the_library():
    found = [f"{path.relative_to(ROOT)}:{line}: {what}"
             for path in sorted((ROOT / PLUGIN).rglob("*.py"))
             for line, what in library_reaches(path.read_text())]
    assert not found, "pytest_fla/ reaches into kernels/ or reference/:\n" + "\n".join(found)


def test_the_library_scan_sees_every_form_of_reach():
    source = (
        '"""The docstring may say kernels._utils."""\n'
        "import kernels\nfrom reference.attention import attention\n"
        "def f(name):\n    import kernels._arch\n    return f'kernels.{name}'\n"
        "importlib.import_module('kernels')\nimportlib.util.find_spec('reference')\n"
        "PATH = 'kernels/_arch.py'\nFLAG = 'kernels._utils:POISON_ALLOCATIONS'\n"
        "SCOPES = ('launches', 'kernels')\nimport kernelsx\nWORDS = 'the float64 reference. Then'\n"
    )
    lines = [line for line, _ in library_reaches(source)]
    assert lines == [2, 3, 5, 6, 7, 8, 9, 10]


# what this repo's specs (``specs/``) may import of the plugin: its stable API, as another
# repository's specs do
PUBLIC_API = (f"{PLUGIN}.api",)


def plugin_modules_named(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every plugin module ``source`` imports; ``from pytest_fla
    import x`` names ``pytest_fla.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == PLUGIN:
            found += [(node.lineno, f"{PLUGIN}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PLUGIN + "."):
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == PLUGIN]
    return found


def test_the_specs_use_the_plugin_through_its_stable_api_only():
    found = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in sorted((ROOT / "specs").rglob("*.py"))
             for line, module in plugin_modules_named(path.read_text())
             if module not in PUBLIC_API]
    assert not found, "specs/ imports the plugin past pytest_fla.api:\n" + "\n".join(found)


def test_the_api_scan_sees_a_module_imported_from_the_package():
    source = "from pytest_fla import api, targets\nfrom pytest_fla.api import Arg\nimport pytest_fla.ops.spec\n"
    assert [m for _, m in plugin_modules_named(source) if m not in PUBLIC_API] == ["pytest_fla.targets",
                                                                                   "pytest_fla.ops.spec"]


def test_the_scan_sees_every_form_of_import():
    source = ("import pytest_fla\nfrom pytest_fla.targets import ALL_ARCHS\n"
              "def f():\n    import pytest_fla.api as api\nfrom . import _arch\nimport pytest_flat\n")
    modules = sorted(module for _, module in imported_modules(source))
    assert modules == ["pytest_fla", "pytest_fla.api", "pytest_fla.targets", "pytest_flat"]


# The plugin's packages, lowest first: a module imports from its own package or a lower
# one (a lazy import in a function body included). Above them all stand the plugin's entry
# (plugin, fixtures, hookspec, __main__) and the modules that keep a public import path
# (conformance, compile_check, repro_helpers), which may import any of them.
PLUGIN_LAYERS = (
    ("environment",),  # the names of the environment variables the plugin reads or sets
    ("targets",),      # which archs a run checks, in which mode; the toolchain
    ("report",),       # the end-of-run report, and where a test's time goes
    ("running",),      # where and in which processes the tests run: devices, isolation, xdist, fleet
    ("ops",),          # describing ops: specs, inputs, error inputs, packings, the registry
    ("collection",),   # which tests a run collects and keeps (--fla-quick, nested projects)
    ("checks",),       # the checks over every spec, and the suites that parametrize them
    ("sanitizer",),    # compute-sanitizer: its command and reports, the tests re-run under it
    ("repro",),        # bug reports as tests
    ("api", "mutation"),  # the stable API for spec modules; mutation testing of the checks
)
ENTRY_MODULES = ("plugin", "fixtures", "hookspec", "__main__", "conformance", "compile_check", "repro_helpers")


def plugin_module_imports() -> dict[str, set[str]]:
    """For every module of the plugin (``pytest_fla.x.y``), the plugin modules it imports;
    ``from . import x`` counts as an import of the module ``x``."""
    package_root = ROOT / PLUGIN
    found: dict[str, set[str]] = {}
    for path in sorted(package_root.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        here = parts if is_package else parts[:-1]
        name = ".".join(parts)
        imports = found.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                if module.split(".")[0] != PLUGIN:
                    continue
                if module != name:  # ``from . import x`` in a package's own __init__
                    imports.add(module)
                for alias in node.names:
                    named = f"{module}.{alias.name}".split(".")
                    if (ROOT.joinpath(*named).with_suffix(".py").is_file()
                            or (ROOT.joinpath(*named) / "__init__.py").is_file()):
                        imports.add(".".join(named))
            elif isinstance(node, ast.Import):
                imports.update(alias.name for alias in node.names if alias.name.split(".")[0] == PLUGIN)
    return found


def layer_of(module: str) -> int | None:
    """The index of ``module``'s package in ``PLUGIN_LAYERS``; ``None`` for the package root
    and the entry modules."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    for index, names in enumerate(PLUGIN_LAYERS):
        if parts[1] in names:
            return index
    assert parts[1] in ENTRY_MODULES, f"{module}: in no layer of PLUGIN_LAYERS and not an entry module"
    return len(PLUGIN_LAYERS)


def test_every_plugin_package_has_a_layer():
    packages = {path.parent.name for path in (ROOT / PLUGIN).glob("*/__init__.py")}
    modules = {path.stem for path in (ROOT / PLUGIN).glob("*.py")} - {"__init__"}
    layered = {name for names in PLUGIN_LAYERS for name in names}
    assert packages | modules == layered | set(ENTRY_MODULES)


def test_the_plugin_packages_import_downwards():
    upward = [f"{module} imports {imported}"
              for module, imports in plugin_module_imports().items()
              for imported in sorted(imports)
              if (layer_of(module) is not None and layer_of(imported) is not None
                  and layer_of(imported) > layer_of(module))]
    assert not upward, "a plugin module imports from a higher layer:\n" + "\n".join(upward)


def test_the_plugin_modules_import_without_a_cycle():
    graph = plugin_module_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + (module,)))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            if imported != PLUGIN and not module.startswith(imported + "."):  # a package's own root
                visit(imported, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_the_layer_rule_sees_an_upward_import():
    assert layer_of("pytest_fla.targets.toolchain") < layer_of("pytest_fla.checks.generic")
    assert layer_of("pytest_fla.plugin") == len(PLUGIN_LAYERS)
    assert layer_of(PLUGIN) is None
