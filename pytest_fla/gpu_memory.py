"""GPU memory accounting for the checks that need a large part of a GPU's memory."""

from __future__ import annotations

import contextlib


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
