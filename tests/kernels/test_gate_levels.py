"""The gate-level kernels' two choices that must not change what they compute
(``kernels/_gate_levels.py``): chunk_gla's and chunk_rwkv6's ``_intra_fwd`` / ``_qkg_bwd``,
chunk_kda's prepare and key-gradient kernels, DPLR's ``intra_fwd_kernel`` /
``qkabg_grad_kernel``.

- Sibling totals by ``tl.gather`` or through each program's scratch tile (a config): both
  move the same fp32 values into the same sums in the same order, so every output and
  gradient must be bitwise equal, at strong decay (the levels) over two chunks and a short
  tail with an initial state; the levels' rows cross chunk or program edges only if a
  scratch tile's offset is wrong.
- One product or the levels (by the gates, per program and key block): at realistic decay
  the one product must agree with the levels to fp32 accuracy, and be a different
  computation (not bitwise equal: it ran); at strong decay the kernels must fall back to
  the levels (bitwise equal to them), where one product forced on would overflow; with
  both in one launch, each program takes its own.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import triton
import triton.language as tl

from kernels import _gate_levels, chunk_dplr_delta_rule, chunk_gla, chunk_kda, chunk_rwkv6
from kernels._arch import is_interpreter
from kernels.delta_rule import chunk_kda as kda_module
from kernels.dplr import chunk as dplr_module
from kernels.gla import chunk as gla_module

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)

OPS = ["chunk_gla", "chunk_rwkv6", "chunk_kda", "chunk_dplr_delta_rule"]


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


STRONG = 0.05  # gate normaliser: in-chunk gate sums reach the thousands
REALISTIC = 8.0  # a few percent decay a step: |G| stays within every SPREAD


def _inputs(op, normaliser=STRONG):
    gen = torch.Generator().manual_seed(1)
    B, T, H, K, V = 2, 150, 2, 32, 32
    x = {name: torch.randn(B, T, H, K, generator=gen) for name in ("q", "k")}
    x["v"] = torch.randn(B, T, H, V, generator=gen)
    # a normaliser per sequence where a tuple is given
    x["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / torch.tensor(
        normaliser).reshape(-1, 1, 1, 1)
    x["h0"] = torch.randn(B, H, K, V, generator=gen)
    if op in ("chunk_kda", "chunk_dplr_delta_rule"):
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    if op == "chunk_kda":
        x["beta"] = torch.rand(B, T, H, generator=gen)
    if op == "chunk_dplr_delta_rule":
        x["a"] = -0.5 * x["k"]
        x["b"] = 0.5 * torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    if op == "chunk_rwkv6":
        x["u"] = torch.randn(H, K, generator=gen)
    return {name: t.to(_device()).requires_grad_(True) for name, t in x.items()}


def _run(op, x):
    if op == "chunk_gla":
        return chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["h0"], output_final_state=True)
    if op == "chunk_rwkv6":
        return chunk_rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], initial_state=x["h0"], output_final_state=True)
    if op == "chunk_kda":
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True)
    return chunk_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], initial_state=x["h0"],
                                 output_final_state=True)


def _with_siblings(op, form, patch):
    """Every level kernel of the op takes the sibling totals by ``form``."""
    if op == "chunk_kda":
        base = kda_module.kda_configs
        patch.setattr(kda_module, "kda_configs",
                      lambda *a: dataclasses.replace(base(*a), prepare_siblings=form, grad_siblings=form))
    elif op == "chunk_dplr_delta_rule":
        base = dplr_module.choose_configs
        patch.setattr(dplr_module, "choose_configs",
                      lambda *a, **k: dataclasses.replace(base(*a, **k), intra_siblings=form, grad_siblings=form))
    else:
        base = gla_module._configs

        def configs(*a):
            cfg = base(*a)
            return {**cfg, "intra": {**cfg["intra"], "siblings": form}, "qkg": {**cfg["qkg"], "siblings": form}}
        patch.setattr(gla_module, "_configs", configs)


def _outputs_and_grads(op, x):
    o, ht = _run(op, x)
    gen = torch.Generator().manual_seed(2)
    cotangents = [torch.randn(t.shape, generator=gen).to(t.device) for t in (o, ht)]
    torch.autograd.backward([o, ht], cotangents)
    return {"o": o.detach(), "final_state": ht.detach(), **{f"d{n}": t.grad for n, t in x.items()}}


@pytest.mark.parametrize("op", OPS)
def test_scratch_sibling_totals_match_gather(op, monkeypatch):
    results = {}
    for form in ("gather", "scratch"):
        with monkeypatch.context() as patch:
            _with_siblings(op, form, patch)
            results[form] = _outputs_and_grads(op, _inputs(op))
    for name, b in results["gather"].items():
        a = results["scratch"][name]
        assert torch.isfinite(b).all(), f"{op} {name}: not finite by gather"
        assert torch.equal(a, b), f"{op} {name}: max difference {(a - b).abs().max().item():.3e} between the forms"


def _with_spread(spread, patch):
    """Every gate-level kernel takes one product while ``|G| <= spread`` (negative: never)."""
    for work in (torch.float32, torch.bfloat16):
        patch.setitem(_gate_levels.SPREAD_BY_WORK, work, spread)


def _by_spread(op, normaliser, spreads, monkeypatch):
    results = {}
    for name, spread in spreads.items():
        with monkeypatch.context() as patch:
            if spread is not None:
                _with_spread(spread, patch)
            results[name] = _outputs_and_grads(op, _inputs(op, normaliser))
    return results


@pytest.mark.parametrize("op", OPS)
def test_one_product_matches_levels_at_realistic_decay(op, monkeypatch):
    results = _by_spread(op, REALISTIC, {"default": None, "levels": -1.0}, monkeypatch)
    differs = False
    for name, levels in results["levels"].items():
        one = results["default"][name]
        assert torch.isfinite(one).all(), f"{op} {name}: not finite in one product"
        error = ((one - levels).norm() / levels.norm()).item()
        # fp32 on both sides: the two forms differ by the rounding of G (|G| u32 relative,
        # kernels/_gate_levels.py), far under the fp32 forward limit of 2e-5
        assert error < 2e-6, f"{op} {name}: one product differs from the levels by {error:.2e} (rel)"
        differs |= not torch.equal(one, levels)
    assert differs, f"{op}: bitwise equal to the levels, so the one-product form did not run"


@pytest.mark.parametrize("op", OPS)
def test_strong_decay_falls_back_to_levels(op, monkeypatch):
    results = _by_spread(op, STRONG, {"default": None, "levels": -1.0, "forced": 1e30}, monkeypatch)
    for name, levels in results["levels"].items():
        assert torch.equal(results["default"][name], levels), f"{op} {name}: did not fall back to the levels"
    forced = results["forced"]
    # the guard is what keeps this finite: one product at these gates meets e^{-G} = inf
    assert not all(torch.isfinite(t).all() for t in forced.values()), f"{op}: forced one product stayed finite"


@pytest.mark.parametrize("op", OPS)
def test_each_program_takes_its_own_form(op, monkeypatch):
    """Sequence 0 at strong decay, sequence 1 at realistic decay, in one launch: sequence 0's
    programs take the levels (bitwise equal to the levels-only run there), sequence 1's the
    one product (close to that run, and not bitwise equal): the choice is per program."""
    results = _by_spread(op, (STRONG, REALISTIC), {"default": None, "levels": -1.0}, monkeypatch)
    differs = False
    for name, levels in results["levels"].items():
        one = results["default"][name]
        if levels.shape[0] != 2:
            continue  # rwkv6's du [H, K] sums over both sequences
        assert torch.equal(one[0], levels[0]), f"{op} {name}: the strong-decay sequence left the levels"
        error = ((one[1] - levels[1]).norm() / levels[1].norm()).item()
        assert error < 2e-6, f"{op} {name}: one product differs from the levels by {error:.2e} (rel)"
        differs |= not torch.equal(one[1], levels[1])
    assert differs, f"{op}: the realistic sequence is bitwise equal to the levels, so it took them too"


@triton.jit
def _scaled_half_kernel(x, h, inv, N: tl.constexpr):
    o = tl.arange(0, N)
    half, scale_inv = _gate_levels.scaled_half(tl.load(x + o))
    tl.store(h + o, half)
    tl.store(inv + o, scale_inv + tl.zeros([N], tl.float32))


@pytest.mark.parametrize("largest", [3.7, 1e6, 1e-30, 0.0, 65504.0 * 2])
def test_scaled_half_is_fp16_rounding_scaled_by_a_power_of_two(largest):
    """The pair products' fp16 operands (``pairs="fp16"``): the tile's largest value lands in
    [2**14, 2**15), the scale is a power of two (exact both ways), and each entry comes back
    as fp16 rounding of it at that scale: at most 2**-11 of it relative, or an absolute
    error below 2**-38 of the largest where fp16 runs out of exponent."""
    device = _device()
    x = torch.linspace(-1, 1, 64, dtype=torch.float64) * largest
    x[5], x[6] = largest * 2.0 ** -20, largest * 2.0 ** -45  # a small entry, one past fp16's range
    x = x.float().to(device)
    h = torch.empty(64, dtype=torch.float16, device=device)
    inv = torch.empty(64, dtype=torch.float32, device=device)
    _scaled_half_kernel[(1,)](x, h, inv, N=64)
    inv = float(inv[0])
    assert inv > 0 and math.frexp(inv)[0] == 0.5  # a power of two
    back = h.double() * inv
    assert torch.isfinite(back).all()
    if largest:
        assert 2 ** 14 <= h.double().abs().max() < 2 ** 15
    err = (back - x.double()).abs()
    assert (err <= x.double().abs() * 2.0 ** -11 + abs(largest) * 2.0 ** -38).all(), err.max()
    assert back[5] != 0 or largest == 0  # 2**-20 of the largest keeps its bits


@triton.jit
def _gated_operand_kernel(x, y, N: tl.constexpr, DOT: tl.constexpr, GATED_PREC: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, _gate_levels.gated_operand(tl.load(x + o), DOT, GATED_PREC).to(tl.float32))


def test_gated_operand_rounds_to_the_nearest_tf32():
    """bf16 work's gate-scaled operands in tf32 (``gated_operand``): each value rounded to
    the nearest one of 10 fraction bits, ties away from zero (the tensor cores would drop the
    low 13 bits, a truncation), subnormals on their own grid, Inf and NaN kept; against a
    float64 rounding of the same values."""
    device = _device()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen, dtype=torch.float64) * torch.logspace(-40, 38, 4096, dtype=torch.float64)
    bits = torch.arange(1, 33, dtype=torch.int64) * 0x2000 + 0x3F801000  # halfway between tf32 neighbours
    ties = torch.tensor(bits.tolist(), dtype=torch.int32).view(torch.float32).double()
    x = torch.cat([x, ties, -ties, torch.tensor([0.0, 3.4e38, 1e-40, -7e-42])]).float()
    special = torch.tensor([float("inf"), float("-inf"), float("nan")])
    n = triton.next_power_of_2(x.numel() + special.numel())
    x = torch.cat([x, special, torch.zeros(n - x.numel() - special.numel())])
    y = torch.empty_like(x)
    _gated_operand_kernel[(1,)](x.to(device), y_dev := y.to(device), N=n, DOT=tl.bfloat16, GATED_PREC="tf32")
    y = y_dev.cpu()
    v = x.double()
    finite = torch.isfinite(v) & (v != 0)
    exponent = torch.floor(torch.log2(v.abs().where(finite, torch.ones_like(v)))).clamp(min=-126)
    ulp = torch.pow(2.0, exponent - 10)
    want = torch.where(finite, torch.sign(v) * torch.floor(v.abs() / ulp + 0.5) * ulp, v).float()
    same = (y == want) | (torch.isnan(y) & torch.isnan(want))
    assert same.all(), f"{int((~same).sum())} values off, e.g. {x[~same][:4].tolist()} -> {y[~same][:4].tolist()}"
    assert not torch.equal(y, x)  # it rounded
    fp32 = y.new_empty(n)
    _gated_operand_kernel[(1,)](x.to(device), fp32_dev := fp32.to(device), N=n, DOT=tl.float32, GATED_PREC="ieee")
    assert torch.equal(fp32_dev.cpu().nan_to_num(0.0), x.nan_to_num(0.0))  # other precisions: the value as it is
