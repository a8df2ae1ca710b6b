"""The pieces of the chunked (gated) delta rule against float64 built from the reference.

``kernels/delta_rule/chunk.py`` derives the chunked form; here each intermediate the
forward keeps is checked on its own, so a wrong piece is named rather than only seen as a
wrong output:

* the 64 x 64 unit-lower-triangular inverse (``unit_lower_inverse``), on its own;
* G (chunk-local cumulative gates), L = (I + A)^{-1}, and W = L diag(beta e^G) K (kept as
  e^{-G_0} W), against the definitions in float64;
* the per-chunk states h, against ``reference.gated_delta_rule``'s final state of each
  prefix that ends at a chunk boundary;
* the pseudo-values U - W h, against ``beta_t (v_t - e^{g_t} S_{t-1}^T k_t)`` with every
  ``S_{t-1}`` taken from the reference (all prefixes of the sequence, packed into one
  varlen call);
* U~ = L diag(beta) V, through U~ = (U - W h) + W h.

Under ``TRITON_INTERPRET=1`` on the CPU at small sizes, or on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import reference
from kernels._utils import chunk_map
from kernels.delta_rule._chunk_common import CHUNK, choose_configs
from kernels._triangular import unit_lower_inverse
from kernels.delta_rule.chunk_fwd import chunk_fwd
from pytest_fla.running.devices import numeric_device

BT = CHUNK


@pytest.fixture
def device():
    return numeric_device()


@triton.jit
def _inverse_kernel(a, out, BT: tl.constexpr):
    rows = tl.arange(0, BT)
    offs = rows[:, None] * BT + rows[None, :]
    tl.store(out + offs, unit_lower_inverse(tl.load(a + offs), tl.load(a + tl.trans(offs)), BT, tl.float32))


def _rel(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("magnitude", [0.1, 1.0])
def test_unit_lower_inverse(device, magnitude):
    gen = torch.Generator().manual_seed(1)
    A = torch.tril(torch.randn(BT, BT, generator=gen, dtype=torch.float64), -1) * magnitude / BT ** 0.5
    out = torch.empty(BT, BT, dtype=torch.float32, device=device)
    _inverse_kernel[(1,)](A.float().to(device), out, BT=BT)
    ref = torch.linalg.inv(torch.eye(BT, dtype=torch.float64) + A)
    assert _rel(out, ref) < 1e-5
    # and it is an inverse: (I + A) L = I
    residual = (torch.eye(BT, dtype=torch.float64) + A) @ out.double().cpu() - torch.eye(BT, dtype=torch.float64)
    assert residual.abs().max().item() < 1e-5


def _inputs(lengths, H, HV, K, V, normalizer, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q = torch.randn(1, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(1, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, HV, V, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64)) / normalizer
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen, dtype=torch.float64))
    h0 = torch.randn(len(lengths), HV, K, V, generator=gen, dtype=torch.float64)
    # the kernels see float32: the float64 side starts from the same rounded values
    return tuple(x.float().double() for x in (q, k, v, g, beta, h0))


def _prefix_states(k, v, g, beta, h0, lengths, gated):
    """S_t for t = 0..L of every sequence (S_0 its initial state), from the reference: all
    prefixes of all sequences packed into one varlen call, each returning its final state."""
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
    q_dummy = torch.zeros_like(k[:, idx])
    common = dict(initial_state=torch.stack(states0), output_final_state=True, cu_seqlens=cu)
    if gated:
        _, final = reference.gated_delta_rule(q_dummy, k[:, idx], v[:, idx], g[:, idx], beta[:, idx], **common)
    else:
        _, final = reference.delta_rule(q_dummy, k[:, idx], v[:, idx], beta[:, idx], **common)
    out, i = [], 0
    for L in lengths:
        out.append(final[i:i + L + 1])
        i += L + 1
    return out  # per sequence: [L + 1, HV, K, V]


@pytest.mark.parametrize(
    "lengths,H,HV,normalizer",
    [((80,), 1, 2, 8.0), ((3, 70, 0, 64), 2, 2, 1.0), ((100,), 1, 1, 0.05), ((70,), 1, 1, None)],
    ids=["gated_gva", "gated_varlen_edges", "gated_strong_decay", "delta_rule"],
)
def test_forward_pieces(device, lengths, H, HV, normalizer):
    K, V = 16, 16
    gated = normalizer is not None
    q, k, v, g, beta, h0 = _inputs(lengths, H, HV, K, V, normalizer or 1.0)
    if not gated:
        g = torch.zeros_like(g)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    table = chunk_map(offsets, BT, device)
    cfg = choose_configs(K, V, torch.float32)
    f32 = [x.float().to(device) for x in (q, k, v, g, beta, h0)]
    _, _, saved = chunk_fwd(f32[0], f32[1], f32[2], f32[3] if gated else None, f32[4], K ** -0.5, f32[5], False,
                            offsets.to(device), table, len(lengths), False, True, cfg)
    L, W, h, vn = (saved[n].double().cpu() for n in ("L", "w", "h", "vn"))
    G = saved["G"].double().cpu() if gated else torch.zeros_like(g)

    kk = k.repeat_interleave(HV // H, dim=2)
    states = _prefix_states(k, v, g, beta, h0, lengths, gated)
    for n, (bos, length) in enumerate(zip(offsets[:-1].tolist(), lengths)):
        for c in range(triton.cdiv(length, BT)):
            t0, t1 = bos + c * BT, min(bos + (c + 1) * BT, bos + length)
            rows = slice(t0, t1)
            m = t1 - t0
            slot = bos // BT + n + c
            for j in range(HV):
                # G, A, L, W from their definitions
                G_ref = g[0, rows, j].cumsum(0)
                assert torch.allclose(G[0, rows, j], G_ref, rtol=1e-12, atol=1e-9)
                decay = torch.exp((G_ref[:, None] - G_ref[None, :]).tril(-1)).tril(-1)
                kc, vc, bc = kk[0, rows, j], v[0, rows, j], beta[0, rows, j]
                A = bc[:, None] * (kc @ kc.T) * decay
                L_ref = torch.linalg.inv(torch.eye(m, dtype=torch.float64) + A)
                assert _rel(L[0, rows, j, :m], L_ref) < 1e-5, "L = (I + A)^-1"
                W_ref = L_ref @ (bc[:, None] * torch.exp(G_ref - G_ref[0])[:, None] * kc)
                assert _rel(W[0, rows, j], W_ref) < 1e-5, "W (kept as e^{-G_0} W)"

                # the state entering the chunk
                S = states[n][:, j]
                assert _rel(h[slot, j], S[c * BT]) < 1e-5, "per-chunk state h"

                # pseudo-values u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t), S from the reference
                local = torch.arange(c * BT, c * BT + m)
                S_prev = S[local]
                u_ref = bc[:, None] * (vc - torch.exp(g[0, rows, j])[:, None] * torch.einsum("tkv,tk->tv", S_prev, kc))
                assert _rel(vn[0, rows, j], u_ref) < 1e-5, "pseudo-values U - W h"

                # U~ = L diag(beta) V, recovered as (U - W h) + W h
                U_tilde = vn[0, rows, j] + torch.exp(G_ref[0]) * W[0, rows, j] @ h[slot, j]
                assert _rel(U_tilde, L_ref @ (bc[:, None] * vc)) < 1e-5, "U~ = L diag(beta) V"


def test_gradient_key_block_is_64_wide_on_sm90_in_bf16():
    """Triton 3.6 compiled the gradient kernel's 32-wide bf16 key block wrong on sm90
    (tests/repro/chunk_delta_rule_bf16_narrow_keys.py): narrow keys get a 64-wide block
    there, and only there."""
    for K in (16, 32):
        assert choose_configs(K, 392, torch.bfloat16, 90).grad_BK == 64
        assert choose_configs(K, 392, torch.float16, 90).grad_BK == 64
        assert choose_configs(K, 392, torch.float32, 90).grad_BK == 32
        for arch in (80, 86, 100, 120):
            assert choose_configs(K, 392, torch.bfloat16, arch).grad_BK == 32


@pytest.mark.parametrize("K", [16, 32])
def test_gradient_kernel_masks_a_key_block_wider_than_the_keys(device, monkeypatch, K):
    """The sm90 bf16 gradient kernel's key block past K (64 wide at K = 16 and 32), run here in
    fp32 at every arch: dq, dk, dbeta against the float64 recurrence."""
    import dataclasses

    import kernels.delta_rule.chunk as chunk_module
    from kernels import chunk_delta_rule
    from pytest_fla.checks.tolerance import assert_close

    chosen, widened = chunk_module.choose_configs, []

    def wide_key_block(*args, **kwargs):
        widened.append(args)
        return dataclasses.replace(chosen(*args, **kwargs), grad_BK=64)
    monkeypatch.setattr(chunk_module, "choose_configs", wide_key_block)
    gen = torch.Generator().manual_seed(0)
    B, T, H, V = 1, 80, 1, 40
    q, v = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64))
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    exact = [x.clone().requires_grad_(True) for x in (q, k, v, beta)]
    ref_grads = torch.autograd.grad(reference.delta_rule(*exact)[0], exact, do)
    ours = [x.to(device, torch.float32).requires_grad_(True) for x in (q, k, v, beta)]
    grads = torch.autograd.grad(chunk_delta_rule(*ours)[0], ours, do.to(device, torch.float32))
    assert widened, "the op did not take its configs from choose_configs"
    for name, g, g_ref in zip(("q", "k", "v", "beta"), grads, ref_grads):
        assert_close(f"K={K}: d{name}", g.cpu(), g_ref, "fp32", "backward")
