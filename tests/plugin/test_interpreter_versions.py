"""A user's valid kernels run under the interpreter of every Triton in the plugin's range
(``pytest_fla/targets/interpreter_versions.py``): each kernel below failed on some Triton
of 3.6 to 3.9 without the plugin, and runs with the right answer on each with it. The same
assertions hold on every Triton: what differs between them is only which fixes the probes
install, and the checks below tie each installed fix to a kernel that needs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_testing import cpu_only, run

from pytest_fla.targets import interpreter_versions

# A user's own tests of their own kernels: the plugin is loaded (its entry point) and
# nothing of it is imported. Each test's name says which fix it needs where one is needed.
USER_KERNELS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def gather_live_kernel(x, cu, y, BLOCK: tl.constexpr):
    """Each program copies x's first three values if it is past the first cu value."""
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + cols, mask=(cols < 3) & (tl.program_id(0) > tl.load(cu)), other=0.0)
    tl.store(y + tl.program_id(0) * BLOCK + cols, v)


def test_masks__block_mask_and_scalar_comparison_of_a_loaded_value():
    x = torch.arange(8, dtype=torch.float32) + 1
    y = torch.full((2, 8), -1.0)
    gather_live_kernel[(2,)](x, torch.tensor([0], dtype=torch.int32), y, BLOCK=8)
    expected = torch.zeros(2, 8)
    expected[1, :3] = x[:3]
    assert torch.equal(y, expected)


@triton.jit
def scalar_mask_kernel(x, y, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    live = tl.program_id(0) < n
    tl.store(y + tl.program_id(0) * BLOCK + cols, tl.load(x + cols, mask=live, other=-1.0))
    tl.atomic_add(y + 2 * BLOCK + cols, 1.0, mask=live)


def test_masks__scalar_mask_on_a_block_load_and_atomic():
    x = torch.arange(4, dtype=torch.float32) + 1
    y = torch.zeros(3, 4)
    scalar_mask_kernel[(2,)](x, y, 1, BLOCK=4)
    assert y.tolist() == [x.tolist(), [-1.0] * 4, [1.0] * 4]


@triton.jit
def varlen_scale_kernel(x, y, cu, H: tl.constexpr, D: tl.constexpr):
    """Per sequence of a packed batch: its rows times (sequence index + 1), a 2-D block
    masked by the heads, the head dim and the loaded sequence end."""
    i_n = tl.program_id(0)
    bos = tl.load(cu + i_n).to(tl.int64)
    eos = tl.load(cu + i_n + 1).to(tl.int64)
    h = tl.arange(0, H)[:, None]
    d = tl.arange(0, D)[None, :]
    for t in range(bos, eos):
        m = (h < H - 1) & (d < D) & (t < eos)
        b = tl.load(x + t * H * D + h * D + d, mask=m, other=0.0)
        tl.store(y + t * H * D + h * D + d, b * (i_n + 1), mask=m)


def test_masks__varlen_rows_of_a_packed_batch():
    x = torch.arange(5 * 4 * 4, dtype=torch.float32).reshape(5, 4, 4)
    y = torch.full_like(x, -1.0)
    varlen_scale_kernel[(2,)](x, y, torch.tensor([0, 2, 5], dtype=torch.int32), H=4, D=4)
    expected = x.clone()
    expected[2:] *= 2
    expected[:, 3] = -1.0  # the last head is masked out of every load and store
    assert torch.equal(y, expected)


@triton.jit
def mask_algebra_kernel(x, cu, y, BLOCK: tl.constexpr):
    """The negation, a where and a count of a block mask and'ed with a scalar one."""
    cols = tl.arange(0, BLOCK)
    m = (cols < 3) & (tl.program_id(0) > tl.load(cu))
    row = y + tl.program_id(0) * 3 * BLOCK
    tl.store(row + cols, tl.load(x + cols, mask=~m, other=0.0))
    tl.store(row + BLOCK + cols, tl.where(tl.where(cols < 2, m, cols < 4), 1.0, 0.0))
    tl.store(row + 2 * BLOCK + cols, tl.sum(m.to(tl.float32), axis=0), mask=m | (cols == 7))


def test_masks__negated_selected_and_counted():
    x = torch.arange(8, dtype=torch.float32) + 1
    y = torch.zeros(2, 3, 8)
    mask_algebra_kernel[(2,)](x, torch.tensor([0], dtype=torch.int32), y, BLOCK=8)
    live = torch.arange(8) < 3
    assert y[0, 0].tolist() == x.tolist() and torch.equal(y[1, 0], torch.where(live, 0.0, x))
    assert y[0, 1].tolist() == [0, 0, 1, 1, 0, 0, 0, 0] and y[1, 1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert y[0, 2].tolist() == [0] * 7 + [0.0] and y[1, 2].tolist() == [3, 3, 3, 0, 0, 0, 0, 3]


@triton.jit
def flagged_copy_kernel(x, y, everything, BLOCK: tl.constexpr):
    """Copies x's first two values, or all of them where ``everything`` (a bool argument)."""
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + cols, mask=(cols < 2) | everything, other=0.0)
    if everything:
        v = v + 100.0
    tl.store(y + cols, v)


def test_bool_arguments__in_a_mask_and_a_branch():
    x = torch.arange(4, dtype=torch.float32) + 1
    some, all_ = torch.zeros(4), torch.zeros(4)
    flagged_copy_kernel[(1,)](x, some, False, BLOCK=4)
    flagged_copy_kernel[(1,)](x, all_, True, BLOCK=4)
    assert some.tolist() == [1.0, 2.0, 0.0, 0.0] and all_.tolist() == (x + 100).tolist()


@triton.jit
def blocked_sum_kernel(x, y, n, BLOCK: tl.constexpr):
    """Sums x in blocks, over a loop whose bound is a scalar computed in the kernel."""
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, tl.cdiv(n, BLOCK).to(tl.int32)):
        acc += tl.load(x + i * BLOCK + cols, mask=i * BLOCK + cols < n, other=0.0)
    tl.store(y + cols, acc)


