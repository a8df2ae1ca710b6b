"""Helpers for the plugin's own tests: running the plugin the way a user does."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_fla import targets

GPU = targets.probe_gpu()
needs_gpu = pytest.mark.skipif(GPU is None, reason="needs a CUDA GPU: runs planted faults on the device")
cpu_only = pytest.mark.skipif(GPU is not None, reason="checks the CPU machine's modes (a GPU changes them)")
DEVICE = "cpu" if GPU is None else "cuda"  # where a planted-fault kernel runs in this process
# this repository's root: a project that uses its kernels names it in its ini's pythonpath
# (the installed plugin holds none of them)
REPO = Path(__file__).resolve().parents[2]


def run(pytester, *args, timeout=540):
    """The plugin in a fresh pytest process; no cache or random ordering in the project."""
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args, timeout=timeout)
