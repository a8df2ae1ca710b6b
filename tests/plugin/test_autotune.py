"""--fla-autotune=first and --fla-dist=op: each autotuned kernel compiled at one config per
key, and each op's kernels compiled on one xdist worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import defaultdict

import pytest
from plugin_testing import run

from pytest_fla.running.distribute import op_key

# Three configs of one kernel: the first cannot fit (its hook raises what Triton raises for a
# config over the shared memory, which the autotuner skips), the second runs, the third must
# be neither run nor compiled. Under the interpreter the kernel runs on the CPU; the patched
# autotuner runs configs as it would on a GPU.
FIRST_THAT_RUNS = textwrap.dedent('''
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    from triton.runtime.errors import OutOfResources
    from pytest_fla.targets import autotune

    assert autotune.install_first_that_runs()
    tried = []

    def hook(block):
        def pre_hook(nargs):
            tried.append(block)
            if block == 64:
                raise OutOfResources(200000, 101376, "shared memory")
        return pre_hook

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=hook(b)) for b in (64, 32, 16)], key=["n"])
    @triton.jit
    def fill(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.full([BLOCK], BLOCK, tl.int32), mask=offs < n)

    out = torch.zeros(8, dtype=torch.int32)
    fill[(1,)](out, 8)
    assert out.tolist() == [32] * 8, out.tolist()
    assert tried == [64, 32, 32], tried  # the pass (64 skipped, 32 ran), then the call at 32
    assert not fill.cache_results  # a first-config pass never reaches the disk cache
    fill[(1,)](out, 8)
    assert tried == [64, 32, 32, 32], tried  # the same key: no second pass
    fill[(1,)](out, 4)
    assert tried == [64, 32, 32, 32, 64, 32, 32], tried  # a new key: a new pass, in order
    print("ok")
''')


def test_first_config_that_runs_is_chosen_and_no_later_one_is_tried():
    result = subprocess.run([sys.executable, "-c", FIRST_THAT_RUNS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def test_op_keys_group_an_op_in_one_dtype_across_checks():
    assert op_key("tests/test_conformance.py::test_varlen[chunk_gla-many_short-fp32]") == "chunk_gla[fp32]"
    assert op_key("tests/test_conformance.py::test_forward[chunk_gla-fp32-strong_decay]") == "chunk_gla[fp32]"
    assert op_key("tests/test_conformance.py::test_forward[chunk_gla-bf16-strong_decay]") == "chunk_gla[bf16]"
    assert op_key("tests/test_conformance.py::test_huge_grid[chunk_gla]") == "chunk_gla[]"
    assert op_key("tests/peer/repro/fla_causal_conv1d_dx_short_sequence.py::test_repro") == "tests/peer/repro/fla_causal_conv1d_dx_short_sequence.py"


OPS_PROJECT = '''
import os, pytest

# the op first in each test id (the decorator nearest the function), as the conformance suite's
@pytest.mark.parametrize("check", ["forward", "backward", "varlen"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op", ["alpha", "beta", "gamma"])
def test_check(op, dtype, check):
    with open(os.environ["FLA_TEST_RUN_LOG"], "a") as f:
        f.write(f"{op}-{dtype} {os.environ['PYTEST_XDIST_WORKER']}\\n")
'''


@pytest.mark.parametrize("dist", ["op", "test"])
def test_dist_op_runs_each_op_and_dtype_on_one_worker(pytester, monkeypatch, dist):
    """And xdist's own load scheduling (``test``) spreads them: the check can fail."""
    log = pytester.path / "runs.log"
    monkeypatch.setenv("FLA_TEST_RUN_LOG", str(log))
    pytester.makepyfile(test_ops=OPS_PROJECT)
    result = run(pytester, "-n", "3", f"--fla-dist={dist}", "-p", "no:randomly")
    result.assert_outcomes(passed=18)
    workers = defaultdict(set)
    for line in log.read_text().split("\n"):
        if line:
            unit, worker = line.split()
            workers[unit].add(worker)
    assert len(workers) == 6
    if dist == "test":
        assert any(len(w) > 1 for w in workers.values()), dict(workers)
        return
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert len(set().union(*workers.values())) > 1  # and the units spread over the workers
    assert "fla dist: each xdist worker runs whole ops" in result.stdout.str()
