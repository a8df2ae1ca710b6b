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


STALE_CACHE_PROBE = '''
import contextlib, os
import torch
from kernels import _library as library
from pytest_fla.checks.torch_compile import no_persistent_compile_caches

SAVED = int(os.environ["PROBE_SAVED"])


def forward(x: torch.Tensor, *, keep, offsets):
    # SAVED = 2 keeps one more intermediate, in front (None here: a 0-d placeholder)
    return (x * 2.0,), (None,) * (SAVED - 1) + (x * 3.0,) if keep else ()


def backward(grads, saved, x, *, offsets):
    return {"x": grads[0] * 2.0 + 0.0 * saved[-1]}


op = library.register("stale_cache_probe", forward, backward, outputs=1)
x = torch.randn(3, 5, requires_grad=True)
with no_persistent_compile_caches() if os.environ["PROBE_GUARD"] == "1" else contextlib.nullcontext():
    torch.compile(lambda t: op(t)[0], fullgraph=True, dynamic=True)(x).sum().backward()
print("gradient", x.grad.sum().item())
'''


def test_the_checks_do_not_meet_a_graph_compiled_before_a_kernel_change(tmp_path):
    """An op that saves one more intermediate than when a graph of it was compiled and cached
    on disk (inductor's caches key on the custom op's schema, whose ``Tensor[]`` has no
    length): a plain compile in a new process picks the stale graph up and fails; the checks'
    compiles (``no_persistent_compile_caches``) do not."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}

    def run(saved, guard):
        return subprocess.run([sys.executable, "-c", STALE_CACHE_PROBE], capture_output=True, text=True, timeout=600,
                              env={**env, "PROBE_SAVED": str(saved), "PROBE_GUARD": str(guard)})

    first = run(1, 0)
    assert first.returncode == 0, first.stderr[-2000:]
    if run(2, 0).returncode == 0:
        pytest.skip("this torch's on-disk caches tell the op's new outputs apart: no stale graph to meet")
    guarded = run(2, 1)
    assert guarded.returncode == 0 and "gradient 30.0" in guarded.stdout, guarded.stderr[-2000:]


FIRST_CALL_COMPILED = '''
import torch
import kernels

q, k, v = (torch.randn(1, 6, 2, 16) for _ in range(3))
g = torch.nn.functional.logsigmoid(torch.randn(1, 6, 2, 16))
compiled = torch.compile(lambda *t: kernels.chunk_gla(*t)[0], fullgraph=True, dynamic=True)
torch.testing.assert_close(compiled(q, k, v, g), kernels.chunk_gla(q, k, v, g)[0])
print("same")
'''


def test_an_op_compiled_at_its_first_call_in_a_process():
    """The op's first call in a fresh process under torch.compile: a host cache filled by that
    call (the environment's keys that the input checks read, ``kernels/_arch.py``) once
    changed what the trace's own guards read, and dynamo refused the frame ("Guard failed on
    the same frame it was created")."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", FIRST_CALL_COMPILED], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0 and "same" in done.stdout, done.stderr[-3000:]
