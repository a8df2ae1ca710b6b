"""Where a test's own time goes: seconds in named parts of its work, summed over the
process's life (compiling kernels and loading them, timed from Triton's import on by
``launches.time_kernels``; drawing a sample's inputs, by ``OpSpec.sample``; the float64
reference, by the checks).

Each test's share is the parts' growth while it ran, recorded by the plugin's
``pytest_runtest_call`` in an isolated child (always: its parent reports it) and in any
other process under ``--fla-report``. The run's report sums them, beside the children's
start-up and exit, so that a slow run says what its cores did.
"""

from __future__ import annotations

import contextlib
import time

COMPILING, LOADING, INPUTS, REFERENCE = "compiling", "loading", "inputs", "reference"
# How the report names each part
LABELS = {COMPILING: "compiling kernels", LOADING: "loading kernels", INPUTS: "drawing inputs",
          REFERENCE: "the float64 reference"}
# Counted beside the seconds, not seconds themselves: Triton's compiles (each a kernel the
# process had not compiled in memory), and of those the ones Triton's on-disk cache answered
# (what a warm cache or an earlier process saves; the rest were compiled from source)
COMPILES, CACHE_HITS = "compiles", "compiles_from_cache"
COUNTS = (COMPILES, CACHE_HITS)

_SPENT: dict[str, float] = {}


def add(name: str, seconds: float) -> None:
    """Add ``seconds`` to the part ``name`` (for one of :data:`COUNTS`, a count)."""
    _SPENT[name] = _SPENT.get(name, 0.0) + seconds


def compiles_text(spent: dict) -> str | None:
    """"3 compiles, 1 of them from Triton's cache" from summed parts; None without compiles."""
    compiles = round(spent.get(COMPILES, 0))
    if not compiles:
        return None
    return f"{compiles} compile{'s' if compiles != 1 else ''}, {round(spent.get(CACHE_HITS, 0))} of them from Triton's cache"


@contextlib.contextmanager
def part(name: str):
    """Count the block's wall time to ``name`` (an inner part counts to both)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - start)


def totals() -> dict[str, float]:
    return dict(_SPENT)


def since(before: dict[str, float]) -> dict[str, float]:
    """Each part's seconds since ``before`` (an earlier :func:`totals`), rounded; parts
    that did not grow are left out."""
    grown = {name: round(seconds - before.get(name, 0.0), 3) for name, seconds in _SPENT.items()}
    return {name: seconds for name, seconds in grown.items() if seconds > 0}
