"""The delta rules and the GatedDeltaNet layer at value heads of 512 through the generic
checks that read a spec's first case: packed sequences, every output and gradient
written, and (on a GPU) bitwise determinism. The conformance suite runs forward, backward
and the chunk/recurrent agreement on each op's wide-value case (``wide_values``, the
layer's ``default_head_dims``); these checks take the first case, so here each runs on
the wide-value case instead (on the GPU at its GPU dims: K = 256, V = 512)."""

from __future__ import annotations

import pytest

from pytest_fla.checks import generic
from pytest_fla.checks.generic import dtype_skip_reason, numeric_device
from pytest_fla.ops.packings import packings
from specs import all_specs

# op -> its case at value heads of 512
CASES = {
    **{op: "wide_values" for op in ("chunk_delta_rule", "chunk_gated_delta_rule", "chunk_kda",
                                    "fused_recurrent_delta_rule", "fused_recurrent_gated_delta_rule",
                                    "fused_recurrent_kda")},
    "gated_delta_net": "default_head_dims",
}
OPS = tuple(CASES)
SPECS = {spec.name: spec for spec in all_specs() if spec.name in CASES}


def _skip_unless_runs(dtype):
    reason = dtype_skip_reason(dtype, numeric_device())
    if reason:
        pytest.skip(reason)


def _varlen_params():
    return [pytest.param(op, packing, id=f"{op}-{packing.name}", marks=pytest.mark.fla_op(op))
            for op in OPS for packing in packings(SPECS[op].chunk_size or 16)]


def _op_params():
    # the op's marker: its buffers start poisoned, and the report counts the check under it
    return [pytest.param(op, id=op, marks=pytest.mark.fla_op(op)) for op in OPS]


def test_every_op_has_the_case():
    for op, case in CASES.items():
        assert SPECS[op].case(case).gpu_dims["V"] == 512, f"{op}: the {case} case's GPU dims must take V = 512"


# under the interpreter one packing, the one with sequences at and around a chunk's edges
# (a check there takes 15-80 s at V = 512); the GPU runs every packing
CPU_PACKING = "chunk_edges"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op,packing", _varlen_params())
def test_varlen(op, packing, dtype):
    _skip_unless_runs(dtype)
    if numeric_device().type != "cuda" and packing.name != CPU_PACKING:
        pytest.skip(f"the interpreter runs the {CPU_PACKING} packing at V = 512; every packing runs at the "
                    "narrower dims of the conformance suite, and at V = 512 on a GPU")
    spec = SPECS[op]
    generic.check_varlen(spec, spec.case(CASES[op]), packing, dtype, numeric_device(),
                        generic.seed_for("varlen", op, CASES[op], dtype, packing.name))


@pytest.mark.parametrize("op", _op_params())
def test_every_output_written(op):
    spec = SPECS[op]
    generic.check_every_output_written(spec, spec.case(CASES[op]), "fp32", numeric_device(),
                                      generic.seed_for("poison", op, CASES[op]))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op", _op_params())
def test_deterministic(op, dtype):
    device = numeric_device()
    if device.type != "cuda":
        pytest.skip("the interpreter runs a grid's programs one after another, so only a GPU can reorder them")
    _skip_unless_runs(dtype)
    spec = SPECS[op]
    generic.check_deterministic(spec, spec.case(CASES[op]), dtype, device, generic.seed_for("det", op, CASES[op], dtype))
