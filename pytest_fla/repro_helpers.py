"""Helpers for reproducer code at the path reproducers import them from
(``pytest_fla.repro_helpers.session_device()``, ``docs/plugin-api.md``). They live in
:mod:`pytest_fla.repro.session`; this module only keeps that import path."""

from .repro.session import other_device, session_device, target_arch  # noqa: F401
from .repro.shrink import rerun_check  # noqa: F401
