"""Observing kernel launches from the outside: counting them, and reading their grids.

Every Triton launch goes through ``KernelInterface.__getitem__`` (``kernel[grid]``),
whether the kernel is jitted, autotuned, wrapped in heuristics or interpreted, so that is
where a launch is seen.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class LaunchLog:
    grids: list = field(default_factory=list)  # one resolved grid tuple per launch (None if callable)

    @property
    def count(self) -> int:
        return len(self.grids)


@contextlib.contextmanager
def observe_launches():
    """Record the grid of every ``kernel[grid](...)`` made inside the block."""
    from triton.runtime.jit import KernelInterface

    log = LaunchLog()
    original = KernelInterface.__getitem__

    def getitem(self, grid):
        launcher = original(self, grid)

        def launch(*args, **kwargs):
            resolved = grid
            if callable(grid):
                try:
                    resolved = grid(dict(kwargs))
                except Exception:  # a grid that needs autotuned meta-parameters
                    resolved = None
            log.grids.append(tuple(resolved) if resolved is not None else None)
            return launcher(*args, **kwargs)

        return launch

    KernelInterface.__getitem__ = getitem
    try:
        yield log
    finally:
        KernelInterface.__getitem__ = original
