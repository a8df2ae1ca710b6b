"""The conformance suite: every generic check over every op spec of the session.

A repository gets these tests by importing them into one of its test modules, and the
per-arch compile checks likewise from :mod:`pytest_fla.compile_check`::

    # tests/test_conformance.py
    from pytest_fla.conformance import *  # noqa: F401,F403

    # tests/test_compile.py
    from pytest_fla.compile_check import test_compile  # noqa: F401

and registering its specs with the ``pytest_fla_specs`` hook (``docs/plugin-api.md``).
Each test is parametrized at collection over the specs the hook returned (the plugin's
``pytest_generate_tests`` reads :func:`over_specs`' marks), with ids
``test_<check>[<op>-<dtype>-<case>]``. Numeric checks run on the GPU, or on the CPU
under ``TRITON_INTERPRET=1`` at the cases' small sizes.
"""

from __future__ import annotations

import pytest

from . import generic
from ..ops.registry import over_specs, spec_param

DTYPES = ("fp32", "bf16", "fp16")

__all__ = [
    "test_forward",
    "test_backward",
    "test_varlen",
    "test_state_dtype",
    "test_chunk_vs_recurrent",
    "test_error_inputs",
    "test_device_mismatch",
    "test_every_output_written",
    "test_in_bounds",
    "test_deterministic",
    "test_huge_grid",
    "test_int64_offsets",
    "test_no_host_sync",
]


def case_params(check: str, dtypes=DTYPES, where=lambda spec: True):
    """``(spec, dtype, case)`` for every case of every spec that runs ``check``."""

    def params(specs):
        return [
            spec_param(spec, dtype, case, id_parts=(dtype, case.name))
            for spec in specs
            if where(spec)
            for dtype in dtypes
            for case in spec.cases
            if case.checks is None or check in case.checks
        ]

    return params


def one_per_spec(where=lambda spec: True):
    def params(specs):
        return [spec_param(spec) for spec in specs if where(spec)]

    return params


@over_specs("spec,dtype,case", case_params("forward"))
def test_forward(spec, dtype, case, fla_device):
    generic.check_forward(spec, case, dtype, fla_device, generic.seed_for(spec.name, dtype, case.name))


@over_specs("spec,dtype,case", case_params("backward", where=lambda spec: bool(spec.grads)))
def test_backward(spec, dtype, case, fla_device):
    seed = generic.seed_for("backward", spec.name, dtype, case.name)
    generic.check_backward(spec, spec.sample(case, dtype, fla_device, seed), dtype, seed)


def _varlen_params(specs):
    from ..ops.packings import packings

    return [
        spec_param(spec, dtype, packing, id_parts=(dtype, packing.name, str(packing.index_dtype).replace("torch.", "")))
        for spec in specs
        if spec.varlen
        for dtype in ("fp32", "bf16")
        for packing in packings(spec.chunk_size or 16)
    ]


@over_specs("spec,dtype,packing", _varlen_params)
def test_varlen(spec, dtype, packing, fla_device):
    case = spec.cases[0]
    generic.check_varlen(spec, case, packing, dtype, fla_device, generic.seed_for("varlen", spec.name, dtype, packing.name))


def _state_dtype_params(specs):
    return [
        spec_param(spec, dtype, state_dtype, id_parts=(dtype, f"state_{state_dtype}"))
        for spec in specs
        if "initial_state" in spec.args
        for dtype in ("fp32", "bf16")
        for state_dtype in spec.state_dtypes
    ]


@over_specs("spec,dtype,state_dtype", _state_dtype_params)
def test_state_dtype(spec, dtype, state_dtype, fla_device):
    """An initial state in bf16 or fp16 (``OpSpec.state_dtypes``), against the reference."""
    generic.check_state_dtype(spec, dtype, state_dtype, fla_device, generic.seed_for("state", spec.name, dtype, state_dtype))


@over_specs("spec,dtype,case", case_params("agreement", ("fp32", "bf16"), where=lambda spec: spec.agrees_with is not None))
def test_chunk_vs_recurrent(spec, dtype, case, fla_device, request):
    from ..ops.registry import by_name

    other = by_name(request.config)[spec.agrees_with]
    generic.check_agreement(spec, other, case, dtype, fla_device, generic.seed_for("agree", spec.name, dtype, case.name))


def _error_params(specs):
    import torch

    return [
        spec_param(spec, error.name, id_parts=(error.name,))
        for spec in specs
        if spec.errors is not None
        for error in spec.errors(spec, torch.device("cpu"))
    ]


