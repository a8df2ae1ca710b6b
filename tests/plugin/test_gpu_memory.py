"""The clause a 2**31-element check's skip adds when it finds too little memory free while
alone on its GPU: what the other processes hold (from ``nvidia-smi``), so that a run's
report says where the memory went. ``nvidia-smi`` is replaced by canned output here."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

from pytest_fla.gpu_memory import other_holders


def _nvidia_smi(stdout: str = "", error: Exception | None = None):
    calls = []

    def run(args, **kwargs):
        calls.append(args)
        if error is not None:
            raise error
        return SimpleNamespace(stdout=stdout)
    return run, calls


def test_other_processes_are_summed_and_this_one_left_out():
    run, calls = _nvidia_smi(f"{os.getpid()}, 40000\n101, 2048\n102, 1024\n103, 512\n")
    assert other_holders("3", run) == "; 3 other processes hold 4 GiB (the largest 2.0 GiB)"
    assert "--id=3" in calls[0]


def test_nothing_to_say_where_nvidia_smi_cannot_tell():
    for stdout in ("", "[N/A], [N/A]\n", "No running processes found\n"):
        assert other_holders("0", _nvidia_smi(stdout)[0]) == ""
    assert other_holders("0", _nvidia_smi(error=FileNotFoundError("nvidia-smi"))[0]) == ""
    assert other_holders("0", _nvidia_smi(error=subprocess.TimeoutExpired("nvidia-smi", 10))[0]) == ""
