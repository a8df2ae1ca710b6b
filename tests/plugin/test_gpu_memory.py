"""The clause a 2**31-element check's skip adds when it finds too little memory free while
alone on its GPU: what the other processes hold (from ``nvidia-smi``), so that a run's
report says where the memory went (``nvidia-smi`` is replaced by canned output here); and
what a process gives back to its GPU for such a check."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
import triton
import triton.language as tl
from plugin_testing import GPU, needs_gpu

from pytest_fla.running import gpu_memory, gpu_share
from pytest_fla.running.gpu_memory import other_holders


def _nvidia_smi(stdout: str = "", error: Exception | None = None):
    calls = []

    def run(args, **kwargs):
        calls.append(args)
        if error is not None:
            raise error
        return SimpleNamespace(stdout=stdout)
    return run, calls


def test_other_processes_are_summed_and_this_one_left_out():
    run, calls = _nvidia_smi(f"{os.getpid()}, 40000\n101, 2048\n102, 1024\n103, 512\n")
    assert other_holders("3", run) == "; 3 other processes hold 4 GiB (the largest 2.0 GiB)"
    assert "--id=3" in calls[0]


def test_nothing_to_say_where_nvidia_smi_cannot_tell():
    for stdout in ("", "[N/A], [N/A]\n", "No running processes found\n"):
        assert other_holders("0", _nvidia_smi(stdout)[0]) == ""
    assert other_holders("0", _nvidia_smi(error=FileNotFoundError("nvidia-smi"))[0]) == ""
    assert other_holders("0", _nvidia_smi(error=subprocess.TimeoutExpired("nvidia-smi", 10))[0]) == ""


# What a process gives back to its GPU: the local memory of spilling kernels. The driver is
# replaced by a recording stand-in on the CPU; on a GPU a kernel that spills grows it.

class _Driver:
    """``cuCtxGetLimit`` / ``cuCtxSetLimit`` as ctypes passes them, recorded."""

    def __init__(self, stack: int = 4656, result: int = 0):
        self.stack, self.result, self.set = stack, result, []

    def cuCtxGetLimit(self, value, limit):
        assert limit.value == gpu_memory.CU_LIMIT_STACK_SIZE
        value._obj.value = self.stack
        return self.result

    def cuCtxSetLimit(self, limit, value):
        self.set.append((limit.value, value.value))
        return self.result


def test_the_stack_limit_is_read_and_set_back_to_cudas_default():
    driver = _Driver(stack=4656)
    assert gpu_memory.stack_bytes(driver) == 4656
    assert gpu_memory.reset_stack(driver) is True
    assert driver.set == [(0, 1024)]  # CU_LIMIT_STACK_SIZE, CUDA's default per-thread stack


def test_a_driver_error_or_no_driver_is_no_answer(monkeypatch):
    failing = _Driver(result=201)  # CUDA_ERROR_INVALID_CONTEXT
    assert gpu_memory.stack_bytes(failing) is None
    assert gpu_memory.reset_stack(failing) is False
    monkeypatch.setattr(gpu_memory, "_driver", lambda: None)
    assert gpu_memory.stack_bytes() is None
    assert gpu_memory.reset_stack() is False


def test_after_each_test_the_cache_goes_back_and_after_the_last_the_stack_too(monkeypatch):
    """Between tests a process keeps the local memory its spilling kernels grew (the next
    one may need it again); after its last one it idles while the others' checks run."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(gpu_memory, "return_to_device", lambda device: calls.append(("return", str(device))))
    gpu_memory.after_test(last=False)
    assert calls == ["empty_cache"]
    gpu_memory.after_test(last=True)
    assert calls == ["empty_cache", ("return", "cuda:0")]

    def fault():  # a device fault: the test that caused it has reported it
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "empty_cache", fault)
    gpu_memory.after_test(last=False)


def test_a_process_without_cuda_gives_back_nothing(monkeypatch):
    if GPU is not None:
        pytest.skip("on a GPU machine this process may have initialised CUDA")
    monkeypatch.setattr(gpu_memory, "reset_stack", lambda driver=None: pytest.fail("reset without a CUDA context"))
    gpu_memory.return_to_device("cuda")


@triton.jit
def _held_row_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    # one warp holds the whole row across the sum: 1024 values a thread spill to the stack
    # (for sm90: 4656 bytes a thread on Triton 3.6 and 3.7.1, 4312 on 3.9)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x * tl.sum(x))


@needs_gpu
def test_returning_memory_frees_the_local_memory_a_spilling_kernel_grew():
    import torch

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    x = torch.ones(32768, device=device)
    y = torch.empty_like(x)
    # alone, so that no other worker's check moves the free memory read here
    with gpu_share.for_device(device).alone():
        gpu_memory.return_to_device(device)
        start = gpu_memory.stack_bytes()
        free_start = torch.cuda.mem_get_info(device)[0]
        _held_row_kernel[(1,)](x, y, BLOCK=32768, num_warps=1)
        torch.cuda.synchronize()
        grown = gpu_memory.stack_bytes()
        free_grown = torch.cuda.mem_get_info(device)[0]
        gpu_memory.return_to_device(device)
        free_back = torch.cuda.mem_get_info(device)[0]
        back = gpu_memory.stack_bytes()
    assert torch.equal(y, torch.full_like(x, 32768.0))
    assert back == start  # the reset's value, as the driver keeps it (it may round a request)
    if grown <= start:
        pytest.skip(f"this toolchain compiled the kernel without a stack frame over {start} bytes")
    # the driver sizes local memory for every thread the GPU can hold
    expected = (grown - start) * props.multi_processor_count * props.max_threads_per_multi_processor
    assert free_start - free_grown >= expected // 2, (free_start, free_grown, expected)
    assert free_back - free_grown >= expected // 2, (free_back, free_grown, expected)
