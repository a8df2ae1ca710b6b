"""HGRN pieces the generic checks do not reach: the tile scan against a step-by-step
float64 loop, the chunk maps and the states entering every chunk (forward and backward,
over several blocks of the carry pass), extreme decay, and a gate dtype other than x's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import reference
from kernels import chunk_hgrn, fused_recurrent_hgrn
from kernels._arch import is_interpreter
from kernels.hgrn import chunk as hgrn_chunk
from kernels.hgrn.scan import affine_scan
from pytest_fla.checks.tolerance import assert_close

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _inputs(B, T, D, normalizer=8.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, D, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, D, generator=gen)) / normalizer
    return x.to(_device()), g.to(_device())


@triton.jit
def _scan_kernel(a, b, out_a, out_b, BT: tl.constexpr, BD: tl.constexpr):
    offs = tl.arange(0, BT)[:, None] * BD + tl.arange(0, BD)[None, :]
    pa, pb = affine_scan(tl.load(a + offs), tl.load(b + offs), BT, BD)
    tl.store(out_a + offs, pa)
    tl.store(out_b + offs, pb)


def _entering(passes):
    """(the states entering the chunks, the final state) from ``_scan_passes``'s (maps, final):
    the entering states are the third plane of the maps buffer."""
    maps, final = passes
    return maps[2], final


@pytest.mark.parametrize("BT", [2, 32, 64])
def test_affine_scan_is_the_step_by_step_recurrence(BT):
    """Row i: (prod_{s <= i} a_s, h_i) with h_i = a_i h_{i-1} + b_i from h = 0, decays
    down to e^{-100} included."""
    gen = torch.Generator().manual_seed(1)
    a = torch.exp(F.logsigmoid(torch.randn(BT, 16, generator=gen)) / 0.05)
    b = torch.randn(BT, 16, generator=gen)
    out_a, out_b = (torch.empty(BT, 16, device=_device()) for _ in range(2))
    _scan_kernel[(1,)](a.to(_device()), b.to(_device()), out_a, out_b, BT=BT, BD=16)
    h = torch.zeros(16, dtype=torch.float64)
    p = torch.ones(16, dtype=torch.float64)
    for i in range(BT):
        h = a[i].double() * h + b[i].double()
        p = p * a[i].double()
        assert torch.allclose(out_b[i].cpu().double(), h, rtol=1e-6, atol=1e-6), i
        # products below fp32's normal range (1.2e-38) keep fewer digits
        assert torch.allclose(out_a[i].cpu().double(), p, rtol=1e-5, atol=1e-37), i


@pytest.mark.parametrize("reverse", [False, True])
def test_states_entering_every_chunk(reverse):
    """The carry pass, in blocks of 4 chunk maps (so one sequence spans several blocks):
    forward, the state entering each chunk is the float64 recurrence's state there;
    backward, the carry into each chunk from the right is e^{g} dh of the next chunk's
    first token (dh from float64 autograd), and the last one is the initial state's."""
    B, T, D = 2, 330, 40
    x, g = _inputs(B, T, D, normalizer=4.0, seed=2)
    h0 = torch.randn(B, D, generator=torch.Generator().manual_seed(3)).to(_device())
    lay = hgrn_chunk._Layout(x, None, None, NC=4)
    BT = hgrn_chunk.BT
    NT = -(-T // BT)
    if not reverse:
        counters = lay.counters(x.device)
        carry_in, final = _entering(hgrn_chunk._scan_passes(x, g, h0, torch.float32, lay, False, counters))
        ref_o, ref_final = reference.hgrn(x, g, h0, True)
        entering = torch.stack([h0.double()] + [ref_o[:, c * BT - 1] for c in range(1, NT)], 1)
    else:
        do = torch.randn(B, T, D, generator=torch.Generator().manual_seed(4)).to(_device())
        dht = torch.randn(B, D, generator=torch.Generator().manual_seed(5)).to(_device())
        x64, g64, h064 = (t.double().requires_grad_() for t in (x, g, h0))
        o, ht = reference.hgrn(x64, g64, h064, True)
        dx, dh0 = torch.autograd.grad((o * do.double()).sum() + (ht * dht.double()).sum(), (x64, h064))
        # dx_t = dh_t; the carry into chunk c is e^{g} dh at the first token of chunk c + 1
        nxt = [(g64[:, (c + 1) * BT].exp() * dx[:, (c + 1) * BT]).detach() for c in range(NT - 1)]
        entering = torch.stack(nxt + [dht.double()], 1)
        counters = lay.counters(x.device)
        carry_in, final = _entering(hgrn_chunk._scan_passes(do, g, dht, torch.float32, lay, True, counters))
        ref_final = dh0
    assert_close("state entering each chunk", carry_in.view(B, NT, D), entering, "fp32")
    assert_close("final", final, ref_final, "fp32")
    # the launch leaves its counters zero, so the next one (the backward's) can take them as
    # they are, and does the same work: the forward saves its counters for the backward
    assert counters.count_nonzero().item() == 0
    again, final_again = _entering(hgrn_chunk._scan_passes(do if reverse else x, g, dht if reverse else h0,
                                                           torch.float32, lay, reverse, counters))
    assert torch.equal(again, carry_in) and torch.equal(final_again, final)


@pytest.mark.parametrize("fn", [chunk_hgrn, fused_recurrent_hgrn])
@pytest.mark.parametrize("normalizer", [0.01, 0.001])
def test_extreme_decay(fn, normalizer):
    """Per-step log gates down to -5000: every output and gradient finite, at fp32 accuracy."""
    B, T, D = 2, 140, 24
    x, g = _inputs(B, T, D, normalizer, seed=6)
    h0 = torch.randn(B, D, generator=torch.Generator().manual_seed(7)).to(_device())
    leaves = [t.clone().requires_grad_() for t in (x, g, h0)]
    o, ht = fn(*leaves, output_final_state=True)
    ro, rht = reference.hgrn(*leaves, output_final_state=True)
    gen = torch.Generator().manual_seed(8)
    do, dht = torch.randn(o.shape, generator=gen).to(o.device), torch.randn(ht.shape, generator=gen).to(o.device)
    grads = torch.autograd.grad((o.double() * do).sum() + (ht.double() * dht).sum(), leaves)
    ref_grads = torch.autograd.grad((ro * do).sum() + (rht * dht).sum(), leaves)
    assert_close("o", o, ro, "fp32")
    assert_close("final_state", ht, rht, "fp32")
    for name, a, b in zip(("dx", "dg", "dh0"), grads, ref_grads):
        assert_close(name, a, b, "fp32", "backward")


@pytest.mark.parametrize("fn", [chunk_hgrn, fused_recurrent_hgrn])
def test_gate_dtype_may_differ_from_x(fn):
    """fp32 gates with half-precision x: o in fp16, dg in fp32."""
    x, g = _inputs(1, 70, 16, seed=9)
    x = x.half().requires_grad_()
    g = g.requires_grad_()
    o, _ = fn(x, g)
    assert o.dtype == torch.float16
    o.float().sum().backward()
    assert g.grad.dtype == torch.float32 and x.grad.dtype == torch.float16
    ro, _ = reference.hgrn(x, g)
    assert_close("o", o, ro, "fp16")
