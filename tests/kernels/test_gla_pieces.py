"""chunk_gla pieces the generic conformance checks do not reach: the intra-chunk score
matrix and the per-chunk states against float64, the gate-scaled operands of the state
pass, extreme and mixed decay (where naive chunk forms overflow or cancel), zero-length
sequences with per-sequence initial states, and a gate dtype other than q's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference
from kernels import chunk_gla
from kernels._arch import is_interpreter
from kernels.gla import chunk as gla_chunk
from pytest_fla.checks.tolerance import BACKWARD, FORWARD

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)
BT = gla_chunk.BT


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def _max_rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def _gates(shape, normalizer, gen, mixed=False):
    """``logsigmoid(randn) / normalizer``; ``mixed`` alternates runs of 5 steps of that
    with runs of near-zero decay, so cumulative gates are large where their differences
    are small (what a difference of cumulative sums gets wrong)."""
    g = F.logsigmoid(torch.randn(shape, generator=gen)) / normalizer
    if mixed:
        weak = (torch.arange(shape[1]) // 5) % 2 == 1
        g[:, weak] = -1e-3 * torch.rand(g[:, weak].shape, generator=gen)
    return g


def _inputs(B, T, H, K, V, normalizer=8.0, seed=0, dtype=torch.float32, mixed=False):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    g = _gates((B, T, H, K), normalizer, gen, mixed)
    return [t.to(dtype).to(_device()) for t in (q, k, v, g)]


def _forward_pieces(q, k, v, g, scale, initial_state=None):
    """The kernel's saved intermediates but A's low part: (A, q_in, k_out, decay, h_chunks)."""
    lay = gla_chunk._Layout(q, v, None, None)
    _, _, saved = gla_chunk._forward(q, k, v, g, scale, initial_state, False, lay, save_states=True)
    A, _, *rest = saved  # A's low part: bf16 work only
    return (A, *rest)


def _chunk_cumsum(g):
    """float64 in-chunk cumulative gates, [B, NT, BT, H, K] (zero-padded)."""
    B, T, H, K = g.shape
    NT = -(-T // BT)
    padded = torch.zeros(B, NT * BT, H, K, dtype=torch.float64, device=g.device)
    padded[:, :T] = g.double()
    return padded.view(B, NT, BT, H, K).cumsum(2)


def _chunked(x):
    B, T = x.shape[:2]
    NT = -(-T // BT)
    padded = torch.zeros(B, NT * BT, *x.shape[2:], dtype=torch.float64, device=x.device)
    padded[:, :T] = x.double()
    return padded.view(B, NT, BT, *x.shape[2:])


@pytest.mark.parametrize("normalizer", [8.0, 0.01])
def test_intra_chunk_scores_match_float64(normalizer):
    """A_ij = scale sum_c q_ic k_jc e^{G_ic - G_jc} (j <= i), in every chunk, the last one
    partial; K = 80 takes two key blocks, the second one masked."""
    B, T, H, K, V = 1, 100, 2, 80, 16
    q, k, v, g = _inputs(B, T, H, K, V, normalizer)
    scale = K ** -0.5
    A = _forward_pieces(q, k, v, g, scale)[0]
    G = _chunk_cumsum(g)  # [B, NT, BT, H, K]
    qc, kc = _chunked(q), _chunked(k)
    diff = G[:, :, :, None] - G[:, :, None, :]  # [B, NT, i, j, H, K]
    causal = torch.ones(BT, BT, dtype=torch.bool, device=g.device).tril()[None, None, :, :, None, None]
    decay = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()
    ref = scale * torch.einsum("bnihc,bnjhc,bnijhc->bnihj", qc, kc, decay)
    ref = ref.reshape(B, -1, H, BT)[:, :T]
    assert torch.isfinite(A).all()
    assert _rel(A, ref) < FORWARD["fp32"].rel_rms
    assert _max_rel(A, ref) < FORWARD["fp32"].max_abs
    assert (A.view(B, T, H, BT)[:, :64].transpose(1, 2).triu(1) == 0).all(), "scores above the diagonal"


def test_chunk_states_and_gated_operands_match_float64():
    """h_chunks[c] is the state entering chunk c (from the float64 recurrence), and the
    state pass's operands are scale q e^{G}, k e^{G_L - G} and e^{G_L}."""
    B, T, H, K, V = 2, 150, 2, 24, 40
    q, k, v, g = _inputs(B, T, H, K, V, normalizer=4.0, seed=1)
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(2)).to(_device())
    scale = 0.3
    _, q_in, k_out, decay, h_chunks = _forward_pieces(q, k, v, g, scale, h0)
    NT = -(-T // BT)
    for c in range(NT):
        _, state = reference.gla(q[:, : c * BT], k[:, : c * BT], v[:, : c * BT], g[:, : c * BT], scale=scale,
                                 initial_state=h0, output_final_state=True)
        got = h_chunks.view(B, NT, H, K, V)[:, c]
        assert _rel(got, state) < FORWARD["fp32"].rel_rms, f"state entering chunk {c}"
    G = _chunk_cumsum(g)
    G_last = G[:, :, -1:]
    assert _rel(q_in, (scale * _chunked(q) * G.exp()).reshape(B, -1, H, K)[:, :T]) < FORWARD["fp32"].rel_rms
    assert _rel(k_out, (_chunked(k) * (G_last - G).exp()).reshape(B, -1, H, K)[:, :T]) < FORWARD["fp32"].rel_rms
    assert _rel(decay.view(B, NT, H, K), G_last[:, :, 0].exp()) < FORWARD["fp32"].rel_rms


def _check_against_reference(q, k, v, g, h0, cu_seqlens=None, dtype="fp32"):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, h0)]
    o, ht = chunk_gla(*leaves[:4], initial_state=leaves[4], output_final_state=True, cu_seqlens=cu_seqlens)
    ro, rht = reference.gla(*leaves[:4], initial_state=leaves[4], output_final_state=True, cu_seqlens=cu_seqlens)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen).to(o.device)
    dht = torch.randn(ht.shape, generator=gen).to(o.device)
    grads = torch.autograd.grad((o.double() * do).sum() + (ht.double() * dht).sum(), leaves)
    ref_grads = torch.autograd.grad((ro * do).sum() + (rht * dht).sum(), leaves)
    for name, a, b in (("o", o, ro), ("final_state", ht, rht)):
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) < FORWARD[dtype].rel_rms, (name, _rel(a, b))
        assert _max_rel(a, b) < FORWARD[dtype].max_abs, (name, _max_rel(a, b))
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dh0"), grads, ref_grads):
        assert torch.isfinite(a).all(), name
        assert _rel(a, b) < BACKWARD[dtype].rel_rms, (name, _rel(a, b))
        assert _max_rel(a, b) < BACKWARD[dtype].max_abs, (name, _max_rel(a, b))
    return grads, ref_grads


