"""The bad-input checks (error inputs, an argument on the wrong device) draw their inputs at
a case's small ``dims`` on every device. What they check, validation before any launch, does
not depend on size; at the GPU dims each error check drew its tensors on the host first
(1.6-2.0 s a check on the H100 machine: ``OpSpec.at_small_dims``)."""

from __future__ import annotations

import pytest
import torch

from pytest_fla.checks import conformance
from pytest_fla.api import Arg, Case, dtype_errors, op_spec

SMALL = {"B": 2, "T": 5, "D": 8}
LARGE = {"B": 3, "T": 7, "D": 16}  # stands for a case's GPU dims: only their difference matters here


def make_spec(shapes_seen: list):
    def scale(x, w):
        shapes_seen.append(tuple(x.shape))
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"scale: `x` has dtype {x.dtype}")
        if w.device != x.device:
            raise ValueError(f"scale: `w` is on {w.device}, `x` on {x.device}")
        return x * w

    def errors(spec, device):
        yield from dtype_errors(spec.sample(spec.cases[0], "fp32", device).kwargs, "x")

    return op_spec("scale", op=scale, reference=lambda x, w: x.double() * w.double(),
                   args={"x": Arg(("B", "T", "D")), "w": Arg(("D",))},
                   cases=(Case("state", SMALL, gpu_dims=LARGE),), errors=errors, outputs=("y",), varlen=False)


@pytest.fixture
def gpu_dims_on_the_cpu(monkeypatch):
    """A CPU run drawing a case's GPU dims, as a CUDA run does."""
    monkeypatch.setattr(Case, "dims_for", lambda self, device: self.gpu_dims or self.dims)


def test_the_stand_in_draws_the_gpu_dims(gpu_dims_on_the_cpu):
    spec = make_spec([])
    assert tuple(spec.sample(spec.cases[0], "fp32", "cpu").kwargs["x"].shape) == (3, 7, 16)


@pytest.mark.parametrize("error", ["x_float64", "x_int"])
def test_an_error_input_is_drawn_at_the_small_dims(gpu_dims_on_the_cpu, error):
    seen = []
    conformance.test_error_inputs(make_spec(seen), error, torch.device("cpu"))
    assert seen == [(2, 5, 8)]


def test_the_wrong_device_check_draws_at_the_small_dims(gpu_dims_on_the_cpu):
    seen = []
    conformance.test_device_mismatch(make_spec(seen), "w", torch.device("cpu"))
    assert seen == [(2, 5, 8)]
