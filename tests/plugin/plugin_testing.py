"""Helpers for the plugin's own tests: running the plugin the way a user does."""

from __future__ import annotations

import pytest

from pytest_fla import targets

GPU = targets.probe_gpu()
needs_gpu = pytest.mark.skipif(GPU is None, reason="needs a CUDA GPU: runs planted faults on the device")
cpu_only = pytest.mark.skipif(GPU is not None, reason="checks the CPU machine's modes (a GPU changes them)")
DEVICE = "cpu" if GPU is None else "cuda"  # where a planted-fault kernel runs in this process


def _interpreter_numpy_clash() -> str | None:
    """Why Triton's interpreter cannot run this repository's kernels here, or None: Triton
    3.6's interpreter fails on numpy >= 2.4 ("only 0-dimensional arrays can be converted to
    Python scalars", at a loop bound such as ``tl.cdiv(n, B).to(tl.int32)``); 3.8 works
    (ci/setup.sh pins numpy < 2.4 beside 3.6; a GPU machine may have a newer one)."""
    import numpy
    import triton

    version = lambda text: tuple(int(p) for p in text.split(".")[:2])  # noqa: E731
    if version(triton.__version__) < (3, 8) and version(numpy.__version__) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter fails on numpy {numpy.__version__} (>= 2.4) "
                "at this repository's loop bounds")
    return None


needs_kernel_interpreter = pytest.mark.skipif(_interpreter_numpy_clash() is not None,
                                              reason=_interpreter_numpy_clash() or "")


def run(pytester, *args, timeout=540):
    """The plugin in a fresh pytest process; no cache or random ordering in the project."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args, timeout=timeout)
