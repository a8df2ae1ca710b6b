"""GPU memory accounting for the checks that need a large part of a GPU's memory, and what
a process gives back to its GPU when another needs that memory."""

from __future__ import annotations

import contextlib
import ctypes

# CUDA's per-thread stack (``CU_LIMIT_STACK_SIZE``, the limit's enum value 0) and its
# default. A kernel that spills registers needs a stack frame of that size; the driver
# grows the limit at the launch and keeps it, with the local memory behind it sized for
# every thread the GPU can hold (2048 a multiprocessor): on the H100 a 9720-byte frame
# (chunk_gla's state pass, fp32, K = 256, compiled for sm90) is 2.4 GiB per process, kept
# to its end. ``torch.cuda.empty_cache`` does not return it; setting the limit does, and
# the next launch that needs more grows it again.
CU_LIMIT_STACK_SIZE = 0
DEFAULT_STACK_BYTES = 1024


def forward_bytes(call, sample, device) -> int:
    """GPU memory a no-grad ``call(sample)`` takes: its inputs plus the call's peak."""
    import torch

    inputs = sum(t.numel() * t.element_size() for t in sample.tensors().values())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        call(sample)
    torch.cuda.synchronize(device)
    return inputs + torch.cuda.max_memory_allocated(device) - before


@contextlib.contextmanager
def released_on_error():
    """Free what a failing block's frames hold before its error leaves it.

    pytest keeps a failed test's traceback, and the traceback keeps every frame's locals:
    a failed 2**31-element check held its 48 GiB of tensors for the rest of the run on the
    H100, and every later such check there was skipped with 6 GiB free.
    """
    try:
        yield
    except BaseException as error:
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
                # A locals() snapshot (assertion rewriting takes one) outlives clear() until
                # the frame's locals are read again, which drops what clear() freed.
                frame.f_locals  # noqa: B018
            except RuntimeError:  # a frame still running (this one, its callers)
                pass
            tb = tb.tb_next
        raise


def other_holders(gpu: str, run=None) -> str:
    """What the other processes on GPU ``gpu`` (as ``nvidia-smi --id`` takes it) hold, as a
    clause for a skip that found too little memory free: ``""`` where ``nvidia-smi`` cannot
    say. Alone on the GPU, a check still shares its memory with every other process's CUDA
    context and whatever they keep between checks; the clause says how much that is."""
    import os
    import subprocess

    run = run or subprocess.run
    try:
        out = run(["nvidia-smi", f"--id={gpu}", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                  capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    held = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[0]) != os.getpid():
            held.append(int(fields[1]) / 1024)
    if not held:
        return ""
    return f"; {len(held)} other processes hold {sum(held):.0f} GiB (the largest {max(held):.1f} GiB)"


def _driver():
    """The CUDA driver library, or None where there is none (a CPU machine)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def stack_bytes(driver=None) -> int | None:
    """The current CUDA context's per-thread stack limit, or None where it cannot be read."""
    driver = driver or _driver()
    if driver is None:
        return None
    value = ctypes.c_size_t(0)
    if driver.cuCtxGetLimit(ctypes.byref(value), ctypes.c_int(CU_LIMIT_STACK_SIZE)) != 0:
        return None
    return value.value


def reset_stack(driver=None) -> bool:
    """Set the current context's per-thread stack back to CUDA's default, freeing the local
    memory spilling kernels grew (it waits for the work in flight). True where it was set."""
    driver = driver or _driver()
    if driver is None:
        return False
    return driver.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_STACK_SIZE), ctypes.c_size_t(DEFAULT_STACK_BYTES)) == 0


def after_test(last: bool) -> None:
    """After each test in a process that has initialised CUDA: the allocator's free blocks
    go back (workers sharing one GPU would otherwise each keep their largest test's cache;
    the float64 references are large), and after the process's last test the spilling
    kernels' local memory too (``return_to_device``): it idles while the other processes'
    checks, those that hold the GPU alone among them, still run."""
    import sys

    torch = sys.modules.get("torch")  # never import torch (or initialise CUDA) just for this
    if torch is None or not torch.cuda.is_initialized():
        return
    try:
        if last:
            return_to_device(torch.device("cuda", torch.cuda.current_device()))
        else:
            torch.cuda.empty_cache()
    except RuntimeError:  # a device fault, already reported by the test that caused it
        pass


def return_to_device(device) -> None:
    """Give back what this process holds on ``device``'s GPU without using it: the caching
    allocator's free blocks and the spilling kernels' local memory (``reset_stack``).
    Nothing where this process has not initialised CUDA."""
    import torch

    if not torch.cuda.is_initialized():
        return
    with torch.cuda.device(device):
        torch.cuda.synchronize()  # makes the device's context current on this thread
        torch.cuda.empty_cache()
        reset_stack()
