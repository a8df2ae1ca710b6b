"""pytest-fla's stable API: what another repository imports to describe its ops.

Everything a spec module needs is here; names not listed in ``__all__`` (and modules
not named in ``docs/plugin-api.md``) may change between versions. Importing this module
imports torch, never triton, and initialises no GPU.

A repository registers its specs with the ``pytest_fla_specs`` hook in a ``conftest.py``
and imports the checks into a test module::

    # conftest.py
    def pytest_fla_specs(config):
        from mylib_specs import SPECS
        return SPECS

    # tests/test_conformance.py
    from pytest_fla.conformance import *  # noqa: F401,F403
"""

from __future__ import annotations

from .ops.builders import (
    GRID_AXIS_LIMIT,
    HUGE_GRID_DIMS,
    INT64_DIMS,
    LOW_PRECISION_STATES,
    huge_grid_dims,
    linear_attention_spec,
    op_spec,
)
from .ops.error_inputs import (
    VARLEN_MESSAGES,
    ErrorFactory,
    chain_errors,
    dtype_errors,
    linear_attention_errors,
    scale_errors,
    shape_errors,
    state_dtype_errors,
    varlen_errors,
    with_args,
    wrong_device,
    zero_heads_errors,
    zero_width_errors,
)
from .ops.inputs import GATE_NORMALIZER, Arg, cu_seqlens_for, draw, make_factory
from .ops.packings import Packing, packings
from .ops.spec import Case, ErrorInput, OpSpec, Sample, SampleFactory
from .checks.tolerance import AGREEMENT, BACKWARD, FORWARD, Tolerance, assert_close
from .checks.tolerance import errors as measured_errors

__all__ = [
    # describing an op
    "OpSpec",
    "Case",
    "Sample",
    "SampleFactory",
    "op_spec",
    "linear_attention_spec",
    "LOW_PRECISION_STATES",
    # its inputs
    "Arg",
    "make_factory",
    "draw",
    "cu_seqlens_for",
    "GATE_NORMALIZER",
    "Packing",
    "packings",
    # its error inputs
    "ErrorInput",
    "ErrorFactory",
    "chain_errors",
    "dtype_errors",
    "shape_errors",
    "varlen_errors",
    "state_dtype_errors",
    "scale_errors",
    "zero_heads_errors",
    "zero_width_errors",
    "linear_attention_errors",
    "with_args",
    "wrong_device",
    "VARLEN_MESSAGES",
    # grid sizes
    "huge_grid_dims",
    "HUGE_GRID_DIMS",
    "INT64_DIMS",
    "GRID_AXIS_LIMIT",
    # the tolerance rule
    "assert_close",
    "measured_errors",
    "Tolerance",
    "FORWARD",
    "BACKWARD",
    "AGREEMENT",
]
