"""simple_gla / gated-recurrence pieces the generic conformance checks do not reach:
the exact chunked gate gradient under extreme decay, the gate-gradient identity,
zero-length sequences in the chunk map, the per-chunk state slots, and the wrappers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reference
from kernels import (
    chunk_retention,
    chunk_simple_gla,
    fused_recurrent_gla,
    fused_recurrent_simple_gla,
)
from kernels._arch import is_interpreter
from kernels._sequence import state_slots
from kernels.simple_gla.chunk import CHUNK_SIZE

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _inputs(B, T, H, K, V, normalizer, seed, per_channel=False):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, *((K,) if per_channel else ()), generator=gen)) / normalizer
    return [t.to(_device()) for t in (q, k, v, g)]


def _grads(fn, q, k, v, g, seed, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g)]
    o, ht = fn(*leaves[:3], g=leaves[3], output_final_state=True, **kwargs)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=gen).to(o)
    dht = torch.randn(ht.shape, generator=gen).to(ht)
    grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    return (o, ht), grads, (do, dht)


@pytest.mark.parametrize("normalizer", [0.01, 0.001])
def test_chunk_gate_grad_exact_under_extreme_decay(normalizer):
    """dg from the chunk kernel keeps fp32 accuracy where ``e^{g}`` underflows.

    Here the true dg is ~1e-5 in norm while ``q . dq`` is O(1): the reverse-cumsum
    identity would leave an absolute error of ~1e-6 on it (10-100% relative); the
    kernel's direct form must stay near fp32 rounding.
    """
    q, k, v, g = _inputs(1, 2 * CHUNK_SIZE + 7, 2, 16, 16, normalizer, seed=1)
    (o, _), grads, (do, dht) = _grads(chunk_simple_gla, q, k, v, g, seed=1)
    ref = [t.detach().double().cpu().requires_grad_() for t in (q, k, v, g)]
    ro, rht = reference.simple_gla(*ref[:3], g=ref[3], output_final_state=True)
    rgrads = torch.autograd.grad((ro * do.double().cpu()).sum() + (rht * dht.double().cpu()).sum(), ref)
    assert torch.isfinite(grads[3]).all()
    assert _rel(grads[3].cpu(), rgrads[3]) < 1e-4
    for grad, rgrad in zip(grads[:3], rgrads[:3]):
        assert _rel(grad.cpu(), rgrad) < 1e-5


@pytest.mark.parametrize("op", ["chunk", "fused_recurrent", "fused_recurrent_gla"])
def test_gate_grad_identity(op):
    """``dg_t = sum_{u>=t} (q_u . dq_u - k_u . dk_u) + <dS_T, S_T>``: the kernels' dq, dk
    and dg must satisfy it (well-conditioned decay, where the identity is accurate)."""
    per_channel = op == "fused_recurrent_gla"
    q, k, v, g = _inputs(1, 70, 2, 16, 8, 8.0, seed=2, per_channel=per_channel)
    fn = {"chunk": chunk_simple_gla, "fused_recurrent": fused_recurrent_simple_gla,
          "fused_recurrent_gla": lambda q, k, v, g, **kw: fused_recurrent_gla(q, k, v, g, **kw)}[op]
    (_, ht), (dq, dk, _, dg), (_, dht) = _grads(fn, q, k, v, g, seed=2)
    dB = q.double() * dq.double() - k.double() * dk.double()
    if not per_channel:
        dB = dB.sum(-1)
    final = (dht.double() * ht.double()).sum(-1)  # [N, H, K]
    if not per_channel:
        final = final.sum(-1)
    dB[:, -1] += final
    expected = dB.flip(1).cumsum(1).flip(1)
    assert _rel(dg, expected) < 1e-5


def test_zero_length_sequences():
    """Empty sequences (first, middle, last) own no chunk: their final state is their
    initial state, their initial state's gradient is the final state's gradient, and the
    other sequences match separate runs."""
    lengths = [0, 5, 0, CHUNK_SIZE + 3, 0]
    T, H, K, V = sum(lengths), 2, 16, 8
    q, k, v, g = _inputs(1, T, H, K, V, 8.0, seed=3)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=q.device)
    h0 = torch.randn(len(lengths), H, K, V, device=q.device, requires_grad=True)
    o, ht = chunk_simple_gla(q, k, v, g=g, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    dht = torch.randn_like(ht)
    (dh0,) = torch.autograd.grad((ht * dht).sum() + o.sum(), [h0])
    for n, length in enumerate(lengths):
        if length == 0:
            assert torch.equal(ht[n], h0[n].detach())
            assert torch.equal(dh0[n], dht[n])
            continue
        s, e = cu[n].item(), cu[n + 1].item()
        o_n, ht_n = chunk_simple_gla(q[:, s:e], k[:, s:e], v[:, s:e], g=g[:, s:e], initial_state=h0[n:n + 1],
                                     output_final_state=True)
        assert _rel(o[:, s:e], o_n) < 1e-6
        assert _rel(ht[n], ht_n[0]) < 1e-6


def test_state_slots_injective_and_bounded():
    """Sequence n's chunk c stores its state in slot ``cu[n] // BT + n + c``: no two chunks
    share a slot and every slot is below the buffer size."""
    gen = torch.Generator().manual_seed(4)
    for _ in range(200):
        N = int(torch.randint(1, 8, (1,), generator=gen))
        lengths = torch.randint(0, 3 * CHUNK_SIZE, (N,), generator=gen).tolist()
        starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        slots = [starts[n] // CHUNK_SIZE + n + c for n in range(N) for c in range(-(-lengths[n] // CHUNK_SIZE))]
        assert len(set(slots)) == len(slots)
        assert all(0 <= s < state_slots(1, starts[-1], N, CHUNK_SIZE, varlen=True) for s in slots)


def test_retention_and_combined_gates():
    """retention = simple_gla with ``g_gamma[h] = log(1 - 2^(-5-h))``; g and g_gamma
    together act as the gate ``g + g_gamma`` (forward and dg)."""
    q, k, v, g = _inputs(1, 70, 3, 16, 8, 8.0, seed=5)
    gamma = torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(3.0))).to(q.device)
    o_ret, _ = chunk_retention(q, k, v)
    o_gamma, _ = chunk_simple_gla(q, k, v, g_gamma=gamma)
    assert _rel(o_ret, o_gamma) < 1e-6
    (o_both, _), grads_both, _ = _grads(chunk_simple_gla, q, k, v, g, seed=5, g_gamma=gamma)
    (o_sum, _), grads_sum, _ = _grads(chunk_simple_gla, q, k, v, g + gamma, seed=5)
    assert _rel(o_both, o_sum) < 1e-5
    assert _rel(grads_both[3], grads_sum[3]) < 1e-4


def test_head_dim_range_in_error():
    q = torch.zeros(1, 4, 1, 300, device=_device())
    v = torch.zeros(1, 4, 1, 8, device=_device())
    with pytest.raises(ValueError, match=r"`?K.*300.*1\.\.256"):
        chunk_simple_gla(q, q, v)
    with pytest.raises(ValueError, match=r"V.*300.*1\.\.256"):
        fused_recurrent_simple_gla(v, v, q)


def test_fp32_wide_keys_on_small_shared_memory_archs(monkeypatch):
    """On archs with ~100 KB of shared memory (sm86/89) the chunk gradient kernel cannot
    hold float32 q and k at K = 256; that configuration takes its gradients from the
    fused-recurrent backward, and they must still match the reference."""
    monkeypatch.setenv("FLA_TARGET_ARCH", "sm86")
    q, k, v, g = _inputs(1, 20, 1, 256, 16, 8.0, seed=6)
    (_, _), grads, (do, dht) = _grads(chunk_simple_gla, q, k, v, g, seed=6)
    ref = [t.detach().double().cpu().requires_grad_() for t in (q, k, v, g)]
    ro, rht = reference.simple_gla(*ref[:3], g=ref[3], output_final_state=True)
    rgrads = torch.autograd.grad((ro * do.double().cpu()).sum() + (rht * dht.double().cpu()).sum(), ref)
    for grad, rgrad in zip(grads, rgrads):
        assert _rel(grad.cpu(), rgrad) < 1e-5
