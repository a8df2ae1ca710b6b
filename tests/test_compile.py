"""Per-arch compile checks: every kernel config each op launches compiles for each
target arch within its limits (ids ``test_compile[<op>-<fwd|bwd>-<arch>]``).

Each runs in the process of its own arch's target (``--fla-arch=sm86`` or ``all``) and
is deselected elsewhere; on a CPU machine that process is compile-only.
"""

from __future__ import annotations

import pytest

from pytest_fla.compile_check import check_op_compiles, compile_params
from pytest_fla.specs import all_specs


@pytest.mark.parametrize("spec,direction,arch", compile_params(all_specs()))
def test_compile(spec, direction, arch):
    result = check_op_compiles(spec, direction, arch)
    print(result.summary())