def test_scalar_index__a_loop_bound_computed_in_the_kernel():
    x = torch.arange(10, dtype=torch.float32)
    y = torch.zeros(4)
    blocked_sum_kernel[(1,)](x, y, 10, BLOCK=4)
    assert y.tolist() == [12.0, 15.0, 8.0, 10.0]
'''

MASK, ARGUMENT, INDEX = interpreter_versions.MASK_FIX, interpreter_versions.ARGUMENT_FIX, interpreter_versions.INDEX_FIX
# the fixes each user test's kernel needs, where they are needed
NEEDS = {
    "test_masks__block_mask_and_scalar_comparison_of_a_loaded_value": {MASK},
    "test_masks__scalar_mask_on_a_block_load_and_atomic": {MASK},
    "test_masks__varlen_rows_of_a_packed_batch": {MASK, INDEX},  # its loop runs over loaded bounds
    "test_masks__negated_selected_and_counted": {MASK},
    "test_bool_arguments__in_a_mask_and_a_branch": {ARGUMENT},
    "test_scalar_index__a_loop_bound_computed_in_the_kernel": {INDEX},
}


def outcomes(result) -> dict[str, str]:
    """Each user test's outcome, from a ``-v`` run's lines."""
    found = {}
    for line in result.stdout.lines:
        if "test_user_kernels.py::" in line and (" PASSED" in line or " FAILED" in line):
            name = line.split("::")[1].split()[0]
            found[name] = "passed" if " PASSED" in line else "failed"
    return found


@pytest.fixture(scope="module")
def needed_fixes() -> list[str]:
    """The fixes this Triton's interpreter needs, by the plugin's probes in a fresh process
    (this one's interpreter may be patched already)."""
    probe = subprocess.run([sys.executable, "-c", "from pytest_fla.targets import interpreter_versions as v; "
                            "print('|'.join(v.needed()))"], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return [name for name in probe.stdout.strip().split("|") if name]


@cpu_only
def test_the_users_kernels_run_with_the_plugin_on_this_triton(pytester, monkeypatch, needed_fixes):
    """And the header names the fixes installed (none where this Triton needs none)."""
    pytester.makepyfile(test_user_kernels=USER_KERNELS)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result = run(pytester, "-v")
    out = result.stdout.str()
    found = outcomes(result)
    assert found == {name: "passed" for name in NEEDS}, out
    header = [line for line in result.stdout.lines if line.startswith("fla interpreter versions:")]
    assert len(header) == (1 if needed_fixes else 0), out
    assert all(fix in header[0] for fix in needed_fixes), out


@cpu_only
def test_each_fix_installed_is_one_a_kernel_needs(pytester, monkeypatch, needed_fixes):
    """Without the plugin, a kernel fails exactly where this interpreter lacks its fix: the
    probes install nothing that this Triton runs without, and miss nothing it fails."""
    pytester.makepyfile(test_user_kernels=USER_KERNELS)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result = run(pytester, "-v", "-p", "no:fla")
    found = outcomes(result)
    out = result.stdout.str()
    assert found == {name: "failed" if fixes & set(needed_fixes) else "passed" for name, fixes in NEEDS.items()}, \
        (needed_fixes, out)
    if MASK in needed_fixes:
        assert "mask has unsupported dtype" in out, out
    if ARGUMENT in needed_fixes:
        assert "exceeds dtype primitive_bitwidth (1 bits)" in out, out
    if INDEX in needed_fixes:
        assert "only 0-dimensional arrays can be converted to Python scalars" in out, out


BLOCK_POINTERS = '''
import torch
import triton
import triton.language as tl


