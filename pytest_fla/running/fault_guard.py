"""A device fault in a run without isolation: the tests after it are not run, not failed.

A device fault (an illegal address, a device-side assert) leaves the process's CUDA context
unusable, and every later test in that process fails for no fault of its own: under
``--fla-isolate=none`` one bad call (the peer library's ``cu_seqlens`` past ``T`` reading
out of bounds) would read as a crash of every op that worker ran after it. Here the test in
which the device faulted fails with the fault (found at the synchronize after it, whether or
not the test noticed), and each later test of the process is skipped, naming that test.
``--fla-isolate=batch`` runs them in a fresh process instead.
"""

from __future__ import annotations

import pytest

from .isolation import DeviceFault, device_fault

SKIP_REASON = "not run: this process's CUDA context was lost to a device fault in "


class FaultGuard:
    def __init__(self):
        self.faulted_in: str | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if self.faulted_in is not None:
            pytest.skip(f"{SKIP_REASON}{self.faulted_in} (--fla-isolate=batch runs each batch in a fresh process)")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        try:
            result = yield
        except BaseException:
            if device_fault():
                self.faulted_in = item.nodeid
            raise
        fault = device_fault()
        if fault:
            self.faulted_in = item.nodeid
            raise DeviceFault(f"the device faulted during this test (found at the synchronize after it): {fault}")
        return result
