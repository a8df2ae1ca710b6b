"""The fused recurrence's backward under a per-channel gate splits the state by blocks of key
rows (``kernels/gated_recurrent/fused_recurrent.py``, ``_configs``); the generic checks run
shapes where one row block holds every key row. Here K = V = 64 makes four row blocks, so
dv is summed from per-block slabs and rwkv6's du from whole-V rows: every gradient must
match the same backward split by V blocks (another tiling of the same sums) to fp32
rounding, packed sequences and an initial state included."""

from __future__ import annotations

import pytest
import torch

from kernels import fused_recurrent_gla, fused_recurrent_rwkv6
from kernels._arch import is_interpreter
from kernels.gated_recurrent import fused_recurrent as recurrent

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _gradients(op, split_by_rows, patch):
    if not split_by_rows:
        base = recurrent._configs
        patch.setattr(recurrent, "_configs",
                      lambda K, V, backward, bonus=False, channel_gate=False: base(K, V, backward, bonus))
    gen = torch.Generator().manual_seed(0)
    T, H, K, V = 23, 2, 64, 64
    cu_seqlens = torch.tensor([0, 9, 23], device=_device())
    q, k = (torch.randn(1, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(1, T, H, V, generator=gen)
    gate = -2 * torch.rand(1, T, H, K, generator=gen)
    h0 = torch.randn(2, H, K, V, generator=gen)
    leaves = [t.to(_device()).requires_grad_(True) for t in (q, k, v, gate, h0)]
    if op == "rwkv6":
        leaves.append(torch.randn(H, K, generator=gen).to(_device()).requires_grad_(True))
        o, ht = fused_recurrent_rwkv6(*leaves[:4], leaves[5], initial_state=leaves[4], output_final_state=True,
                                      cu_seqlens=cu_seqlens)
    else:
        o, ht = fused_recurrent_gla(*leaves[:4], initial_state=leaves[4], output_final_state=True,
                                    cu_seqlens=cu_seqlens)
    cotangents = [torch.randn(x.shape, generator=gen).to(_device()) for x in (o, ht)]
    torch.autograd.backward([o, ht], cotangents)
    return [x.grad for x in leaves]


@pytest.mark.parametrize("op", ["gla", "rwkv6"])
def test_backward_split_by_key_rows_matches_split_by_values(op, monkeypatch):
    cfg = recurrent._configs(64, 64, backward=True, bonus=op == "rwkv6", channel_gate=True)
    assert cfg["split"] == "K" and 64 // cfg["rows_BK"] > 1, cfg  # several row blocks: dv in slabs
    by_rows = _gradients(op, True, monkeypatch)
    with monkeypatch.context() as patch:
        by_values = _gradients(op, False, patch)
    names = ["q", "k", "v", "gate", "initial_state", "u"]
    for name, a, b in zip(names, by_rows, by_values):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 1e-5, f"{op} d{name}: relative difference {err:.2e} between the two splits"
