"""Repo-level test setup: this repository's op specs, handed to the plugin through the
``pytest_fla_specs`` hook, the way any repository hands over its own
(``docs/plugin-api.md``).

``--fla-impl`` picks whose kernels the specs call: ``kernels`` (this repo's, the
default) or ``fla`` (the peer library, fla-core: ``specs/peer.py``).
"""

import pytest

IMPLEMENTATIONS = ("kernels", "fla")


def pytest_fla_specs(config):
    impl = config.getoption("fla_impl") or "kernels"
    if impl == "kernels":
        from specs import all_specs

        return all_specs()
    if impl == "fla":
        from specs.peer import peer_specs

        return peer_specs()
    raise pytest.UsageError(f"--fla-impl={impl}: this repository checks {' or '.join(IMPLEMENTATIONS)}")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # fla-core allocates with torch.empty and has none of the switches this repo's kernels
    # offer (the ini's settings, pyproject.toml): torch's allocators for its run, no flags
    if config.getoption("fla_impl") == "fla":
        from pytest_fla.checks import poison, switches

        poison.configure(["torch"])
        switches.configure(switches.ZERO_ALLOCATIONS, ["torch"])
        switches.configure(switches.CAPTURING_LAUNCHES, [])
        switches.configure(switches.CLEAR_CACHES, [])
        switches.configure(switches.THROUGH_CUSTOM_OPS, [])
        switches.export()
