"""A project inside the project (``pytest_fla.collection.projects``), and the example package run the
way its README says: ``pytest`` in its directory, from a checkout with nothing installed
but the plugin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from plugin_testing import cpu_only, run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "token_cumsum"
PYPROJECT = '[tool.pytest.ini_options]\ntestpaths = ["."]\n'


def _pytest_command() -> list[str]:
    """The ``pytest`` console script beside this interpreter (what a README's ``pytest``
    runs): unlike ``python -m pytest`` it puts no working directory on the import path."""
    script = Path(sys.executable).with_name("pytest")
    return [str(script)] if script.exists() else [sys.executable, "-c", "import sys, pytest; sys.exit(pytest.console_main())"]


@cpu_only
def test_the_example_package_passes_with_pytest_in_its_directory(tmp_path):
    checkout = tmp_path / "token_cumsum"
    shutil.copytree(EXAMPLE, checkout, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    # the plugin from this checkout, as an install would give it; the example's package is not
    # on the path: its pyproject's `pythonpath` and the repro child's path must find it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run([*_pytest_command(), "-p", "no:randomly", "-p", "no:cacheprovider", "-rA"],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=540)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert re.search(r"PASSED \S*/cu_seqlens_past_T\.py::cu_seqlens_past_T", out), out[-4000:]  # its repro
    assert "PASSED tests/test_conformance.py::test_forward[token_cumsum-fp32-state]" in out, out[-4000:]


@cpu_only
def test_a_project_inside_the_run_is_refused_with_how_to_run_it(pytester):
    pytester.makefile(".toml", pyproject=PYPROJECT)
    inner = pytester.mkpydir("examples") / "inner"
    inner.mkdir()
    (inner / "pyproject.toml").write_text(PYPROJECT)
    (inner / "test_inner.py").write_text("def test_inner():\n    pass\n")
    pytester.makepyfile(test_outer="def test_outer():\n    pass\n")

    result = run(pytester, "examples")
    message = result.stdout.str() + result.stderr.str()
    assert result.ret != 0
    assert "examples/inner is a project of its own (pyproject.toml configures pytest there" in message, message
    assert "`cd examples/inner && pytest`" in message, message
    # named alone, pytest reads its own configuration and runs it; the outer project still runs
    run(pytester, "examples/inner").assert_outcomes(passed=1)
    run(pytester, "test_outer.py").assert_outcomes(passed=1)


@cpu_only
def test_a_directory_without_its_own_configuration_is_collected(pytester):
    pytester.makefile(".toml", pyproject=PYPROJECT)
    sub = pytester.mkdir("sub")
    (sub / "pyproject.toml").write_text('[project]\nname = "sub"\n')  # no [tool.pytest.ini_options]
    (sub / "test_sub.py").write_text("def test_sub():\n    pass\n")
    run(pytester, "sub").assert_outcomes(passed=1)


@cpu_only
def test_pytest_examples_from_the_repository_root_is_refused():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "examples"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "examples/token_cumsum is a project of its own" in run.stdout + run.stderr
    assert "tests/test_conformance.py::test_forward" not in run.stdout  # nothing of it was collected
