"""The conformance suite: every generic check over every op spec.

Ids read ``test_<check>[<op>-<dtype>-<case>]``. Numeric checks run on the GPU, or on the
CPU under ``TRITON_INTERPRET=1`` at the cases' small sizes.
"""

from __future__ import annotations

import pytest
import torch

from pytest_fla import checks, gpu_share
from pytest_fla.packings import packings
from pytest_fla.specs import all_specs

SPECS = all_specs()
BY_NAME = {spec.name: spec for spec in SPECS}
DTYPES = ("fp32", "bf16", "fp16")


def _param(spec, *values, id_parts=()):
    return pytest.param(spec, *values, id="-".join([spec.name, *map(str, id_parts)]), marks=pytest.mark.fla_op(spec.name))


def _case_params(check: str, dtypes=DTYPES, where=lambda spec: True):
    return [
        _param(spec, dtype, case, id_parts=(dtype, case.name))
        for spec in SPECS
        if where(spec)
        for dtype in dtypes
        for case in spec.cases
        if case.checks is None or check in case.checks
    ]


@pytest.fixture
def device(request):
    device = checks.numeric_device()
    dtype = request.node.callspec.params.get("dtype") if hasattr(request.node, "callspec") else None
    reason = dtype and checks.dtype_skip_reason(dtype, device)
    if reason:
        pytest.skip(reason)
    if device.type != "cuda":
        yield device
        return
    # Side by side with the other workers' checks on this GPU; the few that need most of
    # its memory hold it alone (checks.device_exclusive) and wait for these to finish.
    with gpu_share.for_device(device).shared():
        yield device


@pytest.mark.parametrize("spec,dtype,case", _case_params("forward"))
def test_forward(spec, dtype, case, device):
    checks.check_forward(spec, case, dtype, device, checks.seed_for(spec.name, dtype, case.name))


@pytest.mark.parametrize("spec,dtype,case", _case_params("backward"))
def test_backward(spec, dtype, case, device):
    seed = checks.seed_for("backward", spec.name, dtype, case.name)
    checks.check_backward(spec, spec.sample(case, dtype, device, seed), dtype, seed)


@pytest.mark.parametrize(
    "spec,dtype,packing",
    [
        _param(spec, dtype, packing, id_parts=(dtype, packing.name, str(packing.index_dtype).replace("torch.", "")))
        for spec in SPECS
        if spec.varlen
        for dtype in ("fp32", "bf16")
        for packing in packings(spec.chunk_size or 16)
    ],
)
def test_varlen(spec, dtype, packing, device):
    case = spec.cases[0]
    checks.check_varlen(spec, case, packing, dtype, device, checks.seed_for("varlen", spec.name, dtype, packing.name))


@pytest.mark.parametrize(
    "spec,dtype,case",
    _case_params("agreement", ("fp32", "bf16"), where=lambda spec: spec.agrees_with is not None),
)
def test_chunk_vs_recurrent(spec, dtype, case, device):
    other = BY_NAME[spec.agrees_with]
    checks.check_agreement(spec, other, case, dtype, device, checks.seed_for("agree", spec.name, dtype, case.name))


def _error_params():
    params = []
    for spec in SPECS:
        if spec.errors is None:
            continue
        for error in spec.errors(spec, torch.device("cpu")):
            params.append(_param(spec, error.name, id_parts=(error.name,)))
    return params


@pytest.mark.parametrize("spec,error_name", _error_params())
def test_error_inputs(spec, error_name, device):
    error = next(e for e in spec.errors(spec, device) if e.name == error_name)
    checks.check_error_input(spec, error, device)


def _mismatch_params():
    params = []
    for spec in SPECS:
        case = spec.cases[0]
        sample = spec.sample(case, "fp32", "cpu", lengths=(3, 4) if spec.varlen else None)
        for name in sample.tensors():
            params.append(_param(spec, name, id_parts=(name,)))
    return params


@pytest.mark.parametrize("spec,arg", _mismatch_params())
def test_device_mismatch(spec, arg, device):
    from pytest_fla.specs.common import wrong_device

    sample = spec.sample(spec.cases[0], "fp32", device, lengths=(3, 4) if spec.varlen else None)
    sample.kwargs[arg] = sample.kwargs[arg].to(wrong_device(device))
    checks.check_error_input(spec, _Expected(sample.kwargs, ValueError, f"`{arg}`.* on |on .*`{arg}`"), device)


class _Expected:
    def __init__(self, kwargs, error, match):
        self.kwargs, self.error, self.match = kwargs, error, match


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS])
def test_every_output_written(spec, device):
    checks.check_every_output_written(spec, spec.cases[0], "fp32", device, checks.seed_for("poison", spec.name))


@pytest.mark.parametrize(
    "spec,dtype", [_param(spec, dtype, id_parts=(dtype,)) for spec in SPECS if spec.deterministic for dtype in ("fp32", "bf16")]
)
def test_deterministic(spec, dtype, device):
    if device.type != "cuda":
        pytest.skip("the interpreter runs a grid's programs one after another, so only a GPU can reorder them")
    checks.check_deterministic(spec, spec.cases[0], dtype, device, checks.seed_for("det", spec.name, dtype))


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS if spec.huge_grid is not None])
def test_huge_grid(spec, device):
    checks.check_huge_grid(spec, "bf16" if device.type == "cuda" else "fp32", device, checks.seed_for("huge", spec.name))


@pytest.mark.large_memory
@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS if spec.huge_grid is not None])
def test_int64_offsets(spec, device):
    if device.type != "cuda":
        pytest.skip("needs a GPU: tensors over 2**31 elements")
    total = torch.cuda.get_device_properties(device).total_memory  # not the free memory: other checks come and go
    if total < 48 * 2**30:
        pytest.skip(f"needs about 48 GiB of GPU memory for tensors over 2**31 elements, the GPU has {total / 2**30:.0f} GiB")
    checks.check_int64_offsets(spec, device, checks.seed_for("int64", spec.name))


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS if spec.varlen])
def test_no_host_sync(spec, device):
    if device.type != "cuda":
        pytest.skip("device-to-host syncs exist only with a GPU")
    checks.check_no_host_sync(spec, device, checks.seed_for("sync", spec.name))
