"""What this project's spec modules share: the public spec API (``pytest_fla.api``,
re-exported here) and the argument declarations and arch notes of this repo's kernels.

Spec modules import from here or from ``pytest_fla.api``; both stay.
"""

from __future__ import annotations

import dataclasses
import functools

from pytest_fla import api
from pytest_fla.api import *  # noqa: F401,F403 - the spec API, for `from .common import ...`
from pytest_fla.api import Arg, ErrorInput, chain_errors, linear_attention_errors

# this repo's q/k/v recurrences: kernels.<name>, checked against reference.<family>
linear_attention_spec = functools.partial(api.linear_attention_spec, op_package="kernels", reference_package="reference")

STATE = Arg(("N", "H", "K", "V"), "state", optional=True)
STATE_GVA = Arg(("N", "HV", "K", "V"), "state", optional=True)

# for ops whose chunk kernels need sm80's shared memory (kernels raise on older targets)
SM80_AND_NEWER = (80, "the chunk kernels' [64, K] tiles exceed sm75's 64 KB of shared memory")

# the delta rules walk the value dim in blocks and take V up to this
MAX_DELTA_VALUE_DIM = 512


def _value_dim_past_range(spec, device):
    too_large = MAX_DELTA_VALUE_DIM + 1
    # explicit dims on every device: a case's GPU dims would put the value dim back in range
    case = dataclasses.replace(spec.cases[0].with_dims(V=too_large), gpu_dims=None)
    yield ErrorInput(f"value_head_dim_{too_large}", spec.sample(case, "fp32", device).kwargs, ValueError,
                     f"value head dim.*{too_large}.*supported range")


# a delta rule's error inputs: every recurrent op's, and a value dim one past its range
DELTA_RULE_ERRORS = chain_errors(linear_attention_errors(), _value_dim_past_range)

__all__ = [*api.__all__, "STATE", "STATE_GVA", "SM80_AND_NEWER", "DELTA_RULE_ERRORS"]
