"""Per-arch compile checks: every kernel config each op launches compiles for each
target arch within its limits (ids ``test_compile[<op>-<fwd|bwd>-<arch>]``).

Each runs in the process of its own arch's target (``--fla-arch=sm86`` or ``all``) and
is deselected elsewhere; on a CPU machine that process is compile-only.
"""

from pytest_fla.compile_check import test_compile  # noqa: F401
