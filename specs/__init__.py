"""The op specs of this repository's kernels: every module in this package with a
``SPECS`` list is a family's specs, found by name (a new family adds its module and
nothing else).

This repo's ``conftest.py`` hands them to the plugin through the ``pytest_fla_specs``
hook, the same way another repository registers its own (``docs/plugin-api.md``).
Modules whose name starts with ``_``, ``common`` (shared pieces) and ``peer`` (these specs
with the peer library's kernels, ``--fla-impl=fla``) hold no family's specs.
"""

from __future__ import annotations

import importlib
import pkgutil

from pytest_fla.api import OpSpec

NOT_FAMILIES = ("common", "peer")


def family_modules() -> tuple[str, ...]:
    """The spec modules of this package, sorted by name."""
    return tuple(sorted(
        info.name for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_") and info.name not in NOT_FAMILIES
    ))


# Kept for code that reads the family list; derived, never edited by hand.
FAMILY_MODULES = family_modules()


def all_specs() -> list[OpSpec]:
    """Every spec with a kernel, family by family."""
    return [spec for spec in _every_spec() if spec.op is not None]


def reference_specs() -> list[OpSpec]:
    """One spec per reference function: the first kernel spec that checks it, or a spec
    describing the reference alone (``op=None``) while its kernel is not written."""
    chosen: dict[str, OpSpec] = {}
    every = _every_spec()
    for spec in sorted(every, key=lambda s: s.op is None):  # kernel specs first
        chosen.setdefault(_reference_name(spec), spec)
    return list(chosen.values())


def spec_by_name(name: str) -> OpSpec:
    for spec in all_specs():
        if spec.name == name:
            return spec
    raise KeyError(f"no op spec named {name!r}")


def _every_spec() -> list[OpSpec]:
    specs: list[OpSpec] = []
    for module in family_modules():
        specs.extend(getattr(importlib.import_module(f"{__name__}.{module}"), "SPECS", ()))
    return specs


def _reference_name(spec: OpSpec) -> str:
    """The reference function's own name (``reference.simple_gla`` and
    ``reference.linear.simple_gla`` are one function)."""
    fn = spec.reference_fn
    return f"{fn.__module__}.{fn.__qualname__}"
