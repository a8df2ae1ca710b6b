"""One compile per kernel across the processes of a run.

Triton's on-disk cache is shared by every process of a run that targets one arch, but a
kernel that two workers need at the same moment is compiled by both: each looks it up,
misses, and compiles. At the start of a GPU run that is the rule, not the exception (16
workers start on the same op's checks; a cold run of chunk_kda's and gated_delta_net's
checks spent 76 of its 129.5 s compiling, benchmarks/results/README.md), and the copies
compete for the same cores. ``install()`` wraps ``triton.compiler.compile`` in a file lock
per kernel source (its ``hash()``: the function, signature, constants and attributes) and
target, next to the cache: the second process waits for the first and then finds its
result in the cache. Different kernels still compile side by side. The same goes for the C
launcher each kernel signature is called through (built with the host compiler on first
use, and cached by its source).

``FLA_COMPILE_LOCK=0`` turns it off. Nothing changes under the interpreter, which does not
compile.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os

OFF_ENV = "FLA_COMPILE_LOCK"
LOCK_DIR = "fla-compile-locks"


def wanted() -> bool:
    return os.environ.get(OFF_ENV) != "0"


def lock_path(src, target, directory: str) -> str:
    """The lock file of one kernel source for one target."""
    name = src.hash() if hasattr(src, "hash") else str(src)
    digest = hashlib.sha256(f"{name}|{target}".encode()).hexdigest()[:32]
    return os.path.join(directory, f"{digest}.lock")


@contextlib.contextmanager
def held(path: str):
    """An exclusive ``flock`` on ``path`` (created if missing) for the block."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def locked(compile_fn, directory: str):
    """``compile_fn`` behind a lock per kernel source and target in ``directory``."""

    def compile(src, target=None, options=None, *args, **kwargs):
        os.makedirs(directory, exist_ok=True)
        with held(lock_path(src, target, directory)):
            return compile_fn(src, target, options, *args, **kwargs)

    compile.fla_locked = True
    compile.__wrapped__ = compile_fn
    return compile


def locked_build(build_fn, directory: str):
    """``build_fn(src, name, ...)`` (the C launcher a compiled kernel is called through,
    built with the host compiler and cached by its source) behind a lock per source."""

    def build(src, name, *args, **kwargs):
        os.makedirs(directory, exist_ok=True)
        with held(lock_path(f"{name}:{src}", "host", directory)):
            return build_fn(src, name, *args, **kwargs)

    build.fla_locked = True
    build.__wrapped__ = build_fn
    return build


def cache_dir() -> str:
    """Triton's cache directory in this process."""
    try:
        from triton import knobs

        return knobs.cache.dir
    except (ImportError, AttributeError):  # before knobs: the environment, or Triton's default
        return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def install() -> bool:
    """Wrap this process's ``triton.compiler.compile`` (once). False where it is not
    wanted, or this Triton has no such function."""
    if not wanted():
        return False
    try:
        import triton
        import triton.compiler as compiler
    except ImportError:
        return False
    original = getattr(compiler, "compile", None)
    if original is None or getattr(original, "fla_locked", False):
        return False
    directory = os.path.join(cache_dir(), LOCK_DIR)
    wrapped = locked(original, directory)
    compiler.compile = wrapped  # what @triton.jit launches import when they first run
    if getattr(triton, "compile", None) is original:
        triton.compile = wrapped  # the offline compile checks' (pytest_fla/capture.py)
    try:  # the launchers, on a machine with the CUDA backend
        from triton.backends.nvidia import driver
    except Exception:  # noqa: BLE001 - no CUDA backend: nothing to build launchers for
        return True
    build = getattr(driver, "compile_module_from_src", None)
    if build is not None and not getattr(build, "fla_locked", False):
        driver.compile_module_from_src = locked_build(build, directory)
    return True