@over_specs("spec,error_name", _error_params)
def test_error_inputs(spec, error_name, fla_device):
    small = spec.at_small_dims()
    error = next(e for e in small.errors(small, fla_device) if e.name == error_name)
    generic.check_error_input(spec, error, fla_device)


def _mismatch_lengths(spec):
    return (3, 4) if spec.varlen else None


def _mismatch_params(specs):
    params = []
    for spec in specs:
        tensors = spec.sample(spec.cases[0], "fp32", "cpu", lengths=_mismatch_lengths(spec)).tensors()
        if len(tensors) > 1:  # one tensor alone is on no other tensor's device
            params += [spec_param(spec, name, id_parts=(name,)) for name in tensors]
    return params


@over_specs("spec,arg", _mismatch_params)
def test_device_mismatch(spec, arg, fla_device):
    import torch

    from ..ops.error_inputs import wrong_device
    from ..ops.spec import ErrorInput

    small = spec.at_small_dims()
    sample = small.sample(small.cases[0], "fp32", fla_device, lengths=_mismatch_lengths(spec))
    others = torch.device(fla_device)
    moved_to = wrong_device(others)
    sample.kwargs[arg] = sample.kwargs[arg].to(moved_to)
    expected = ErrorInput(f"{arg}_wrong_device", sample.kwargs, ValueError, f"`{arg}`.* on |on .*`{arg}`",
                          what=f"`{arg}` moved to {moved_to.type}, the other tensors on {others}")
    generic.check_error_input(spec, expected, fla_device)


@over_specs("spec", one_per_spec())
def test_every_output_written(spec, fla_device):
    generic.check_every_output_written(spec, spec.cases[0], "fp32", fla_device, generic.seed_for("poison", spec.name))


@over_specs("spec,dtype,case", case_params("in_bounds", dtypes=("fp32", "bf16")))
def test_in_bounds(spec, dtype, case, fla_device):
    generic.check_in_bounds(spec, case, dtype, fla_device, generic.seed_for("bounds", spec.name, dtype, case.name))


def _deterministic_params(specs):
    return [spec_param(spec, dtype, id_parts=(dtype,)) for spec in specs if spec.deterministic for dtype in ("fp32", "bf16")]


@over_specs("spec,dtype", _deterministic_params)
def test_deterministic(spec, dtype, fla_device):
    if fla_device.type != "cuda":
        pytest.skip("the interpreter runs a grid's programs one after another, so only a GPU can reorder them")
    generic.check_deterministic(spec, spec.cases[0], dtype, fla_device, generic.seed_for("det", spec.name, dtype))


# Under compute-sanitizer a launch of over 65535 programs ran for minutes (parallel_attn's:
# still running after 285 s on the H100, with one core and 1-3% of the GPU busy). Its plain
# run checks the large grid; the tools check every kernel at the small shapes.
HUGE_GRID_PLAIN_ONLY = ("a launch of over 65535 programs runs for minutes under the tool; "
                        "its plain run checks the grid")


@pytest.mark.fla_plain_only(reason=HUGE_GRID_PLAIN_ONLY)
@over_specs("spec", one_per_spec(lambda spec: spec.huge_grid is not None))
def test_huge_grid(spec, fla_device):
    generic.check_huge_grid(spec, "bf16" if fla_device.type == "cuda" else "fp32", fla_device, generic.seed_for("huge", spec.name))


# The smallest GPU the 2**31-element case is tried on (the check then measures its own
# need and skips, with the numbers, where it does not fit).
INT64_MIN_BYTES = 48 * 2**30


@pytest.mark.large_memory
@over_specs("spec", one_per_spec(lambda spec: spec.int64_dims is not None))
def test_int64_offsets(spec, fla_device):
    import torch

    if fla_device.type != "cuda":
        pytest.skip("needs a GPU: tensors over 2**31 elements")
    total = torch.cuda.get_device_properties(fla_device).total_memory  # not the free memory: other checks come and go
    if total < INT64_MIN_BYTES:
        pytest.skip(f"needs about {INT64_MIN_BYTES >> 30} GiB of GPU memory for tensors over 2**31 elements, "
                    f"the GPU has {total / 2**30:.0f} GiB")
    generic.check_int64_offsets(spec, fla_device, generic.seed_for("int64", spec.name))


@over_specs("spec", one_per_spec(lambda spec: spec.varlen))
def test_no_host_sync(spec, fla_device):
    if fla_device.type != "cuda":
        pytest.skip("device-to-host syncs exist only with a GPU")
    generic.check_no_host_sync(spec, fla_device, generic.seed_for("sync", spec.name))
