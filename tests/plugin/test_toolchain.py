"""The toolchain facts: the tested range is read from pyproject.toml, the header says
whether the installed versions lie in it, and the interpreter's dtype policy matches
what the installed Triton's interpreter actually computes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from packaging.specifiers import SpecifierSet

from pytest_fla.targets import toolchain


def test_tested_ranges_come_from_pyproject():
    ranges = toolchain.tested_ranges()
    assert set(ranges) == {"torch", "triton"}
    assert toolchain.in_range("3.6.0", ranges["triton"]) and toolchain.in_range("3.9.0", ranges["triton"])
    assert not toolchain.in_range("3.5.0", ranges["triton"])


def test_header_names_versions_and_flags_one_outside_the_range(monkeypatch):
    monkeypatch.setattr(toolchain, "tested_ranges", lambda: {"triton": SpecifierSet(">=3.6,<3.10"),
                                                             "torch": SpecifierSet(">=2.11,<2.14")})
    monkeypatch.setattr(toolchain, "installed_version", {"triton": "3.10.0", "torch": "2.13.0+cpu"}.get)
    line = toolchain.header_line()
    assert "Triton 3.10.0 (OUTSIDE the tested range >=3.6,<3.10)" in line
    assert "torch 2.13.0+cpu (tested: >=2.11,<2.14)" in line


BF16_DOT = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def dot(a, b, c):
        r = tl.arange(0, 16)
        tile = r[:, None] * 16 + r[None, :]
        tl.store(c + tile, tl.dot(tl.load(a + tile), tl.load(b + tile)))

    torch.manual_seed(0)
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    c = torch.zeros(16, 16)
    dot[(1,)](a, b, c)
    print("right" if torch.allclose(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3) else "wrong")
""")


def test_interpreter_bf16_policy_matches_the_interpreter():
    """bf16 is skipped under the interpreter exactly while its tl.dot is wrong."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", BF16_DOT], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    verdict = run.stdout.split()[-1]
    skipped = toolchain.interpreter_skip_reason("bf16") is not None
    assert skipped == (verdict == "wrong"), (
        f"the installed Triton's interpreter computes a bf16 tl.dot {verdict}ly, "
        f"but bf16 is {'skipped' if skipped else 'checked'} under it: update toolchain.interpreter_skip_reason"
    )


BF16_ELEMENTWISE = textwrap.dedent("""
    import torch, triton, triton.language as tl

    @triton.jit
    def elementwise(x, rounded, sums, products):
        r = tl.arange(0, 16)
        b = tl.load(x + r).to(tl.bfloat16)
        tl.store(rounded + r, b)
        tl.store(sums + r, b + b)
        tl.store(products + r, b * b)

    torch.manual_seed(0)
    x = torch.randn(16)
    rounded, sums, products = (torch.zeros(16, dtype=torch.bfloat16) for _ in range(3))
    elementwise[(1,)](x, rounded, sums, products)
    b = x.bfloat16()
    print("conversion", "nearest" if torch.equal(rounded, b) else "other")
    print("arithmetic", "right" if torch.equal(sums, b + b) and torch.equal(products, b * b) else "wrong")
""")


def test_interpreter_bf16_reason_says_what_the_interpreter_gets_wrong():
    """The skip reason names elementwise bf16 arithmetic and the conversion's rounding only
    while they are wrong: a kernel with no tl.dot is skipped for them."""
    reason = toolchain.interpreter_skip_reason("bf16")
    if reason is None:
        import pytest

        pytest.skip("bf16 is checked under this interpreter: no reason to read")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", BF16_ELEMENTWISE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    measured = dict(line.split() for line in run.stdout.splitlines() if line.split()[:1] in (["conversion"], ["arithmetic"]))
    assert ("sums and products" in reason) == (measured["arithmetic"] == "wrong"), (reason, measured)
    assert ("toward zero" in reason) == (measured["conversion"] != "nearest"), (reason, measured)
