"""Every kernel config compiled offline for each arch target (``--fla-arch=all``)."""

from pytest_fla.compile_check import test_compile  # noqa: F401
