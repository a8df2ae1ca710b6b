"""Helpers for reproducer code in ``tests/repro/``: where to put its tensors."""

from __future__ import annotations

from .. import targets


def session_device() -> str:
    """``"cuda"`` where the session's target runs kernels on a GPU, else ``"cpu"``
    (the interpreter, or capture in compile-only mode)."""
    # a reproducer runs as a script in a process of its own, no pytest session there: the
    # target is the one the session that started it set in its environment
    target = targets.current_target()
    if target is not None and target.mode in (targets.NATIVE, targets.EMULATED):
        return "cuda"
    if target is None:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cpu"


def other_device(device: str) -> str:
    """A device the kernels' inputs are not on: the CPU for CUDA inputs, ``meta`` for CPU ones."""
    return "cpu" if str(device).startswith("cuda") else "meta"


def target_arch() -> int:
    """The session target's compute capability (80 for sm80); sm80 under the interpreter."""
    target = targets.current_target()  # in a reproducer's own process, as in session_device
    return target.arch if target is not None and target.arch else 80