@pytest.mark.parametrize("normalizer,mixed", [(0.01, False), (0.001, False), (0.01, True)])
def test_extreme_and_mixed_decay(normalizer, mixed):
    """Per-step log gates down to -5000 (e^{-G} overflows any naive chunk form) and runs
    of strong decay next to runs of almost none: everything finite and at fp32 accuracy,
    the gate gradient included (its i = j terms cancel exactly and are kept out of it)."""
    B, T, H, K, V = 1, 140, 2, 32, 16
    q, k, v, g = _inputs(B, T, H, K, V, normalizer, seed=3, mixed=mixed)
    h0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4)).to(_device())
    _check_against_reference(q, k, v, g, h0)


def test_zero_length_sequences_and_per_sequence_states():
    """Empty sequences first, in the middle and last: each keeps its own initial state as
    final state, and passes the final state's gradient straight to its initial state."""
    lengths = [0, 70, 0, 1, 64, 0]
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    T, H, K, V = int(offsets[-1]), 2, 16, 24
    q, k, v, g = _inputs(1, T, H, K, V, seed=5)
    N = len(lengths)
    h0 = torch.randn(N, H, K, V, generator=torch.Generator().manual_seed(6)).to(_device())
    cu = offsets.to(_device())
    grads, _ = _check_against_reference(q, k, v, g, h0, cu_seqlens=cu)
    o, ht = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=offsets)
    for n, length in enumerate(lengths):
        if length == 0:
            assert torch.equal(ht[n], h0[n]), f"sequence {n} is empty: its final state is its initial state"


def test_gate_dtype_may_differ_from_q():
    """fp32 gates with half-precision q, k, v (a common mix): dg comes back in fp32."""
    q, k, v, g = _inputs(1, 70, 2, 16, 16, seed=8)
    half = [t.half().requires_grad_() for t in (q, k, v)]
    g = g.clone().requires_grad_()
    o, _ = chunk_gla(*half, g)
    assert o.dtype == torch.float16
    o.float().sum().backward()
    assert g.grad.dtype == torch.float32 and q.dtype == torch.float32
    ro, _ = reference.gla(*half, g)
    assert _rel(o, ro) < FORWARD["fp16"].rel_rms


@pytest.mark.parametrize(
    "change,error,match",
    [
        (lambda a: {**a, "g": a["g"][..., :-1]}, ValueError, "`g`"),
        (lambda a: {**a, "q": a["q"].new_zeros(1, 8, 2, 257), "k": a["k"].new_zeros(1, 8, 2, 257),
                    "g": a["g"].new_zeros(1, 8, 2, 257)}, ValueError, "257"),
        (lambda a: {**a, "v": a["v"].new_zeros(1, 8, 2, 300)}, ValueError, "300"),
        (lambda a: {**a, "scale": "0.5"}, TypeError, "`scale`"),
        (lambda a: {**a, "g": a["g"].long()}, TypeError, "`g`"),
    ],
)
def test_bad_arguments(change, error, match):
    q, k, v, g = _inputs(1, 8, 2, 16, 16)
    with pytest.raises(error, match=match):
        chunk_gla(**change({"q": q, "k": k, "v": v, "g": g}))
