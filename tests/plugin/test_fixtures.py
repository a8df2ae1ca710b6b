"""The fixture families, as a test of an op sees them under the interpreter."""

from __future__ import annotations

from plugin_testing import REPO, cpu_only, run
from pytest_fla.ops.packings import packings

PROJECT = '''
import re, pytest, torch

def test_cu_seqlens(cu_seqlens, fla_chunk_size):
    assert cu_seqlens.index_dtype in (torch.int32, torch.int64)
    assert all(n >= 0 for n in cu_seqlens.lengths)
    if cu_seqlens.name == "chunk_edges":
        assert list(cu_seqlens.lengths) == [1, fla_chunk_size - 1, fla_chunk_size, fla_chunk_size + 1]

def test_huge_batch(huge_batch):
    pass

def test_rotary_dims(rotary_dims):
    if rotary_dims.error:
        message = f"rotary dim {rotary_dims.rotary_dim} does not fit head dim {rotary_dims.head_dim}"
        assert re.search(rotary_dims.error, message)
    else:
        assert rotary_dims.rotary_dim <= rotary_dims.head_dim and rotary_dims.rotary_dim % 2 == 0

def fake_op(q, k, cu_seqlens, cu_seqlens_cpu=None):
    for name, t in (("k", k), ("cu_seqlens", cu_seqlens)):
        if t.device != q.device:
            raise ValueError(f"`{name}` is on {t.device} but `q` is on {q.device}")
    return q

def test_device_mismatch(device_mismatch):
    kwargs = dict(q=torch.ones(2), k=torch.ones(2), cu_seqlens=torch.tensor([0, 2]), cu_seqlens_cpu=torch.tensor([0, 2]))
    moved = []
    for name, bad, device in device_mismatch.variants(kwargs):
        assert device.type == "meta"
        with pytest.raises(ValueError, match=name):
            fake_op(**bad)
        moved.append(name)
    assert moved == ["q", "k", "cu_seqlens"]  # every tensor argument, cu_seqlens_cpu excepted

@pytest.mark.fla_op("toy")
def test_poisoned_allocations():
    import kernels._utils as utils
    assert utils.POISON_ALLOCATIONS
    assert torch.isnan(utils.empty((3,), torch.float32, "cpu")).all()
    assert (utils.empty((3,), torch.int32, "cpu") == -1).all()
'''


@cpu_only
def test_fixture_families(pytester):
    pytester.makepyfile(test_fixtures=PROJECT)
    pytester.makeini(f"[pytest]\nfla_poison = kernels._utils:POISON_ALLOCATIONS\npythonpath = {REPO}\n")
    result = run(pytester, "-v", "-rs")
    out = result.stdout.str()
    # every packing in both index dtypes, with ids naming them
    assert "test_cu_seqlens[zero_length-int32] PASSED" in out and "test_cu_seqlens[chunk_edges-int64] PASSED" in out
    assert "the CPU interpreter has none" in out  # huge grids skip here, saying why
    for case in ("full", "partial", "odd_head_dim", "odd_rotary_dim", "model_width"):
        assert f"test_rotary_dims[{case}] PASSED" in out
    assert "test_device_mismatch[other_kind] PASSED" in out
    assert "needs two visible GPUs" in out
    assert "test_poisoned_allocations PASSED" in out
    # every packing in both index dtypes, the five rotary cases, device mismatch, poisoning
    result.assert_outcomes(passed=2 * len(packings(16)) + 5 + 1 + 1, skipped=3 + 1)
    listed = run(pytester, "--fixtures").stdout.str()
    for name in ("cu_seqlens", "huge_batch", "rotary_dims", "device_mismatch", "fla_poison_allocations"):
        assert name in listed
