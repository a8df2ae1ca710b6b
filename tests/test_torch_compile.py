"""torch.compile over every op spec (``pytest_fla.checks.torch_compile``): opcheck of the custom
ops, compiled == eager under ``fullgraph=True, dynamic=True`` at two lengths with one
compile (varlen too), and CUDA graphs on a GPU. Ids read ``test_<check>[<op>]``.
"""

import pytest
import torch

from pytest_fla.running.devices import numeric_device
from pytest_fla.checks.torch_compile import *  # noqa: F401,F403
from pytest_fla.checks.torch_compile import counting_graphs


@pytest.mark.fla_op("fused_recurrent_delta_rule")
def test_fused_recurrent_delta_rule_dynamic_shapes():
    """The reported failure: ``torch.compile(fn, dynamic=True)`` around
    ``fused_recurrent_delta_rule`` raised ``InternalTorchDynamoError`` ('SymNodeVariable'
    object has no attribute 'value') while tracing its host code; now the op is one node,
    and a second length reuses the graph."""
    import kernels

    device = numeric_device()
    T, H, K, V = (256, 4, 64, 64) if device.type == "cuda" else (12, 2, 16, 16)

    def fn(q, k, v, beta):
        return kernels.fused_recurrent_delta_rule(q, k, v, beta, output_final_state=True)

    gen = torch.Generator().manual_seed(0)
    with counting_graphs() as graphs:
        compiled = torch.compile(fn, dynamic=True)
        _two_lengths(compiled, fn, device, gen, T, H, K, V)
        assert graphs() == 1, f"{graphs()} graphs for two lengths under dynamic=True"


def _two_lengths(compiled, fn, device, gen, T, H, K, V):
    for length in (T, T // 2 + 3):
        q, k, v = (torch.randn(1, length, H, d, generator=gen).to(device) for d in (K, K, V))
        k = torch.nn.functional.normalize(k, dim=-1)
        beta = torch.rand(1, length, H, generator=gen).to(device)
        leaves = [t.requires_grad_() for t in (q, k, v, beta)]
        upstream = [torch.randn(shape, generator=gen).to(device) for shape in ((1, length, H, V), (1, H, K, V))]
        out = compiled(*leaves)
        grads = torch.autograd.grad(out, leaves, upstream)
        eager = fn(*leaves)
        for c, e in zip(out, eager):
            torch.testing.assert_close(c, e, rtol=0, atol=0)
        for g, e in zip(grads, torch.autograd.grad(eager, leaves, upstream)):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
