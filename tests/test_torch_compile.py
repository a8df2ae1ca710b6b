"""torch.compile over every op spec: opcheck of the custom ops, compiled == eager under
``fullgraph=True, dynamic=True`` (two lengths, one compile; varlen too), and CUDA graphs.

Ids read ``test_<check>[<op>]``. Under the interpreter the custom ops run on the CPU like
any other: inductor compiles the graph for the CPU and calls them in it, at one small
case per op. CUDA graphs need a GPU.
"""

from __future__ import annotations

import pytest
import torch

from pytest_fla import checks, compile_checks
from pytest_fla.specs import all_specs

SPECS = all_specs()


def _param(spec):
    return pytest.param(spec, id=spec.name, marks=pytest.mark.fla_op(spec.name))


@pytest.fixture
def device():
    return checks.numeric_device()


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS])
def test_opcheck(spec, device):
    checked = compile_checks.check_opcheck(spec, device, checks.seed_for("opcheck", spec.name))
    print(", ".join(checked))


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS if spec.varlen])
def test_opcheck_varlen(spec, device):
    lengths = (3, 0, 5)
    compile_checks.check_opcheck(spec, device, checks.seed_for("opcheck-varlen", spec.name), lengths=lengths)


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS])
def test_compiled_matches_eager(spec, device):
    compile_checks.check_compiled_matches_eager(spec, device, checks.seed_for("compiled", spec.name))


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS if spec.varlen])
def test_compiled_matches_eager_varlen(spec, device):
    c = spec.chunk_size or 16
    packings = ((3, c + 1, 0, 2), (c - 1, 1, 4, 5)) if device.type == "cuda" else ((3, 6, 0, 2), (5, 1, 4, 3))
    compile_checks.check_compiled_matches_eager(spec, device, checks.seed_for("compiled-varlen", spec.name),
                                                packings=packings)


@pytest.mark.parametrize("spec", [_param(spec) for spec in SPECS])
def test_cuda_graphs(spec, device):
    if device.type != "cuda":
        pytest.skip("CUDA graphs (mode='reduce-overhead') need a GPU")
    compile_checks.check_cuda_graphs(spec, device, checks.seed_for("cudagraphs", spec.name))


@pytest.mark.fla_op("fused_recurrent_delta_rule")
def test_fused_recurrent_delta_rule_dynamic_shapes(device):
    """The reported failure: ``torch.compile(fn, dynamic=True)`` around
    ``fused_recurrent_delta_rule`` raised ``InternalTorchDynamoError`` ('SymNodeVariable'
    object has no attribute 'value') while tracing the host code; the op is now one node."""
    import kernels

    torch._dynamo.reset()
    T, H, K, V = (256, 4, 64, 64) if device.type == "cuda" else (12, 2, 16, 16)

    def fn(q, k, v, beta):
        o, state = kernels.fused_recurrent_delta_rule(q, k, v, beta, output_final_state=True)
        return o.float().sum() + state.sum()

    counter = compile_checks.CountingBackend()
    compiled = torch.compile(fn, dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(0)
    for length in (T, T // 2 + 3):
        q, k, v = (torch.randn(1, length, H, d, generator=gen).to(device) for d in (K, K, V))
        k = torch.nn.functional.normalize(k, dim=-1)
        beta = torch.rand(1, length, H, generator=gen).to(device)
        leaves = [t.requires_grad_() for t in (q, k, v, beta)]
        out = compiled(*leaves)
        grads = torch.autograd.grad(out, leaves)
        eager = fn(*leaves)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        for g, e in zip(grads, torch.autograd.grad(eager, leaves)):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert counter.compiles == 1, f"{counter.compiles} compiles for two lengths under dynamic=True"
