"""parallel_attn beyond the generic checks: many packed sequences (80,000 of 16 tokens,
which overflowed a grid axis elsewhere), the configs every target arch gets, the forward's
descriptor loads, and scales of either sign or zero.

On a GPU the packed batch runs and its first and last sequences are compared with the
float64 reference; in a compile-only session its launches are captured (nothing runs) and
their grids checked against CUDA's limits; under the interpreter, which would run the
80,000 programs one by one, the launch table is checked instead.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import reference
from kernels import parallel_attn
from kernels import _arch
import kernels.attention.parallel as attention
from kernels.attention.parallel import Blocks, _blocks_grid, attention_configs
from pytest_fla.checks.capture import MAX_GRID, capture_launches
from pytest_fla.checks.generic import numeric_device
from pytest_fla.checks.tolerance import assert_close

N_SEQUENCES, LENGTH = 80_000, 16


def _packed(device, H, HKV, D, draw=True, dtype=torch.bfloat16):
    T = N_SEQUENCES * LENGTH
    make = (lambda *shape: torch.randn(shape, device=device).to(dtype)) if draw else (
        lambda *shape: torch.empty(shape, device=device, dtype=dtype))
    cu_seqlens = torch.arange(0, T + 1, LENGTH, dtype=torch.int32)
    return make(1, T, H, D), make(1, T, HKV, D), make(1, T, HKV, D), cu_seqlens


def test_80000_short_sequences_launch():
    device = numeric_device()
    if _arch.is_interpreter():
        # the interpreter would run 80,000 programs one by one: check the launch table instead
        T = N_SEQUENCES * LENGTH
        cu_seqlens = torch.arange(0, T + 1, LENGTH, dtype=torch.int64)
        for block in (16, 64, 128):
            rows, table = _blocks_grid(1, T, cu_seqlens, block, "cpu")
            assert rows == N_SEQUENCES and table.shape == (N_SEQUENCES, 2)
            assert table[-1].tolist() == [N_SEQUENCES - 1, 0]
        return
    if device.type != "cuda":
        # captured, never run: the values do not matter, the sizes are kept small
        q, k, v, cu_seqlens = _packed("cpu", 1, 1, 16, draw=False)
        for t in (q, k, v):
            t.requires_grad_(True)
        with capture_launches(90) as recorder:
            o = parallel_attn(q, k, v, cu_seqlens=cu_seqlens)
            o.backward(torch.ones_like(o))
        assert len(recorder.launches) == 4
        for launch in recorder.launches:
            assert all(size <= cap for size, cap in zip(launch.grid, MAX_GRID)), (launch.name, launch.grid)
        assert max(launch.grid[0] for launch in recorder.launches) >= N_SEQUENCES
        return
    torch.manual_seed(0)
    q, k, v, cu_seqlens = _packed(device, 4, 2, 64)
    o = parallel_attn(q, k, v, cu_seqlens=cu_seqlens.to(device), cu_seqlens_cpu=cu_seqlens)
    for n in (0, N_SEQUENCES - 1):
        rows = slice(n * LENGTH, (n + 1) * LENGTH)
        ref = reference.attention(q[:, rows], k[:, rows], v[:, rows])
        assert_close(f"parallel_attn[sequence {n} of {N_SEQUENCES}]", o[:, rows], ref, "bf16")


@pytest.mark.parametrize("arch", _arch.KNOWN_ARCHS)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_configs_per_arch(monkeypatch, arch, D, dtype):
    """Every target gets blocks that the segment arithmetic assumes (BN divides BM in the
    forward and dq kernels, BM divides BN in dk/dv), or a clear NotImplementedError."""
    monkeypatch.setenv("FLA_TARGET_ARCH", f"sm{arch}")
    if arch < 80:
        with pytest.raises(NotImplementedError, match="sm80"):
            attention_configs(D, D, dtype)
        return
    cfg = attention_configs(D, D, dtype)
    assert cfg.fwd.BM % cfg.fwd.BN == 0 and cfg.dq.BM % cfg.dq.BN == 0 and cfg.dkdv.BN % cfg.dkdv.BM == 0
    for blocks in (cfg.fwd, cfg.dkdv, cfg.dq):
        assert min(blocks.BM, blocks.BN) >= 16  # tl.dot's smallest tile


def test_packed_tables_put_the_heaviest_causal_blocks_first():
    # lengths 3, 0, 5 blocks of 16: every (sequence, block) row once, in the order that
    # launches the most work first (the launch's tail then holds short programs)
    from kernels._utils import EARLY_FIRST, IN_ORDER, LATE_FIRST, chunk_map

    offsets = torch.tensor([0, 40, 40, 120])
    every = sorted((n, c) for n, blocks in ((0, 3), (2, 5)) for c in range(blocks))
    tables = {order: [tuple(r) for r in chunk_map(offsets, 16, "cpu", order).tolist()]
              for order in (IN_ORDER, LATE_FIRST, EARLY_FIRST)}
    assert tables[IN_ORDER] == every
    for table in tables.values():
        assert sorted(table) == every
    # query blocks: later in its sequence, more keys to see
    assert [c for _, c in tables[LATE_FIRST]] == [4, 3, 2, 2, 1, 1, 0, 0]
    # key blocks: blocks after it in its sequence, more queries that see it
    assert [5 - c if n == 2 else 3 - c for n, c in tables[EARLY_FIRST]] == [5, 4, 3, 3, 2, 2, 1, 1]
    assert tables[LATE_FIRST][:2] == [(2, 4), (2, 3)] and tables[EARLY_FIRST][0] == (2, 0)


@pytest.mark.parametrize("descriptors", [False, True])
@pytest.mark.parametrize("scale", [0.3, -0.4, 0.0])
@pytest.mark.parametrize("causal, window_size", [(True, None), (False, None), (True, 7), (False, 9)])
def test_descriptor_loads_and_signed_scales(monkeypatch, descriptors, scale, causal, window_size):
    """The forward's unmasked blocks take the scale's magnitude in one multiply-add and its
    sign in q; the tiles every kernel walks over (forward and dq: k and v, dk/dv: q and do)
    come through tensor descriptors where the config asks (boxes past the sequence's end
    read zeros). Both against the float64 reference, at a length that leaves a partial
    block and with grouped heads, forward and backward."""
    device = numeric_device()
    if device.type != "cuda" and not _arch.is_interpreter():
        pytest.skip("numeric check: needs a GPU or the interpreter")
    base = attention_configs
    monkeypatch.setattr(attention, "attention_configs", lambda D, DV, dtype: dataclasses.replace(
        base(D, DV, dtype), fwd=Blocks(32, 16, 4, 2, descriptors), dkdv=Blocks(16, 32, 4, 2, descriptors),
        dq=Blocks(32, 16, 4, 2, descriptors)))
    if descriptors and device.type == "cuda" and _arch.target_arch() < 90:
        pytest.skip("tensor descriptors: sm90 and newer")
    made = []  # the descriptors each launch got: all of them, or none (pointer loads)
    make = attention._descriptors
    monkeypatch.setattr(attention, "_descriptors", lambda *a: made.append(make(*a)) or made[-1])
    torch.manual_seed(0)
    B, T, H, HKV, D = 2, 37, 2, 1, 16
    q, k, v = (torch.randn(B, T, heads, D, device=device) for heads in (H, HKV, HKV))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o = parallel_attn(*leaves, scale=scale, causal=causal, window_size=window_size)
    do = torch.randn_like(o)
    o.backward(do)
    refs = [t.double().requires_grad_(True) for t in (q, k, v)]
    ref = reference.attention(*refs, scale=scale, causal=causal, window_size=window_size)
    ref.backward(do.double())
    assert len(made) == 3 and all((d is not None) == descriptors for pair in made for d in pair)
    assert_close("o", o, ref, "fp32")
    for name, ours, theirs in zip("qkv", leaves, refs):
        assert_close(f"d{name}", ours.grad, theirs.grad, "fp32")
