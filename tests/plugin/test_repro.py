"""Reproducers as tests: the header, what each expectation accepts, the scaffold command,
and collection of a repro directory under the session's target."""

from __future__ import annotations

import subprocess
import sys

import pytest
from plugin_testing import cpu_only, run

from pytest_fla import repro

HEADER = "# source: a report\n# seen-on: sm90\n# expect: {expect}\n# needs: {needs}\n"


def write(tmp_path, body, expect="pass", needs="device", name="case.py"):
    path = tmp_path / name
    path.write_text(HEADER.format(expect=expect, needs=needs) + body)
    return path


def run_repro(path, expect):
    return subprocess.run([sys.executable, "-m", "pytest_fla", "run-repro", str(path), "--expect", expect],
                          capture_output=True, text=True)


def test_header_requires_source_arch_and_expectation(tmp_path):
    with pytest.raises(repro.ReproHeaderError, match="lacks source, seen-on"):
        repro.Header.parse("# expect: pass\nprint(1)\n")
    with pytest.raises(repro.ReproHeaderError, match="must be `pass` or `raises"):
        repro.Header.parse(HEADER.format(expect="fails sometimes", needs="device"))
    header = repro.Header.parse(HEADER.format(expect="pass", needs="gpu") + "# expect-sm86: raises OSError: x\n")
    assert header.expectation("sm86") == "raises OSError: x"
    assert header.expectation("sm90") == "pass"
    assert header.needs == "gpu"


@pytest.mark.parametrize(
    "body,expect,ok",
    [
        ("x = 1\n", "pass", True),
        ("raise ValueError('`cu_seqlens` must end at T = 24')\n", "pass", False),
        ("raise ValueError('`cu_seqlens` must end at T = 24')\n", "raises ValueError: end at T = 24", True),
        ("raise ValueError('something else')\n", "raises ValueError: end at T", False),
        ("raise TypeError('end at T')\n", "raises ValueError: end at T", False),
        ("x = 1\n", "raises ValueError: anything", False),
        ("import sys\nsys.exit(0)\n", "pass", True),
    ],
)
def test_an_expectation_is_met_or_not(tmp_path, body, expect, ok):
    result = run_repro(write(tmp_path, body, expect), expect)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr


def test_new_repro_scaffolds_a_collectable_file(tmp_path):
    subprocess.run([sys.executable, "-m", "pytest_fla", "new-repro", "bh_overflow", "--dir", str(tmp_path),
                    "--seen-on", "sm80", "--expect", "raises ValueError: B \\* H"], check=True, capture_output=True)
    text = (tmp_path / "bh_overflow.py").read_text()
    header = repro.Header.parse(text)
    assert header.fields["seen-on"] == "sm80" and header.expectation(None) == "raises ValueError: B \\* H"
    again = subprocess.run([sys.executable, "-m", "pytest_fla", "new-repro", "bh_overflow", "--dir", str(tmp_path)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr


@cpu_only
def test_a_repro_directory_runs_as_tests(pytester):
    repro_dir = pytester.mkdir("repro")
    write(repro_dir, "import pytest_fla\n", name="fine.py")
    write(repro_dir, "raise ValueError('`x` must be positive')\n", expect="raises ValueError: must be positive", name="clear_error.py")
    write(repro_dir, "raise RuntimeError('illegal memory access')\n", name="still_broken.py")
    write(repro_dir, "x = 1\n", needs="gpu", name="gpu_only.py")
    # what Triton's interpreter raises for a construct it lacks: nothing shown of the defect here
    write(repro_dir, "class InterpreterError(RuntimeError): pass\nraise InterpreterError(\"ValueError('_semantic')\")\n",
          name="interpreter_lacks.py")
    result = run(pytester, "-v", "-rs")
    result.assert_outcomes(passed=2, failed=1, skipped=2)
    out = result.stdout.str()
    assert "Triton's CPU interpreter cannot run this reproducer's kernels (a GPU can): InterpreterError" in out
    assert "repro/still_broken.py::still_broken FAILED" in out
    assert "RuntimeError: illegal memory access" in out
    assert "needs a GPU" in out


PAST_THE_END = """
import torch, triton, triton.language as tl

@triton.jit
def copy_padded(x, y, N: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(x + offs)  # no mask: the block's padding is read past the end of x
    tl.store(y + offs, values, mask=offs < N)

x = torch.arange(6, dtype=torch.float32)
y = torch.empty_like(x)
copy_padded[(1,)](x, y, N=6, BLOCK={block})
assert torch.equal(x[:4], y[:4])  # the values right either way: only a bounds check sees the read
"""


@cpu_only
@pytest.mark.parametrize("block,ok", [(8, False), (4, True)], ids=["reads_past_the_end", "in_bounds"])
def test_a_read_past_a_tensor_that_changes_no_value_fails_a_reproducer_under_the_interpreter(tmp_path, block, ok):
    # block 4 copies the first four values; block 8 all six, reading two past the tensor's end
    result = run_repro(write(tmp_path, PAST_THE_END.format(block=block)), "pass")
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        assert "OutOfBounds" in result.stdout + result.stderr and "past the end of `x`" in result.stdout + result.stderr
