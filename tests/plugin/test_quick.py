"""``--fla-quick`` (``pytest_fla/collection/quick.py``): each check once per op, every error input,
no test of no op; and the ``run`` compile scope, each kernel compiled once per arch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from plugin_testing import cpu_only, run
from test_external_specs import project

REPO = Path(__file__).resolve().parents[2]
NOT_AN_OP_TEST = "def test_plain():\n    pass\n"


def _collected(pytester, *args) -> list[str]:
    result = run(pytester, "--co", "-q", *args)
    return [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]


@cpu_only
def test_quick_keeps_each_check_once_per_op_and_every_error_input(pytester):
    project(pytester)
    pytester.makepyfile(test_plain=NOT_AN_OP_TEST)
    everything = _collected(pytester)
    quick = _collected(pytester, "--fla-quick")
    assert "test_plain" in everything and "test_plain" not in quick
    for check in ("test_forward", "test_backward", "test_every_output_written"):
        for op in ("scale", "scale_forgets_the_last_token"):
            mine = [t for t in everything if t.startswith(f"{check}[{op}-") or t == f"{check}[{op}]"]
            kept = [t for t in quick if t in mine]
            assert kept == mine[:1], (check, op, kept)
    errors = [t for t in everything if t.startswith("test_error_inputs[")]
    assert errors and all(t in quick for t in errors)
    assert "test_forward[scale-fp32-small]" in quick  # the first case, in fp32


@cpu_only
def test_quick_run_passes_and_prints_the_matrix(pytester):
    project(pytester)
    result = run(pytester, "--fla-quick", "--fla-ops=scale")
    # forward, backward, 3 error inputs, 2 device mismatches, every output written; the\n    # deterministic check skips (only a GPU reorders programs)\n    result.assert_outcomes(passed=8, skipped=1)
    assert "fla: ops x checks per arch" in result.stdout.str()


RUN_SCOPE = """
import torch
from kernels import l2norm
from pytest_fla.checks.capture import capture_launches, check_launches

with capture_launches(90) as recorder:
    l2norm(torch.randn(2, 8, 64))
compiled_before = set()
first = check_launches(recorder.launches, 90, per_kernel=True, compiled_before=compiled_before)
assert first.compiled >= 1 and not first.problems, first
assert compiled_before == {(90, launch.kernel_key()) for launch in recorder.launches}
again = check_launches(recorder.launches, 90, per_kernel=True, compiled_before=compiled_before)
assert again.compiled == 0, again  # compiled by the first call: not again
other_arch = check_launches(recorder.launches, 80, per_kernel=True, compiled_before=compiled_before)
assert other_arch.compiled == first.compiled, other_arch
"""


def test_the_run_scope_compiles_each_kernel_once_per_arch():
    # in a process of its own: launches are captured for offline compiles only outside the
    # interpreter, which this test's process may be under
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", RUN_SCOPE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