@triton.jit
def doubled_kernel(x, y, M: tl.constexpr, N: tl.constexpr):
    src = tl.make_block_ptr(x, shape=(M, N), strides=(N, 1), offsets=(0, 0), block_shape=(M, N), order=(1, 0))
    dst = tl.make_block_ptr(y, shape=(M, N), strides=(N, 1), offsets=(0, 0), block_shape=(M, N), order=(1, 0))
    tl.store(dst, tl.load(src) * 2)


def test_block_pointers():
    x = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    y = torch.zeros(4, 4)
    doubled_kernel[(1,)](x, y, M=4, N=4)
    assert torch.equal(y, 2 * x)
'''


@cpu_only
def test_a_kernel_with_block_pointers_runs_or_is_told_they_are_gone(pytester, monkeypatch):
    """Block pointers left the language in Triton 3.9 (on a GPU too), so no fix: where the
    installed Triton has them the kernel gives the right answer, and where it has not the
    failure says so in Triton's words."""
    import triton.language as tl

    pytester.makepyfile(test_block_pointers=BLOCK_POINTERS)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    result = run(pytester, "-q")
    if hasattr(tl, "advance"):  # the language still has block pointers
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        assert "Block pointers have been removed in favor of the tensor descriptor API" in result.stdout.str()


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "token_cumsum"
# the example's scan load, and the same load also masked by its token's place in the
# sequence: a block mask and'ed with a scalar comparison of a loaded bound (true for every
# token the loop reaches, so the sums are unchanged)
EXAMPLE_LOAD = "acc += tl.load(inp + offset, mask=mask, other=0.0)"
EXAMPLE_LOAD_MASKED_BY_THE_BOUND = "acc += tl.load(inp + offset, mask=mask & (t < eos), other=0.0)"


@cpu_only
def test_a_repositorys_op_whose_kernel_masks_by_a_loaded_bound_passes_its_checks(tmp_path):
    """The shape the mask case came in: another repository's op, described with
    ``pytest_fla.api`` (the example package), whose kernel masks its loads by a block mask
    and'ed with a scalar comparison of a ``cu_seqlens`` value; its forward, backward and
    varlen checks under the interpreter, on this Triton."""
    project = tmp_path / "token_cumsum"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    op = project / "token_cumsum" / "op.py"
    source = op.read_text()
    assert source.count(EXAMPLE_LOAD) == 1, "the example's scan load changed: update this test's rewrite"
    op.write_text(source.replace(EXAMPLE_LOAD, EXAMPLE_LOAD_MASKED_BY_THE_BOUND))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "tests/test_conformance.py", "-k", "test_forward or test_backward or test_varlen"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=540)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and " passed" in summary and "failed" not in summary, done.stdout[-4000:]
