"""The per-arch compile check at the path repositories import it from: ``from
pytest_fla.compile_check import test_compile`` in a test module (``docs/plugin-api.md``). The
check lives in :mod:`pytest_fla.checks.compile_per_arch`; this module only keeps that path."""

from .checks.compile_per_arch import test_compile  # noqa: F401
