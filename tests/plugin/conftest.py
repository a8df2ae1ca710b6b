"""Fixtures for the plugin's own tests (pytester projects)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


@pytest.fixture
def project(pytester):
    """A pytester project with the planted-fault kernels importable."""
    shutil.copy(HERE / "faulty_kernels.py", pytester.path / "faulty_kernels.py")
    return pytester
