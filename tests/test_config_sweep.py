"""``benchmarks/config_sweep.py``'s variants, checked on the CPU before any GPU time is spent
on them: each patches attributes that exist, and puts them back."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import config_sweep  # noqa: E402

VARIANTS = [(op, label) for op, table in config_sweep.VARIANTS.items() for label in table]


@pytest.mark.parametrize("op,label", VARIANTS, ids=[f"{op}:{label}" for op, label in VARIANTS])
def test_a_variant_patches_what_exists_and_restores_it(op, label):
    patches = config_sweep._patches(config_sweep.variants_of(op)[label])
    before = {}
    for module, attr, _ in patches:
        mod = importlib.import_module(module)
        assert hasattr(mod, attr), f"{module}.{attr}"
        before[(module, attr)] = getattr(mod, attr)
    undo = config_sweep.apply(op, label)
    try:
        for module, attr, _ in patches:
            assert getattr(importlib.import_module(module), attr) is not before[(module, attr)]
    finally:
        config_sweep._restore(undo)
    for (module, attr), value in before.items():
        assert getattr(importlib.import_module(module), attr) is value


def test_a_norm_backward_tile_variant_leaves_the_tile_without_parameter_gradients():
    """The backward's tile variants apply where a parameter gradient is summed; l2norm's tile
    (none to sum) is its own."""
    import kernels.norm as norm

    plain = norm._backward_tile(128, False)
    undo = config_sweep.apply("rms_norm_gated", "bwd tile 1024, 1 warp")
    try:
        assert norm._backward_tile(128, True, True) == (8, 128, 1)
        assert norm._backward_tile(128, False) == plain
    finally:
        config_sweep._restore(undo)
    assert norm._backward_tile(128, True, True) == (32, 128, 4)  # the default: 4096 values, 32 a thread
