"""Observing Triton from the outside: counting launches and reading their grids; timing
compiles and kernel loads.

Every Triton launch goes through ``KernelInterface.__getitem__`` (``kernel[grid]``),
whether the kernel is jitted, autotuned, wrapped in heuristics or interpreted, so that is
where a launch is seen.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field

from .. import environment
from ..report import time_split


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


def _log_compile(path: str, src, options, seconds: float) -> None:
    import hashlib

    try:
        # the source's hash covers the kernel, its signature and constexprs; the options
        # (warps, stages) tell its configs apart
        key = hashlib.sha256(f"{src.hash()} {sorted((options or {}).items())}".encode()).hexdigest()[:32]
        name = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", None)
    except Exception:  # noqa: BLE001 - a diagnostic must not fail the compile it describes
        key = name = None
    line = json.dumps({"pid": os.getpid(), "kernel": name, "key": key, "seconds": round(seconds, 4),
                       "at": round(time.time(), 3)})
    with open(path, "a") as f:  # one short line per write: appends from many processes stay whole
        f.write(line + "\n")


def time_kernels_from_import() -> None:
    """:func:`time_kernels` as soon as Triton is imported (now, if it is already): a test
    suite imports its kernels, and Triton with them, in its first test as often as at
    collection, and only then launches them."""
    if "triton" in sys.modules:
        time_kernels()
    elif not any(isinstance(finder, _AfterTritonImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterTritonImport())


class _AfterTritonImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``triton`` is first imported, it has the module's own
    loader run :func:`time_kernels` right after the module's body, and steps aside."""

    def find_spec(self, name, path, target=None):
        if name != "triton":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then_time(module):
                exec_module(module)
                time_kernels()

            spec.loader.exec_module = exec_then_time
        return spec


_TIMING = False


def time_kernels() -> None:
    """Count every Triton compile and kernel load in this process from now on to
    ``time_split``'s ``compiling`` and ``loading`` (and the compiles, and their cache hits,
    to its counts). Once per process, before the first
    launch: a jitted function keeps the ``compile`` it first launched with. Under the
    interpreter nothing is compiled or loaded, and nothing is counted."""
    global _TIMING
    if _TIMING:
        return
    _TIMING = True
    import triton.compiler as package
    from triton.compiler.compiler import CompiledKernel

    compile_, init_handles = package.compile, CompiledKernel._init_handles
    # a file every timed process appends one JSON line to per compile (pid, kernel, the source's
    # hash, seconds): how often processes compiled the same kernel, a cache miss each
    log_path = os.environ.get(environment.COMPILE_LOG)

    def timed_compile(src, target=None, options=None, **kwargs):
        start = time.perf_counter()
        try:
            return compile_(src, target=target, options=options, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            time_split.add(time_split.COMPILING, seconds)
            if log_path:
                _log_compile(log_path, src, options, seconds)

    def timed_init_handles(self):
        with time_split.part(time_split.LOADING):
            return init_handles(self)

    package.compile = timed_compile  # jit.py imports it from the package at a kernel's first launch
    CompiledKernel._init_handles = timed_init_handles
    _count_compiles()


def _count_compiles() -> None:
    """Count each compile, and those Triton's on-disk cache answered, to ``time_split``
    through Triton's compilation listener (``triton.knobs.compilation.listener``, told of
    every compile with ``cache_hit``), chained to any listener already set. A Triton
    without the knob counts nothing: the seconds are still timed."""
    import triton

    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return
    earlier = compilation.listener

    def counted(**event):
        time_split.add(time_split.COMPILES, 1)
        if event.get("cache_hit"):
            time_split.add(time_split.CACHE_HITS, 1)
        if earlier is not None:
            earlier(**event)

    compilation.listener = counted
