"""The conformance suite at the path repositories import it from: ``from
pytest_fla.conformance import *`` in a test module (``docs/plugin-api.md``). The suite lives
in :mod:`pytest_fla.checks.conformance`; this module only keeps that import path."""

from .checks.conformance import *  # noqa: F401,F403
from .checks.conformance import __all__  # noqa: F401
