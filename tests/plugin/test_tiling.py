"""The int64-offsets check builds its 2**31-element batch by tiling a small sample: every
batch-dimension tensor repeats, everything else stays as it is."""

from __future__ import annotations

import torch

from pytest_fla.checks.generic import _tiled
from specs import all_specs


def test_tiling_repeats_batch_tensors_only():
    spec = next(s for s in all_specs() if s.name == "chunk_simple_gla")
    case = next(c for c in spec.cases if c.options.get("g_gamma"))
    sample = spec.sample(case, "fp32", "cpu", 0)
    tiled = _tiled(spec, sample, 3)
    for name, value in sample.kwargs.items():
        other = tiled.kwargs[name]
        if not isinstance(value, torch.Tensor):
            assert other == value, name
        elif spec.args[name].layout[0] in ("B", "N"):
            assert other.shape[0] == 3 * value.shape[0], name
            assert torch.equal(other[value.shape[0] : 2 * value.shape[0]], value), name
        else:
            assert other is value, name  # a per-head gate, say: not tiled
