"""One registry: every op the kernel package exports has a spec, and the specs hold
together (unique names, agreement partners that exist, references that resolve)."""

from __future__ import annotations

import inspect

import pytest

import kernels
from pytest_fla.ops.registry import SpecError, validate
from specs import all_specs, family_modules

# Public names of `kernels` that are not ops of their own, and what checks them instead.
NOT_OPS = {
    "RotaryEmbedding": "a module holding apply_rotary's arguments (tests/kernels/test_modules.py)",
}


def exported_ops() -> dict:
    """``kernels.__all__`` where it is declared, else every public callable of the package."""
    names = getattr(kernels, "__all__", None) or [n for n in dir(kernels) if not n.startswith("_")]
    return {name: getattr(kernels, name) for name in names
            if callable(getattr(kernels, name)) and not inspect.ismodule(getattr(kernels, name))}


def test_every_exported_op_has_a_spec():
    checked = {id(spec.op_fn) for spec in all_specs()}
    missing = [name for name, fn in exported_ops().items() if id(fn) not in checked and name not in NOT_OPS]
    assert not missing, (
        f"kernels exports {missing} but no op spec calls them: add a spec module in specs/ "
        "(see docs/plugin-api.md), or list the name in NOT_OPS with what checks it"
    )


def test_exemptions_are_still_exported():
    stale = [name for name in NOT_OPS if name not in exported_ops()]
    assert not stale, f"NOT_OPS lists names kernels no longer exports: {stale}"


def test_every_spec_module_is_found():
    modules = family_modules()
    assert {"delta_rule", "gla", "modules", "simple_gla"} <= set(modules)
    assert "common" not in modules


def test_specs_resolve_and_hold_together():
    specs = validate(all_specs())
    for spec in specs:
        assert callable(spec.op_fn) and callable(spec.reference_fn), spec.name
        assert spec.cases, f"{spec.name} has no case"


def test_two_specs_of_one_name_are_refused():
    spec = all_specs()[0]
    with pytest.raises(SpecError, match=f"two op specs are named {spec.name!r}"):
        validate([spec, spec])


def test_an_agreement_partner_must_exist():
    import dataclasses

    spec = dataclasses.replace(all_specs()[0], agrees_with="no_such_op")
    with pytest.raises(SpecError, match="no_such_op"):
        validate([spec])


def test_the_memcheck_halves_cover_every_op_once():
    """``benchmarks/gpu_plugin_checks.sh``'s ``part_a`` and ``part_b`` (memcheck over every
    op in two device calls): a new op must land in one of them, and in one only."""
    import pathlib
    import re

    script = (pathlib.Path(__file__).parents[1] / "benchmarks" / "gpu_plugin_checks.sh").read_text()
    parts = {name: ops.split(",") for name, ops in re.findall(r"^\s*(part_[ab])\) OPS=([\w,]+) ;;$", script, re.M)}
    assert set(parts) == {"part_a", "part_b"}, parts.keys()
    listed = parts["part_a"] + parts["part_b"]
    names = sorted(spec.name for spec in all_specs() if spec.op is not None)
    assert sorted(listed) == names, (sorted(set(names) - set(listed)), sorted(set(listed) - set(names)))
