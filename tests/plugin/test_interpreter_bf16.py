"""The interpreter's bf16 made the GPU's (``pytest_fla/targets/interpreter_bf16.py``), and the
accuracy comparison that measures with it on the CPU (``benchmarks/peer_accuracy.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch

from plugin_testing import cpu_only, run
from test_external_specs import project
from pytest_fla.targets import interpreter_bf16

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rounding_to_bf16_is_torchs_round_to_nearest_even():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-30, 30, 4096)
    # ties: the halfway points between neighbouring bf16 values, both parities
    ties = (torch.arange(1, 9, dtype=torch.int32) * 0x10000 + 0x3F808000).view(torch.float32)
    x = torch.cat([x, ties, -ties, torch.tensor([0.0, -0.0, float("inf"), float("-inf")])])
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(interpreter_bf16.to_bf16_bits(x.numpy()), want)
    assert np.array_equal(interpreter_bf16.to_float32(want), x.to(torch.bfloat16).float().numpy())


PATCHED = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from pytest_fla.targets import interpreter_bf16
    assert interpreter_bf16.install()

    @triton.jit
    def kernel(a, b, x, c, y, s):
        r = tl.arange(0, 16)
        tile = r[:, None] * 16 + r[None, :]
        ta, tb = tl.load(a + tile), tl.load(b + tile)
        tl.store(c + tile, tl.dot(ta, tb))
        tl.store(y + tile, tl.load(x + tile).to(tl.bfloat16))
        tl.store(s + tile, ta * tb + ta)

    torch.manual_seed(0)
    a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    x = torch.randn(16, 16)
    c, y, s = torch.zeros(16, 16), torch.zeros(16, 16, dtype=torch.bfloat16), torch.zeros(16, 16, dtype=torch.bfloat16)
    kernel[(1,)](a, b, x, c, y, s)
    print(float((c - a.double() @ b.double()).abs().max()), bool(torch.equal(y, x.bfloat16())),
          bool(torch.equal(s, a * b + a)))
""")


def test_the_patched_interpreter_computes_bf16_as_a_gpu():
    """Exact products accumulated in float32, conversions rounded to nearest, arithmetic
    rounded once per operation (torch's bf16 arithmetic on the CPU does the same)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", PATCHED], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    dot_error, converted, arithmetic = run.stdout.split()
    assert float(dot_error) < 1e-5  # float32 accumulation of 16 exact products of O(1)
    assert converted == "True" and arithmetic == "True"


TF32 = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from pytest_fla.targets import interpreter_bf16
    assert interpreter_bf16.install()

    @triton.jit
    def kernel(a, b, one_pass, three_pass, ieee):
        r = tl.arange(0, 16)
        tile = r[:, None] * 16 + r[None, :]
        ta, tb = tl.load(a + tile), tl.load(b + tile)
        tl.store(one_pass + tile, tl.dot(ta, tb))  # tf32, the default
        tl.store(three_pass + tile, tl.dot(ta, tb, input_precision="tf32x3"))
        tl.store(ieee + tile, tl.dot(ta, tb, input_precision="ieee"))

    torch.manual_seed(0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    outs = [torch.zeros(16, 16) for _ in range(3)]
    kernel[(1,)](a, b, *outs)
    cut = lambda t: (t.view(torch.int32) & -8192).view(torch.float32).double()  # low 13 bits dropped
    exact = a.double() @ b.double()
    print(*(float((o - want).abs().max()) for o, want in zip(outs, (cut(a) @ cut(b), exact, exact))),
          float((cut(a) @ cut(b) - exact).abs().max()))
""")


def test_the_patched_interpreter_truncates_one_pass_tf32_operands_as_tensor_cores_do():
    """A float32 ``tl.dot`` in one-pass tf32 reads each operand with its low 13 bits
    dropped, as the GPU's tensor cores do; three-pass tf32 and ieee stay near-exact."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", TF32], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    one_pass, three_pass, ieee, truncation = map(float, run.stdout.split())
    assert truncation > 1e-3  # what the truncation costs, at 16 products of O(1)
    assert one_pass < 1e-5 and three_pass < 1e-5 and ieee < 1e-5  # float32 accumulation only


def test_peer_accuracy_measures_ours_on_the_cpu(tmp_path):
    """Without a GPU the comparison runs ours alone, the peer column n/a; a correct
    chunked kernel lands within its bf16 budget, and far from the error of an unpatched
    interpreter (bit patterns multiplied as integers)."""
    out = tmp_path / "accuracy.json"
    env = {**os.environ, "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "peer_accuracy.py"), "--device", "cpu",
                          "--ops", "chunk_gla", "--T", "70", "--K", "16", "--V", "16", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.rstrip().splitlines()[-1].startswith("| chunk_gla | ")
    report = json.loads(out.read_text())
    assert report["peer_missing"] == "the peer needs a GPU"
    rows = {r["tensor"]: r for r in report["rows"]}
    assert set(rows) == {"o", "final_state", "dq", "dk", "dv", "dg", "dinitial_state"}
    for r in rows.values():
        assert r["peer"] is None and r["ratio"] is None
        assert 1e-4 < r["ours"] < 1.6e-2, r  # bf16: above fp32's error, within the forward budget


def test_the_accuracy_gate_counts_errors_above_the_ratio_over_the_noise_floor():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import peer_accuracy

    rows = [dict(op="a", tensor="dq", ours=5e-3, peer=4e-3), dict(op="a", tensor="dk", ours=5.1e-3, peer=4e-3),
            dict(op="a", tensor="dh0", ours=3e-5, peer=1e-6), dict(op="a", tensor="o", ours=9.0, peer=None)]
    assert [r["tensor"] for r in rows if peer_accuracy.is_over(r, 1.25, 1e-4)] == ["dk"]
    assert [r["tensor"] for r in rows if peer_accuracy.is_over(r, 1.25, 1e-7)] == ["dk", "dh0"]


@cpu_only
def test_bf16_is_checked_on_the_cpu_only_under_the_emulation(pytester, monkeypatch):
    """By default the CPU skips bf16, saying why; ``--fla-bf16-emulated`` patches the GPU's
    bf16 arithmetic into every process of the run and checks it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    project(pytester)
    select = ("--fla-ops=scale", "-k", "test_forward and bf16")
    plain = run(pytester, "-q", "-rs", *select)
    plain.assert_outcomes(skipped=2)
    assert "raw bits" in plain.stdout.str()
    emulated = run(pytester, "-v", *select, "--fla-bf16-emulated")
    emulated.assert_outcomes(passed=2)
    assert "fla interpreter bf16: checked" in emulated.stdout.str()
    workers = run(pytester, "-q", *select, "--fla-bf16-emulated", "-n", "2")  # each worker patches its own
    workers.assert_outcomes(passed=2)
