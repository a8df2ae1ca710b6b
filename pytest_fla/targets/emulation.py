"""Emulated targets: hold every kernel to the target card's shared-memory limit.

Under ``TRITON_OVERRIDE_ARCH=sm86`` a Hopper GPU runs sm86 code, but it would still
load a kernel needing 160 KiB of shared memory that a real sm86 card refuses. Triton
checks a compiled kernel's ``metadata.shared`` against the device's limit when it
loads it, and raises ``OutOfResources``: lowering that limit to the target's makes
the emulated run fail exactly where the real card fails, and lets the autotuner skip
such configs as it would there.
"""

from __future__ import annotations


def enforce_shared_memory_limit(limit: int) -> None:
    """From now on, no kernel may load with more than ``limit`` bytes of shared memory."""
    import triton.compiler.compiler as compiler

    device_limit = getattr(compiler.max_shared_mem, "fla_device_limit", compiler.max_shared_mem)

    def max_shared_mem(device):
        return min(device_limit(device), limit)

    max_shared_mem.fla_device_limit = device_limit
    compiler.max_shared_mem = max_shared_mem
