"""The toolchain a run uses, against the one the project is tested on.

The tested range of torch and Triton is stated once, in ``pyproject.toml``'s
``dependencies``; this module reads it from there (a source checkout) or from the
installed package's metadata, and the plugin's header says whether the installed
versions are inside it. It also owns what Triton's CPU interpreter cannot check.

Nothing here imports torch or triton: versions come from package metadata.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

DISTRIBUTION = "pytest-fla"
TESTED = ("torch", "triton")
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _requirements() -> list[str]:
    """The project's dependency strings: this checkout's ``pyproject.toml``, else the
    installed distribution's metadata (an installed wheel has no pyproject.toml)."""
    if PYPROJECT.is_file() and sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads(PYPROJECT.read_text()).get("project", {})
        if project.get("name") == DISTRIBUTION:
            return list(project.get("dependencies", []))
    try:
        return [r for r in metadata.requires(DISTRIBUTION) or [] if "extra ==" not in r]
    except metadata.PackageNotFoundError:
        return []


def tested_ranges() -> dict[str, SpecifierSet]:
    """``{"torch": SpecifierSet(...), "triton": ...}``: the versions the project is tested on."""
    ranges = {}
    for text in _requirements():
        requirement = Requirement(text)
        if requirement.name in TESTED:
            ranges[requirement.name] = requirement.specifier
    return ranges


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def in_range(version: str, specifier: SpecifierSet) -> bool:
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def range_text(specifier: SpecifierSet) -> str:
    """``>=3.6,<3.10``: lower bounds first."""
    return ",".join(sorted(map(str, specifier), key=lambda s: (not s.startswith(">"), s)))


def header_line() -> str:
    """``fla toolchain: Triton 3.9.0 (tested: >=3.6,<3.10), torch 2.13.0 (tested: ...)``;
    a version outside its tested range says so."""
    ranges = tested_ranges()
    parts = []
    for name, label in (("triton", "Triton"), ("torch", "torch")):
        version = installed_version(name)
        specifier = ranges.get(name)
        if version is None:
            parts.append(f"{label} not installed")
        elif specifier is None:
            parts.append(f"{label} {version} (no tested range stated)")
        elif in_range(version, specifier):
            parts.append(f"{label} {version} (tested: {range_text(specifier)})")
        else:
            parts.append(f"{label} {version} (OUTSIDE the tested range {range_text(specifier)})")
    return "fla toolchain: " + ", ".join(parts)


# Measured on Triton 3.6.0, 3.7.1, 3.8.0 and 3.9.0: the interpreter keeps bf16 values as their
# bit patterns and computes on those (``tl.dot`` operands, elementwise sums and products
# alike), and rounds float -> bf16 conversions toward zero. So a kernel with no ``tl.dot``
# is wrong in bf16 too: the reason names all of it. ``tests/plugin/test_toolchain.py``
# re-measures each on the installed Triton, so that a release that fixes them lifts the skip.
INTERPRETER_BF16 = (
    "Triton {version}'s interpreter computes bf16 on raw bits (tl.dot operands, elementwise sums "
    "and products) and rounds float32 -> bf16 toward zero (every Triton from 3.6 to 3.9); bf16 is "
    "checked on the GPU, or here under --fla-bf16-emulated"
)


def interpreter_skip_reason(dtype: str) -> str | None:
    """Why ``dtype`` can't be checked under Triton's CPU interpreter (None when it can:
    bf16 where this process's interpreter has the GPU's bf16 arithmetic, ``--fla-bf16-emulated``)."""
    if dtype == "bf16":
        emulation = sys.modules.get(f"{__package__}.interpreter_bf16")
        if emulation is not None and emulation.INSTALLED:
            return None
        return INTERPRETER_BF16.format(version=installed_version("triton"))
    return None
