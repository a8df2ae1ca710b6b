"""``@triton.autotune`` under Triton's CPU interpreter: the first config that survives
pruning, without timing any.

Triton's autotuner times each config with the active driver's benchmarker; the
interpreter has no driver, so a kernel with several configs raises "0 active drivers"
on the CPU (Triton 3.6 to 3.9), though it runs there with any one of them. Timing in the
interpreter measures nothing a GPU would choose by, so :func:`install` makes every config
take the same time: the autotuner keeps its pruning, its hooks and its choice by key, and
picks the first config left. A kernel whose result depends on which config runs is then
checked at that one config (on a GPU, at the fastest).
"""

from __future__ import annotations

EQUAL_TIMES = [0.0, 0.0, 0.0]  # the quantiles (0.5, 0.2, 0.8) the autotuner asks for


def _untimed(kernel_call, quantiles):
    return list(EQUAL_TIMES[: len(quantiles)]) if quantiles else 0.0


def install() -> bool:
    """Patch the autotuner's benchmarker in this process (interpreter runs only); False
    where this Triton's autotuner has not the shape patched."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return False
    if not hasattr(Autotuner, "do_bench"):
        return False
    Autotuner.do_bench = property(lambda self: _untimed)
    return True
