"""What this project's spec modules share: the public spec API (``pytest_fla.api``,
re-exported here) and the argument declarations and arch notes of this repo's kernels.

Spec modules import from here or from ``pytest_fla.api``; both stay.
"""

from __future__ import annotations

from .. import api
from ..api import *  # noqa: F401,F403 - the spec API, for `from .common import ...`
from ..api import Arg

STATE = Arg(("N", "H", "K", "V"), "state", optional=True)
STATE_GVA = Arg(("N", "HV", "K", "V"), "state", optional=True)

# for ops whose chunk kernels need sm80's shared memory (kernels raise on older targets)
SM80_AND_NEWER = (80, "the chunk kernels' [64, K] tiles exceed sm75's 64 KB of shared memory")

__all__ = [*api.__all__, "STATE", "STATE_GVA", "SM80_AND_NEWER"]
