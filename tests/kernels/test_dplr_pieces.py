"""The pieces of the chunked DPLR delta rule against float64 built from the reference.

``kernels/dplr/chunk.py`` derives the chunked form; each intermediate the forward keeps
is checked against its definition, so a wrong piece is named rather than only seen as a
wrong output:

* the gated operands Qg = scale q e^{G}, Kg = k e^{G_C - G}, Bg = b e^{G_C - G} and the
  chunk decay e^{G_C};
* the score matrices built by levels: A_qk, A_qb (inclusive gates, diagonal included),
  L = (I - A_ab)^{-1} and M = L A_ak (exclusive gates, strictly lower), W = L (a e^{G^-});
* the per-chunk states h, against ``reference.dplr_delta_rule``'s final state of each
  prefix that ends at a chunk boundary;
* the pseudo-values u_t = S_{t-1}^T a_t with every S_{t-1} from the reference (all
  prefixes of every sequence, packed into one varlen call).

Sequence lengths put chunks at the edges (1, 63, 64, 65, a zero-length sequence), and a
strong-decay case (per-step log gates near -500) checks that every piece stays finite
and right. Under ``TRITON_INTERPRET=1`` on the CPU at small sizes, or on the GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import triton

import reference
from kernels._utils import chunk_map
from kernels.dplr.chunk import CHUNK, choose_configs
from kernels.dplr.chunk_fwd import chunk_fwd
from pytest_fla.checks.generic import numeric_device

BT = CHUNK


@pytest.fixture
def device():
    return numeric_device()


def _rel(out, ref):
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _inputs(lengths, H, K, V, gate_scale, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    shape = (1, T, H, K)
    q = torch.randn(shape, generator=gen, dtype=torch.float64)
    k = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(1, T, H, V, generator=gen, dtype=torch.float64)
    kk = F.normalize(torch.randn(shape, generator=gen, dtype=torch.float64), dim=-1)
    a = -kk
    b = kk * torch.sigmoid(torch.randn(shape, generator=gen, dtype=torch.float64))
    gk = F.logsigmoid(torch.randn(shape, generator=gen, dtype=torch.float64)) * gate_scale
    h0 = torch.randn(len(lengths), H, K, V, generator=gen, dtype=torch.float64)
    # the kernels see float32: the float64 side starts from the same rounded values
    return tuple(x.float().double() for x in (q, k, v, a, b, gk, h0))


def _prefix_states(k, v, a, b, gk, h0, lengths):
    """S_t for t = 0..L of every sequence (S_0 its initial state), from the reference."""
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
    _, final = reference.dplr_delta_rule(torch.zeros_like(k[:, idx]), k[:, idx], v[:, idx], a[:, idx], b[:, idx],
                                         gk[:, idx], initial_state=torch.stack(states0), output_final_state=True,
                                         cu_seqlens=cu)
    out, i = [], 0
    for L in lengths:
        out.append(final[i:i + L + 1])
        i += L + 1
    return out  # per sequence: [L + 1, H, K, V]


def _gated(x, y, Gx, Gy, inclusive):
    """[m, m]: sum_c x_ic y_jc e^{Gx_ic - Gy_jc} over j <= i (inclusive) or j < i."""
    diff = Gx[:, None, :] - Gy[None, :, :]
    m = x.shape[0]
    mask = torch.ones(m, m, dtype=torch.bool).tril(0 if inclusive else -1)
    factor = torch.where(mask[:, :, None], torch.exp(torch.where(mask[:, :, None], diff, 0.0)), 0.0)
    return (x[:, None, :] * y[None, :, :] * factor).sum(-1)


@pytest.mark.parametrize(
    "lengths,H,K,gate_scale",
    [((80,), 2, 32, 0.125), ((1, 63, 0, 65), 1, 16, 1.0), ((70,), 1, 16, 100.0)],
    ids=["two_chunks", "varlen_edges", "strong_decay"],
)
def test_forward_pieces(device, lengths, H, K, gate_scale):
    V = 16
    scale = K ** -0.5
    q, k, v, a, b, gk, h0 = _inputs(lengths, H, K, V, gate_scale)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    cfg = choose_configs(K, V, torch.float32)
    f32 = [x.float().to(device) for x in (q, k, v, a, b, gk, h0)]
    _, _, saved = chunk_fwd(*f32[:6], scale, f32[6], False, offsets.to(device), chunk_map(offsets, BT, device),
                            len(lengths), True, cfg)
    got = {n: t.double().cpu() for n, t in saved.items()}
    for name, t in got.items():
        # h and decay are per state slot, and varlen leaves some slots unused
        assert name in ("h", "decay") or torch.isfinite(t).all(), f"{name} holds NaN or Inf"

    states = _prefix_states(k, v, a, b, gk, h0, lengths)
    for n, (bos, length) in enumerate(zip(offsets[:-1].tolist(), lengths)):
        for c in range(triton.cdiv(length, BT)):
            t0, t1 = bos + c * BT, min(bos + (c + 1) * BT, bos + length)
            rows, m = slice(t0, t1), t1 - t0
            slot = bos // BT + n + c
            for j in range(H):
                qc, kc, ac, bc, gc, vc = (x[0, rows, j] for x in (q, k, a, b, gk, v))
                qc = qc * scale
                G = gc.cumsum(0)
                Gx = G - gc  # G^-: the gate before each row's own step
                Gc = G[-1]
                tail = gc.flip(0).cumsum(0).flip(0) - gc  # G_C - G, summed without cancellation
                assert _rel(got["qg"][0, rows, j], qc * torch.exp(G)) < 1e-5, "Qg"
                assert _rel(got["kg"][0, rows, j], kc * torch.exp(tail)) < 1e-5, "Kg"
                assert _rel(got["bg"][0, rows, j], bc * torch.exp(tail)) < 1e-5, "Bg"
                assert _rel(got["decay"][slot, j], torch.exp(Gc)) < 1e-5, "chunk decay"
                assert _rel(got["A_qk"][0, rows, j, :m], _gated(qc, kc, G, G, True)) < 1e-5, "A_qk"
                assert _rel(got["A_qb"][0, rows, j, :m], _gated(qc, bc, G, G, True)) < 1e-5, "A_qb"
                L = torch.linalg.inv(torch.eye(m, dtype=torch.float64) - _gated(ac, bc, Gx, G, False))
                assert _rel(got["L"][0, rows, j, :m], L) < 1e-5, "L = (I - A_ab)^-1"
                assert _rel(got["M"][0, rows, j, :m], L @ _gated(ac, kc, Gx, G, False)) < 1e-5, "M = L A_ak"
                assert _rel(got["w"][0, rows, j], L @ (ac * torch.exp(Gx))) < 1e-5, "W = L (a e^{G^-})"

                S = states[n][:, j]  # S_0 .. S_L of this sequence
                assert _rel(got["h"][slot, j], S[c * BT]) < 1e-5, "per-chunk state h"
                u_ref = torch.einsum("tkv,tk->tv", S[c * BT:c * BT + m], ac)
                assert _rel(got["u"][0, rows, j], u_ref) < 1e-5, "pseudo-values u = S_{t-1}^T a_t"
