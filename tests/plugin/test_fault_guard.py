"""Without isolation, a device fault fails its own test and the process's later tests are
skipped, each naming the test that faulted, instead of failing for no fault of their own."""

from __future__ import annotations

import re

from plugin_testing import run

# torch.cuda.synchronize() raising once the context is lost is what device_fault() reads on a
# GPU; here the lost context is a flag the faulting test sets
CONFTEST = '''
import pytest
from pytest_fla.running import fault_guard

LOST = []
fault_guard.device_fault = lambda: "CUDA error: an illegal memory access was encountered" if LOST else None

@pytest.fixture
def lose_the_context():
    LOST.append(True)
'''

PROJECT = '''
def test_before():
    pass

def test_faults_without_noticing(lose_the_context):
    pass

def test_after():
    pass

def test_after_too():
    pass
'''


def test_a_fault_fails_its_test_and_skips_the_rest(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_faults=PROJECT)
    result = run(pytester, "--fla-isolate=none", "-p", "no:xdist", "-p", "no:randomly", "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=2)
    out = result.stdout.str()
    assert "the device faulted during this test (found at the synchronize after it): CUDA error: an illegal" in out
    # -rs folds the two identical skips into one line: [2]
    assert re.search(r"SKIPPED \[2\] .*not run: this process's CUDA context was lost to a device fault in "
                     r"test_faults.py::test_faults_without_noticing", out), out


def test_device_fault_reads_a_lost_context_and_nothing_without_a_device(monkeypatch):
    """A CUDA error at the synchronize is the fault's text; a process with no device (one whose
    test fakes an initialized CUDA, as test_gpu_memory does) has no context to lose."""
    import torch

    from pytest_fla.running.isolation import device_fault

    def lost():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    # undone before the test ends: the plugin's own teardown must see this machine as it is
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_initialized", lambda: True)
        patch.setattr(torch.cuda, "synchronize", lost)
        patch.setattr(torch.cuda, "is_available", lambda: False)
        assert device_fault() is None
        patch.setattr(torch.cuda, "is_available", lambda: True)
        assert device_fault() == "CUDA error: an illegal memory access was encountered"
        patch.setattr(torch.cuda, "synchronize", lambda: None)
        assert device_fault() is None
