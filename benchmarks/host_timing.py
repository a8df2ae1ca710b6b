"""The CPU's time per call of a function: the host-time measurements' one timer.

``bench.py`` calibrates the host with it (a no-op launch), ``host_overhead.py`` splits a
host-bound line's time with it, and ``dispatch_overhead.py`` times the ops' host code with
every launch suppressed (its process's CPU time, no device).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def per_call_us(fn: Callable[[], object], calls: int = 200, rounds: int = 7, clock=time.perf_counter,
                sync: Callable[[], object] | None = None) -> float:
    """Median over ``rounds`` of the mean microseconds of ``calls`` calls of ``fn``, by
    ``clock``. ``sync`` (a device synchronize) runs after the first call and after every
    round, outside the timing: the device is left to lag behind while the CPU issues."""
    fn()
    if sync:
        sync()
    times = []
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - start) / calls * 1e6)
        if sync:
            sync()
    return statistics.median(times)
