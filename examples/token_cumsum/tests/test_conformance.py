"""Every generic check of pytest-fla over this package's specs (conftest.py)."""

from pytest_fla.conformance import *  # noqa: F401,F403
