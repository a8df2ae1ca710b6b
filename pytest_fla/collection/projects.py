"""Projects inside the run's project: a directory below the rootdir with its own pytest
configuration (an example package checked by the plugin, with its own specs, ini options
and import path).

Collected from the outer project, such a directory would get the outer ``conftest.py``'s
op specs in its test modules and none of its own settings (``fla_poison``,
``pythonpath``): every check of the outer specs would run again there, and its own could
not import its package. The plugin refuses to collect it and says how to run it: from its
own directory, or named alone on the command line (pytest then reads its configuration).
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

# The files pytest reads its configuration from, in its order (pytest's "Configuration").
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def pytest_config_file(directory: Path) -> Path | None:
    """The file that configures pytest in ``directory`` itself, or None."""
    for name in CONFIG_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name in ("pytest.ini", ".pytest.ini"):
            return path
        if name == "pyproject.toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10: pytest's own dependency reads TOML there
                import tomli as tomllib

            with open(path, "rb") as f:
                if "ini_options" in tomllib.load(f).get("tool", {}).get("pytest", {}):
                    return path
            continue
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path)
        except configparser.Error:
            continue
        if parser.has_section("pytest" if name == "tox.ini" else "tool:pytest"):
            return path
    return None


def refuse_nested_project(directory: Path, config) -> None:
    """A ``pytest.UsageError`` when ``directory`` lies below the run's rootdir and
    configures pytest itself (see the module docstring)."""
    directory = Path(directory)
    rootdir = Path(config.rootpath)
    if directory == rootdir or rootdir not in directory.parents:
        return
    own = pytest_config_file(directory)
    if own is None:
        return
    where = directory.relative_to(Path.cwd()) if Path.cwd() in directory.parents else directory
    raise pytest.UsageError(
        f"{where} is a project of its own ({own.name} configures pytest there: its op specs, ini "
        f"options and import path), inside this run's project ({rootdir}); collected from here it would "
        f"get this project's specs and not its settings. Run it on its own: `pytest {where}` or "
        f"`cd {where} && pytest`.")
