"""The session's op specs: what every ``pytest_fla_specs`` hook returned, checked once.

The conformance checks (:mod:`pytest_fla.checks.conformance`) are parametrized over
:func:`session_specs`; nothing here imports torch.
"""

from __future__ import annotations

import pytest

SPECS = pytest.StashKey[list]()


class SpecError(pytest.UsageError):
    """The registered specs contradict each other (two of one name, a dangling reference)."""


def session_specs(config) -> list:
    """The specs every ``pytest_fla_specs`` implementation returned, in hook order, less
    those that describe a reference alone (no kernel to check)."""
    if SPECS not in config.stash:
        specs = [spec for result in config.hook.pytest_fla_specs(config=config) for spec in (result or ())]
        config.stash[SPECS] = validate([spec for spec in specs if spec.op is not None])
    return config.stash[SPECS]


def validate(specs: list) -> list:
    """``specs``, or a :class:`SpecError` naming what is wrong with them."""
    names: dict = {}
    for spec in specs:
        if spec.name in names:
            raise SpecError(f"two op specs are named {spec.name!r} (families {names[spec.name]!r} and {spec.family!r})")
        names[spec.name] = spec.family
    for spec in specs:
        if spec.agrees_with is not None and spec.agrees_with not in names:
            raise SpecError(f"{spec.name}: agrees_with={spec.agrees_with!r} names no registered spec")
    return specs


def by_name(config) -> dict:
    return {spec.name: spec for spec in session_specs(config)}


def over_specs(argnames: str, params):
    """Mark a test to be parametrized over the session's specs: ``params(specs)`` returns
    its ``pytest.param`` list, built when the test is collected (the plugin's
    ``pytest_generate_tests`` does it, once the ``pytest_fla_specs`` hooks can be called)."""

    def mark(fn):
        fn.fla_parametrize = (argnames, params)
        return fn

    return mark


PARAMS = pytest.StashKey[dict]()


def params_for(config, fn) -> list:
    """The ``pytest.param`` list of a test marked with :func:`over_specs`, built once a
    session (a check imported into several modules is one function)."""
    cache = config.stash.setdefault(PARAMS, {})
    if fn not in cache:
        cache[fn] = fn.fla_parametrize[1](session_specs(config))
    return cache[fn]


def parametrize(metafunc) -> None:
    """Parametrize a test marked with :func:`over_specs` over the session's specs."""
    metafunc.parametrize(metafunc.function.fla_parametrize[0], params_for(metafunc.config, metafunc.function))


def spec_param(spec, *values, id_parts=()):
    """A ``pytest.param`` of ``spec`` and ``values`` with id ``<op>-<parts>``, marked with
    the op (a row of the report)."""
    return pytest.param(spec, *values, id="-".join([spec.name, *map(str, id_parts)]), marks=pytest.mark.fla_op(spec.name))
