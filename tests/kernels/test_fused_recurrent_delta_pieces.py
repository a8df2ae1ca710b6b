"""What the generic conformance checks don't reach in the fused-recurrent delta rules.

* the backward's checkpoint boundaries: sequences ending just before, at and after a
  multiple of the checkpoint interval, with the value axis split over several programs
  (so the partial dq/dk/dbeta/dg sums are added across value blocks);
* a gate of the wrong shape is a ValueError naming ``g``, raised before any launch;
* beta = 1 with a unit key overwrites what the state recalls for that key: S_t^T k_t = v_t
  exactly, whatever the state held -- the transition I - k k^T is singular there, and the
  backward (which never inverts a step) stays right;
* the L2 norm inside the kernels, on keys and queries far from unit length;
* ``cu_seqlens_cpu`` gives the same result as ``cu_seqlens`` alone.

Under ``TRITON_INTERPRET=1`` on the CPU at small sizes, or on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference
from kernels import fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule, fused_recurrent_kda
from kernels.delta_rule.fused_recurrent import backward_config, checkpoint_interval
from pytest_fla.running.devices import numeric_device
from pytest_fla.running.launches import observe_launches
from pytest_fla.checks.tolerance import assert_close


@pytest.fixture
def device():
    return numeric_device()


def _inputs(B, T, H, HV, K, V, gen, *, gate="head", unit_k=True):
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    if unit_k:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen))
    g = None
    if gate == "head":
        g = F.logsigmoid(torch.randn(B, T, HV, generator=gen)) / 4
    elif gate == "channel":
        g = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen)) / 4
    return q, k, v, g, beta


def _grads(fn, args: dict, names, do, dht):
    leaves = {n: args[n].detach().clone().requires_grad_(True) for n in names}
    o, ht = fn(**{**args, **leaves})
    grads = torch.autograd.grad([o, ht], [leaves[n] for n in names], [do.to(o.dtype), dht.to(ht.dtype)])
    return o.detach(), ht.detach(), dict(zip(names, grads))


def _check_against_reference(op, ref, args, names, device, seed):
    """Output, final state and the gradients of ``names`` against float64 autograd."""
    gen = torch.Generator().manual_seed(seed)
    B, T, HV, V = args["v"].shape
    N = args["initial_state"].shape[0]
    K = args["q"].shape[-1]
    do = torch.randn(B, T, HV, V, generator=gen).to(device)
    dht = torch.randn(N, HV, K, V, generator=gen).to(device)
    o, ht, grads = _grads(op, args, names, do, dht)
    ref_args = {n: (a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a) for n, a in args.items()}
    ro, rht, rgrads = _grads(ref, ref_args, names, do.double(), dht.double())
    assert_close("o", o, ro, "fp32")
    assert_close("final_state", ht, rht, "fp32")
    for n in names:
        assert_close(f"d{n}", grads[n], rgrads[n], "fp32", "backward")


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_backward_across_checkpoint_boundaries(device, gate):
    """Packed sequences of C-1, C+1 and 2C+1 tokens (C = the checkpoint interval) and an
    empty one (sequences of exactly C are in the conformance packings), with the value axis
    split over several backward programs; the gated rule also maps 2 value heads to 1 key
    head, so the dq/dk partial sums add over value blocks and heads."""
    K, V, H = 128, 40, 1
    HV = 2 if gate == "head" else 1
    C = 16
    lengths = [C - 1, C + 1, 0, 2 * C + 1]
    assert checkpoint_interval(sum(lengths), len(lengths)) == C
    assert V > backward_config(K, V)[1], "the value axis must span more than one backward program"
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    T = int(cu[-1])
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta = _inputs(1, T, H, HV, K, V, gen, gate=gate if gate != "none" else None)
    h0 = torch.randn(len(lengths), v.shape[2], K, V, generator=gen)
    args = dict(q=q, k=k, v=v, beta=beta, initial_state=h0, output_final_state=True)
    if gate != "none":
        args["g"] = g
    args = {n: (a.to(device) if isinstance(a, torch.Tensor) else a) for n, a in args.items()}
    args["cu_seqlens"] = cu.to(device)
    op, ref = {
        "none": (fused_recurrent_delta_rule, reference.delta_rule),
        "head": (fused_recurrent_gated_delta_rule, reference.gated_delta_rule),
        "channel": (fused_recurrent_kda, reference.kda),
    }[gate]
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if n in args]
    _check_against_reference(op, ref, args, names, device, seed=12)


def _gate_error_cases():
    # (op, gate shape given B, T, H, HV, K) for each wrong shape
    B, T, H, HV, K = 2, 5, 2, 4, 16
    return [
        ("gated_channel_gate", fused_recurrent_gated_delta_rule, (B, T, HV, K)),
        ("gated_gate_per_qk_head", fused_recurrent_gated_delta_rule, (B, T, H)),
        ("gated_gate_short_T", fused_recurrent_gated_delta_rule, (B, T - 1, HV)),
        ("kda_head_gate", fused_recurrent_kda, (B, T, HV)),
        ("kda_gate_per_qk_head", fused_recurrent_kda, (B, T, H, K)),
    ]


@pytest.mark.parametrize("name,op,g_shape", _gate_error_cases(), ids=[c[0] for c in _gate_error_cases()])
def test_wrong_gate_shape_is_a_value_error_naming_g(device, name, op, g_shape):
    B, T, H, HV, K, V = 2, 5, 2, 4, 16, 16
    gen = torch.Generator().manual_seed(3)
    q, k, v, _, beta = _inputs(B, T, H, HV, K, V, gen, gate=None)
    g = -torch.rand(g_shape, generator=gen)
    with observe_launches() as launches:
        with pytest.raises(ValueError, match="`g`"):
            op(q.to(device), k.to(device), v.to(device), g.to(device), beta.to(device))
    assert launches.count == 0


def test_beta_one_with_unit_keys_stores_v_exactly(device):
    """(I - k k^T) S + k v^T recalls v for k, whatever S held: with q = k and scale 1,
    o_t = S_t^T k_t = v_t. The step is singular (k is in its null space), yet the backward,
    which replays states from checkpoints instead of inverting steps, matches float64."""
    B, T, H, K, V = 1, 20, 2, 16, 8
    gen = torch.Generator().manual_seed(5)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.ones(B, T, H)
    h0 = 10 * torch.randn(B, H, K, V, generator=gen)
    args = dict(q=k.clone(), k=k, v=v, beta=beta, scale=1.0, initial_state=h0, output_final_state=True)
    args = {n: (a.to(device) if isinstance(a, torch.Tensor) else a) for n, a in args.items()}
    with torch.no_grad():
        o, _ = fused_recurrent_delta_rule(**args)
    # rounding only: about 10 ulp of the state's magnitude
    assert (o.cpu() - v).abs().max().item() <= 1e-4 * h0.abs().max().item()
    _check_against_reference(fused_recurrent_delta_rule, reference.delta_rule, args,
                             ["q", "k", "v", "beta", "initial_state"], device, seed=6)


@pytest.mark.parametrize("op,ref,gate", [
    (fused_recurrent_gated_delta_rule, reference.gated_delta_rule, "head"),
    (fused_recurrent_kda, reference.kda, "channel"),
])
def test_l2norm_in_kernel_on_raw_vectors(device, op, ref, gate):
    """Queries and keys of norm far from 1 (so the normalisation's backward has a real
    1/|x| factor and projection), grouped value heads."""
    B, T, H, HV, K, V = 1, 18, 1, 2, 16, 16
    gen = torch.Generator().manual_seed(7)
    q, k, v, g, beta = _inputs(B, T, H, HV, K, V, gen, gate=gate, unit_k=False)
    h0 = torch.randn(B, HV, K, V, generator=gen)
    args = dict(q=3 * q, k=0.2 * k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True)
    args = {n: (a.to(device) if isinstance(a, torch.Tensor) else a) for n, a in args.items()}
    _check_against_reference(op, ref, args, ["q", "k", "v", "g", "beta", "initial_state"], device, seed=8)


def test_cu_seqlens_cpu_gives_the_same_result(device):
    B, T, H, HV, K, V = 1, 12, 1, 2, 16, 16
    gen = torch.Generator().manual_seed(9)
    q, k, v, g, beta = _inputs(B, T, H, HV, K, V, gen)
    cu = torch.tensor([0, 5, 5, 12])
    args = {n: a.to(device) for n, a in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    with torch.no_grad():
        o1, h1 = fused_recurrent_gated_delta_rule(**args, output_final_state=True, cu_seqlens=cu.to(device))
        o2, h2 = fused_recurrent_gated_delta_rule(**args, output_final_state=True, cu_seqlens=cu.to(device),
                                                  cu_seqlens_cpu=cu)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
