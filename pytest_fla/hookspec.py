"""The hooks pytest-fla adds, for a repository (or a plugin) to describe its ops.

Implement them in a ``conftest.py`` or in a plugin module, like any pytest hook::

    def pytest_fla_specs(config):
        from mylib_specs import SPECS
        return SPECS

The plugin registers these specifications at start-up (``pytest_addhooks``); pytest
checks every implementation's signature against them. Usage: ``docs/plugin-api.md``.
"""

from __future__ import annotations

import pytest



@pytest.hookspec
def pytest_fla_specs(config):
    """Return the op specs this repository checks (an iterable of
    ``pytest_fla.api.OpSpec``), or None.

    Called once per session, at the first collection that needs the specs; the results
    of every implementation are concatenated, in pytest's hook order. Spec names must be
    unique across them. ``config.getoption("fla_impl")`` is the ``--fla-impl`` value
    (None unless given), for a repository that can check more than one implementation
    of its ops.
    """
