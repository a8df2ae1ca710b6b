"""chunk_kda's pieces against float64 built from their definitions and from the
reference recurrence, so that a wrong piece is named rather than only seen as a wrong
output (derivation: ``kernels/delta_rule/chunk_kda.py``):

* the intra-chunk matrices P (scale q_i k_j e^{G_i - G_j}, j <= i) and L = (I + A)^{-1}
  (A_ij = beta_i k_i k_j e^{G_i - G_j}, j < i), W = L diag(beta) (k ⊙ e^G), the gate-scaled
  operands q_in, k_out and e^{G_C}: at realistic and at strong decay, where the factored
  form of the matrices overflows;
* the per-chunk states h against ``reference.kda``'s final states of the prefixes that
  end at chunk boundaries, and the pseudo-values U against beta_t (v_t - S'^T k_t) with
  every S' from the reference;
* extreme and mixed per-channel decay end to end (the gate gradient is a cumulative sum
  of terms that cancel there), and zero-length sequences with their own initial states.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton

import reference
from kernels import chunk_kda
from kernels._utils import chunk_map
from kernels.delta_rule._chunk_common import CHUNK
from kernels.delta_rule.chunk_kda import kda_fwd
from pytest_fla.checks.generic import numeric_device
from pytest_fla.checks.tolerance import BACKWARD, FORWARD, errors

BT = CHUNK
TINY = 1e-30


def _inputs(lengths, H, HV, K, V, normalizer, seed=0, mixed=False):
    """float64 copies of float32-rounded inputs, packed along T (B = 1)."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q = torch.randn(1, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, HV, V, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, T, HV, K, generator=gen, dtype=torch.float64)) / normalizer
    if mixed:  # runs of 5 steps of strong decay between runs of almost none
        weak = (torch.arange(T) // 5) % 2 == 1
        g[:, weak] = -1e-3 * torch.rand(g[:, weak].shape, generator=gen, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64))
    h0 = torch.randn(len(lengths), HV, K, V, generator=gen, dtype=torch.float64)
    return tuple(x.float().double() for x in (q, k, v, g, beta, h0))


