"""Host-side validation of ``cu_seqlens`` (``kernels/_validate.py``): which copy of the
offsets it reads. ``cu_seqlens_cpu`` promises a varlen call without a device-to-host sync,
so its values, not the device tensor's, must be the ones checked and used. A meta tensor
has no values: reading it raises, which makes the difference visible without a GPU."""

import pytest
import torch

from kernels._validate import check_cu_seqlens

META = torch.device("meta")


def _device_offsets(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.int64, device=META)


def test_cu_seqlens_cpu_values_are_used_and_the_device_copy_is_not_read():
    host = check_cu_seqlens("op", _device_offsets(3), torch.tensor([0, 3, 5], dtype=torch.int32),
                            batch=1, T=5, device=META)
    assert host.dtype == torch.int64 and host.tolist() == [0, 3, 5]


def test_the_same_cu_seqlens_cpu_gives_the_same_host_copy():
    # chunk maps are cached per host copy: a new copy each call would rebuild them
    cpu = torch.tensor([0, 2, 5])
    first = check_cu_seqlens("op", _device_offsets(3), cpu, batch=1, T=5, device=META)
    assert check_cu_seqlens("op", _device_offsets(3), cpu, batch=1, T=5, device=META) is first


@pytest.mark.parametrize("values, message", [
    ([0, 6, 5], "cu_seqlens_cpu"),
    ([1, 3, 5], "must start at 0"),
    ([0, 3, 4], "cu_seqlens_cpu"),
], ids=["decreasing", "not_from_zero", "not_ending_at_T"])
def test_bad_cu_seqlens_cpu_values_name_the_argument(values, message):
    with pytest.raises(ValueError, match=message):
        check_cu_seqlens("op", _device_offsets(3), torch.tensor(values), batch=1, T=5, device=META)


def test_cu_seqlens_on_meta_without_a_cpu_copy_says_what_is_needed():
    with pytest.raises(ValueError, match="needs `cu_seqlens_cpu`"):
        check_cu_seqlens("op", _device_offsets(3), None, batch=1, T=5, device=META)
