"""chunk_rwkv6 pieces the generic checks do not reach: the intra-chunk scores (strictly
lower with the query's gate exclusive of its own token, the bonus on the diagonal) and
the query operand of the state pass against float64, extreme and mixed decay (where the
adjacent-pair terms of the gate gradient must cancel exactly), the bonus's gradient over
many chunks and sequences, and the fused kernel at extreme decay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference
from kernels import chunk_rwkv6, fused_recurrent_rwkv6
from kernels._arch import is_interpreter
from kernels.gla import chunk as gla_chunk
from pytest_fla.checks.tolerance import assert_close

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)
BT = gla_chunk.BT


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _inputs(B, T, H, K, V, normalizer=8.0, seed=0, mixed=False):
    """r, k, v, w, u in fp32; ``mixed`` puts runs of almost no decay between runs of the
    given one (large cumulative gates with small differences)."""
    gen = torch.Generator().manual_seed(seed)
    r, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    w = F.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / normalizer
    if mixed:
        calm = (torch.arange(T) // 5) % 2 == 1
        w[:, calm] = -1e-3 * torch.rand(w[:, calm].shape, generator=gen)
    u = torch.randn(H, K, generator=gen)
    return [t.to(_device()) for t in (r, k, v, w, u)]


@pytest.mark.parametrize("normalizer", [8.0, 0.01])
def test_intra_chunk_scores_and_query_operand_match_float64(normalizer):
    """A_ij = scale sum_c r_ic k_jc e^{G_{i-1,c} - G_jc} for j < i and scale r_i . (u k_i) on the
    diagonal, within each chunk (the last one partial); q_in = scale r e^{G_{i-1}}. K = 80
    takes two key blocks, the second one masked."""
    B, T, H, K, V = 1, 100, 2, 80, 16
    r, k, v, w, u = _inputs(B, T, H, K, V, normalizer)
    scale = K ** -0.5
    lay = gla_chunk._Layout(r, v, None, None)
    _, _, (A, _, q_in, *_) = gla_chunk._forward(r, k, v, w, scale, None, False, lay, save_states=True, u=u)
    for c0 in range(0, T, BT):
        n = min(BT, T - c0)
        rc, kc, wc = (x[0, c0:c0 + n].double() for x in (r, k, w))  # [n, H, K]
        G = wc.cumsum(0)
        X = G - wc
        exponent = X[:, None] - G[None, :]  # [i, j, H, K]
        below = torch.ones(n, n, dtype=torch.bool, device=r.device).tril(-1)[:, :, None, None]
        factor = torch.where(below, exponent, torch.full_like(exponent, float("-inf"))).exp()
        ref = scale * torch.einsum("ihc,jhc,ijhc->ihj", rc, kc, factor)
        ref = ref + torch.diag_embed(scale * (rc * u.double() * kc).sum(-1).T).permute(1, 0, 2)
        assert_close(f"A of the chunk at {c0}", A[0, c0:c0 + n, :, :n], ref, "fp32")
        assert (A[0, c0:c0 + n, :, n:] == 0).all(), "columns past the chunk's end"
        assert_close(f"q_in of the chunk at {c0}", q_in[0, c0:c0 + n], scale * rc * X.exp(), "fp32")


def _check_against_reference(fn, r, k, v, w, u, h0, cu_seqlens=None):
    leaves = [t.detach().clone().requires_grad_() for t in (r, k, v, w, u, h0)]
    o, ht = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu_seqlens)
    ro, rht = reference.rwkv6(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu_seqlens)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(o.device)
    dht = torch.randn(ht.shape, generator=gen).to(o.device)
    grads = torch.autograd.grad((o.double() * do).sum() + (ht.double() * dht).sum(), leaves)
    ref_grads = torch.autograd.grad((ro * do).sum() + (rht * dht).sum(), leaves)
    assert_close("o", o, ro, "fp32")
    assert_close("final_state", ht, rht, "fp32")
    for name, a, b in zip(("dr", "dk", "dv", "dw", "du", "dh0"), grads, ref_grads):
        assert_close(name, a, b, "fp32", "backward")
    return o, ht


@pytest.mark.parametrize("normalizer,mixed", [(0.01, False), (0.001, False), (0.01, True)])
def test_extreme_and_mixed_decay(normalizer, mixed):
    """Per-step log decays down to -5000 and runs of strong decay next to runs of almost
    none: finite and at fp32 accuracy, dw included (its adjacent-pair terms, undecayed at
    any decay, cancel exactly and are kept out of it)."""
    B, T, H, K, V = 1, 140, 2, 32, 16
    r, k, v, w, u = _inputs(B, T, H, K, V, normalizer, seed=3, mixed=mixed)
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4)).to(_device())
    _check_against_reference(chunk_rwkv6, r, k, v, w, u, h0)


def test_fused_recurrent_at_extreme_decay():
    """The fused kernel's bonus path at per-step log decays down to -5000, over more than
    one 16-step segment of its backward."""
    r, k, v, w, u = _inputs(1, 40, 2, 16, 24, 0.001, seed=9)
    h0 = torch.randn(1, 2, 16, 24, generator=torch.Generator().manual_seed(10)).to(_device())
    _check_against_reference(fused_recurrent_rwkv6, r, k, v, w, u, h0)


def test_bonus_gradient_over_sequences_and_zero_lengths():
    """Packed sequences, empty ones first, between and last: du sums every token of every
    sequence (in a fixed order: two runs agree bit for bit), each empty sequence keeps its
    initial state as its final state."""
    lengths = [0, 70, 0, 1, 64, 0]
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    T, H, K, V = int(offsets[-1]), 2, 16, 24
    r, k, v, w, u = _inputs(1, T, H, K, V, seed=5)
    h0 = torch.randn(len(lengths), H, K, V, generator=torch.Generator().manual_seed(6)).to(_device())
    cu = offsets.to(_device())
    _, ht = _check_against_reference(chunk_rwkv6, r, k, v, w, u, h0, cu_seqlens=cu)
    for n, length in enumerate(lengths):
        if length == 0:
            assert torch.equal(ht[n], h0[n]), f"sequence {n} is empty: its final state is its initial state"
    du = []
    for _ in range(2):
        u_leaf = u.clone().requires_grad_()
        o, _ = chunk_rwkv6(r, k, v, w, u_leaf, cu_seqlens=cu, cu_seqlens_cpu=offsets)
        o.sum().backward()
        du.append(u_leaf.grad)
    assert torch.equal(du[0], du[1])


@pytest.mark.parametrize("fn", [chunk_rwkv6, fused_recurrent_rwkv6])
def test_bad_bonus(fn):
    r, k, v, w, u = _inputs(1, 8, 2, 16, 16)
    with pytest.raises(ValueError, match="`u`.*\\[H, K\\]"):
        fn(r, k, v, w, u[:, :-1])
    with pytest.raises(TypeError, match="`u`.*dtype"):
        fn(r, k, v, w, u.long())
    with pytest.raises(TypeError, match="`r`.*dtype"):
        fn(r.double(), k, v, w, u)
