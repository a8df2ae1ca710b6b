"""The registry of op specs: one module per op family, each with a ``SPECS`` list."""

from __future__ import annotations

import importlib

from ..spec import OpSpec

# Families in the order they appear in reports.
FAMILY_MODULES = (
    "simple_gla",
    "gla",
    "modules",
    "delta_rule",
    "delta_rule_recurrent",
    "hgrn",
    "rwkv6",
)


def all_specs() -> list[OpSpec]:
    specs: list[OpSpec] = []
    for module in FAMILY_MODULES:
        specs.extend(importlib.import_module(f"{__name__}.{module}").SPECS)
    return specs


def spec_by_name(name: str) -> OpSpec:
    for spec in all_specs():
        if spec.name == name:
            return spec
    raise KeyError(f"no op spec named {name!r}")