def _prefix_states(k, v, g, beta, h0, lengths):
    """S_t for t = 0..L of every sequence (S_0 its initial state), from the reference:
    every prefix of every sequence packed into one varlen call that returns final states."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    pieces, prefix_lengths, states0 = [], [], []
    for n, (s, L) in enumerate(zip(starts, lengths)):
        for t in range(L + 1):
            pieces.append(torch.arange(s, s + t))
            prefix_lengths.append(t)
            states0.append(h0[n])
    idx = torch.cat(pieces)
    cu = torch.tensor([0] + prefix_lengths).cumsum(0)
    _, final = reference.kda(torch.zeros_like(k[:, idx]), k[:, idx], v[:, idx], g[:, idx], beta[:, idx],
                             initial_state=torch.stack(states0), output_final_state=True, cu_seqlens=cu)
    out, i = [], 0
    for L in lengths:
        out.append(final[i:i + L + 1])
        i += L + 1
    return out  # per sequence: [L + 1, HV, K, V]


def _rel(out, ref):
    return errors(out.double().cpu(), ref.double().cpu())[0]


@pytest.mark.parametrize(
    "lengths,H,HV,K,normalizer",
    [((80,), 1, 2, 16, 8.0), ((3, 70, 0, 64), 2, 2, 48, 1.0), ((100,), 1, 1, 16, 0.01)],
    ids=["gva", "varlen_edges_two_key_blocks", "strong_decay"],
)
def test_forward_pieces(lengths, H, HV, K, normalizer):
    device = numeric_device()
    V = 16
    q, k, v, g, beta, h0 = _inputs(lengths, H, HV, K, V, normalizer)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    table = chunk_map(offsets, BT, device)
    f32 = [x.float().to(device) for x in (q, k, v, g, beta, h0)]
    scale = K ** -0.5
    _, _, saved = kda_fwd(*f32[:5], scale, f32[5], False, offsets.to(device), table, len(lengths), False, True)
    got = {name: t.double().cpu() for name, t in saved.items() if t is not None}

    qq, kk = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    states = _prefix_states(k, v, g, beta, h0, lengths)
    tol = FORWARD["fp32"].rel_rms
    for n, (bos, length) in enumerate(zip(offsets[:-1].tolist(), lengths)):
        for c in range(triton.cdiv(length, BT)):
            t0, t1 = bos + c * BT, min(bos + (c + 1) * BT, bos + length)
            rows, m = slice(t0, t1), t1 - t0
            slot = bos // BT + n + c
            for j in range(HV):
                G = g[0, rows, j].cumsum(0)  # [m, K], float64
                diff = G[:, None, :] - G[None, :, :]
                lower = torch.ones(m, m, dtype=torch.bool).tril()
                gamma = torch.where(lower[..., None], diff, torch.full_like(diff, -torch.inf)).exp()
                qc, kc, vc, bc = qq[0, rows, j], kk[0, rows, j], v[0, rows, j], beta[0, rows, j]
                P_ref = scale * torch.einsum("ic,jc,ijc->ij", qc, kc, gamma)
                assert _rel(got["P"][0, rows, j, :m], P_ref) < tol, "P"
                A = bc[:, None] * torch.einsum("ic,jc,ijc->ij", kc, kc, gamma).tril(-1)
                L_ref = torch.linalg.inv(torch.eye(m, dtype=torch.float64) + A)
                assert _rel(got["L"][0, rows, j, :m], L_ref) < tol, "L = (I + A)^-1"
                assert _rel(got["w"][0, rows, j], L_ref @ (bc[:, None] * kc * G.exp())) < tol, "W"
                assert _rel(got["q_in"][0, rows, j], scale * qc * G.exp()) < tol, "q_in = scale q e^G"
                assert _rel(got["k_out"][0, rows, j], kc * (G[-1] - G).exp()) < tol, "k_out = k e^{G_C - G}"
                assert _rel(got["decay"][slot, j], G[-1].exp()) < tol, "e^{G_C}"
                S = states[n][:, j]
                assert _rel(got["h"][slot, j], S[c * BT]) < tol, "per-chunk state h"
                # U = beta_t (v_t - (e^{g_t} ⊙ S_{t-1})^T k_t), every S_{t-1} from the reference
                S_prev = S[c * BT:c * BT + m]
                decayed = g[0, rows, j].exp()[:, :, None] * S_prev
                u_ref = bc[:, None] * (vc - torch.einsum("tkv,tk->tv", decayed, kc))
                assert _rel(got["vn"][0, rows, j], u_ref) < tol, "pseudo-values U"


def _end_to_end(lengths, H, HV, K, V, normalizer, mixed=False, seed=3):
    device = numeric_device()
    q, k, v, g, beta, h0 = _inputs(lengths, H, HV, K, V, normalizer, seed=seed, mixed=mixed)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    leaves = [x.float().to(device).requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, ht = chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu.to(device),
                      use_qk_l2norm_in_kernel=True)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    ro, rht = reference.kda(*ref[:5], initial_state=ref[5], output_final_state=True, cu_seqlens=cu.to(device),
                            use_qk_l2norm_in_kernel=True)
    gen = torch.Generator().manual_seed(seed + 1)
    do, dht = (torch.randn(t.shape, generator=gen, dtype=torch.float64).to(device) for t in (o, ht))
    torch.autograd.backward([o, ht], [do.float(), dht.float()])
    torch.autograd.backward([ro, rht], [do, dht])
    for name, a, b in (("o", o, ro), ("final_state", ht, rht)):
        rel, rel_max = errors(a, b)
        assert rel < FORWARD["fp32"].rel_rms and rel_max < FORWARD["fp32"].max_abs, (name, rel, rel_max)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), leaves, ref):
        assert torch.isfinite(a.grad).all(), name
        if b.grad.abs().max() < TINY:
            # e.g. d initial_state under extreme decay: all of it below fp32's normal range
            # (1.2e-38), where no relative comparison means anything; it must stay there
            assert a.grad.abs().max() < TINY, (name, a.grad.abs().max().item())
            continue
        rel, rel_max = errors(a.grad, b.grad)
        assert rel < BACKWARD["fp32"].rel_rms and rel_max < BACKWARD["fp32"].max_abs, (name, rel, rel_max)
    return ht, leaves[5]


@pytest.mark.parametrize("normalizer,mixed", [(0.001, False), (0.01, True)], ids=["extreme", "mixed"])
def test_extreme_and_mixed_decay(normalizer, mixed):
    """Per-step log gates down to -5000 per channel, and strong-decay runs next to runs of
    almost none: finite and at fp32 accuracy, the gate and initial-state gradients too."""
    _end_to_end((90,), 1, 2, 32, 16, normalizer, mixed)


def test_zero_length_sequences_keep_their_initial_state():
    lengths = (0, 70, 0, 1, 0)
    ht, h0 = _end_to_end(lengths, 1, 1, 16, 16, 4.0, seed=5)
    for n, length in enumerate(lengths):
        if length == 0:
            assert torch.equal(ht[n], h0[n].detach()), f"sequence {n} is empty: its final state is its initial state"
