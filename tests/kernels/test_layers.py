"""``kernels.layers.GatedDeltaNet`` (the module) against its float64 composition of the
references (``reference.layers.gated_delta_net``), forward and backward through the
input and every parameter, under the tolerance rule of ``pytest_fla/checks/tolerance.py``.

The functional form has a spec (``specs/layers.py``) and so the generic
checks; here it is the module: its parameters reach the function, its gradients reach
its parameters, and it picks the fused-recurrent kernel for short inputs at inference.
"""

from __future__ import annotations

import pytest
import torch

import reference
from kernels.layers import GatedDeltaNet
from pytest_fla.checks.generic import cotangents, dtype_skip_reason, numeric_device
from pytest_fla.checks.tolerance import assert_close

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(params=list(DTYPES))
def dtype(request):
    reason = dtype_skip_reason(request.param, numeric_device())
    if reason:
        pytest.skip(reason)
    return request.param


def _layer(dtype, **sizes):
    torch.manual_seed(0)
    layer = GatedDeltaNet(**sizes).to(numeric_device())
    with torch.no_grad():  # random gates and norm weight rather than their initial constants
        layer.norm_weight.normal_(1.0, 0.1)
        layer.A_log.normal_(0.0, 1.0)
        layer.dt_bias.normal_(0.0, 1.0)
    return layer.to(DTYPES[dtype])


def _reference(layer, x, activation_dtype=None):
    """The module's parameters, as float64 leaves, through the reference composition
    (rounded where the module hands ``activation_dtype`` tensors from op to op)."""
    params = {name: p.detach().double().requires_grad_(True) for name, p in layer.named_parameters()}
    y = reference.layers.gated_delta_net(
        x, params["q_proj.weight"], params["k_proj.weight"], params["v_proj.weight"], params["a_proj.weight"],
        params["b_proj.weight"], params["A_log"], params["dt_bias"], params["q_conv_weight"],
        params["k_conv_weight"], params["v_conv_weight"], params["o_proj.weight"],
        g_weight=params.get("g_proj.weight"), norm_weight=params["norm_weight"],
        num_heads=layer.num_heads, num_v_heads=layer.num_v_heads, norm_eps=layer.norm_eps,
        activation_dtype=activation_dtype,
    )
    return y, params


# (module arguments, batch, T at inference): at inference T <= 64 takes the fused-recurrent
# kernel, in training T = 70 the chunked one over a ragged second chunk
SIZES = {
    "grouped": (dict(hidden_size=32, head_dim=16, num_heads=2, num_v_heads=4, expand_v=1.5), 2, 40),
    # the module's default head_dim (256) and expand_v (2.0): value heads of 512; fewer
    # tokens, as the interpreter steps the one-pass kernel's 64 programs token by token
    "default_head_dims": (dict(hidden_size=256, num_heads=1), 1, 12),
}


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("training", [True, False], ids=["chunk", "eval_short_fused_recurrent"])
def test_module_matches_reference(dtype, training, sizes):
    arguments, batch, short = SIZES[sizes]
    layer = _layer(dtype, **arguments)
    layer.train(training)
    device = numeric_device()
    gen = torch.Generator().manual_seed(1)
    T = 70 if training else short
    x = torch.randn(batch, T, layer.hidden_size, generator=gen).to(device, DTYPES[dtype]).requires_grad_(True)
    y = layer(x)
    x64 = x.detach().double().requires_grad_(True)
    y_ref, params = _reference(layer, x64, None if dtype == "fp32" else DTYPES[dtype])
    assert_close("GatedDeltaNet.y", y, y_ref, dtype)

    (dy,) = cotangents([y], seed=2)
    y.backward(dy)
    y_ref.backward(dy.double())
    assert_close("GatedDeltaNet: dx", x.grad, x64.grad, dtype, "backward")
    for name, p in layer.named_parameters():
        assert p.grad is not None, f"no gradient reached {name}"
        assert_close(f"GatedDeltaNet: d{name}", p.grad, params[name].grad, dtype, "backward")


def test_eval_short_input_takes_fused_recurrent(monkeypatch):
    """At inference, T <= 64 runs the one-pass kernel; training and long inputs the chunked one."""
    from kernels.layers import gated_deltanet

    modes = []
    real = gated_deltanet.gated_delta_net
    monkeypatch.setattr(gated_deltanet, "gated_delta_net", lambda *a, **kw: modes.append(kw["mode"]) or real(*a, **kw))
    layer = _layer("fp32", hidden_size=16, head_dim=16, num_heads=1, expand_v=1.0, use_gate=False)
    x = torch.randn(1, 8, 16, device=numeric_device())
    with torch.no_grad():
        layer.eval()(x)
        layer.eval()(torch.randn(1, 65, 16, device=numeric_device()))
        layer.train()(x)
    assert modes == ["fused_recurrent", "chunk", "chunk"]


def test_packed_sequences_match_separate_calls():
    """``cu_seqlens`` through the module: each packed sequence gives what it gives alone."""
    layer = _layer("fp32", hidden_size=16, head_dim=16, num_heads=1, expand_v=1.0).eval()
    device = numeric_device()
    lengths = (5, 0, 67)
    x = torch.randn(1, sum(lengths), 16, device=device)
    cu = torch.tensor([0, 5, 5, 72], device=device)
    with torch.no_grad():
        packed = layer(x, cu_seqlens=cu)
        for start, end in ((0, 5), (5, 72)):
            alone = layer(x[:, start:end])
            assert_close(f"packed[{start}:{end}] vs alone", packed[:, start:end], alone.double(), "fp32", "agreement")


def test_rounded_reference_rounds_values_and_gradients_at_the_handovers():
    """``activation_dtype`` changes the float64 composition by rounding alone: None is the
    plain reference bit for bit, fp16 moves the output by about a unit roundoff, and a
    hand-over rounds the gradient coming back as well as the value going forward."""
    layer = _layer("fp32", hidden_size=32, head_dim=16, num_heads=2, num_v_heads=4, expand_v=1.5)
    # drawn on the CPU, then where the layer's parameters are (the reference runs beside them)
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(numeric_device())
    plain, _ = _reference(layer, x)
    assert torch.equal(_reference(layer, x, None)[0], plain)
    rounded, _ = _reference(layer, x, torch.float16)
    rel = ((rounded - plain).norm() / plain.norm()).item()
    assert 1e-5 < rel < 1e-2, f"fp16 hand-overs moved the output by {rel:.1e} (a few fp16 roundoffs expected)"

    t = torch.tensor([1.0 + 2.0 ** -12], dtype=torch.float64, requires_grad=True)
    out = reference.layers.round_to(t, torch.float16)
    assert out.item() == 1.0  # fp16 keeps 10 fraction bits
    (grad,) = torch.autograd.grad(out, t, torch.tensor([1.0 + 2.0 ** -13], dtype=torch.float64))
    assert grad.item() == 1.0


def test_token_masses_are_the_per_token_terms_of_the_reduced_gradients():
    """``checks.token_masses`` for the layer's per-head ``A_log`` and ``dt_bias``: the
    reference called with one copy per token gives terms that sum to the ordinary float64
    gradient, and their magnitudes' sum bounds it; on this sample the sums cancel (the
    condition number ``sum|terms| / |sum|`` is above 1), which is why the rule exists."""
    from pytest_fla.checks.generic import run_with_grads, token_masses
    from specs.layers import GATED_DELTA_NET as spec

    sample = spec.sample(spec.cases[0], "fp32", "cpu", seed=0)
    names = ["A_log", "dt_bias", "x"]
    _, ref_grads, upstream = run_with_grads(spec.reference_for("fp32"), sample, names, upcast=True, seed=0)
    masses = token_masses(spec, sample, names, upstream, "fp32")
    assert set(masses) == {"A_log", "dt_bias"}  # x is not token-reduced
    for name, mass in masses.items():
        ref = ref_grads[name]
        assert mass.shape == ref.shape
        assert torch.all(mass >= ref.abs() * (1 - 1e-12)), f"{name}: the terms' magnitudes must bound their sum"
        per_token = dict(sample.kwargs)
        per_token[name] = sample.kwargs[name].expand(*sample.kwargs["x"].shape[:2], *ref.shape)
        from pytest_fla.ops.spec import Sample

        _, terms, _ = run_with_grads(spec.reference_for("fp32"), Sample(per_token), [name], upstream, upcast=True)
        torch.testing.assert_close(terms[name].sum(dim=(0, 1)), ref, rtol=1e-12, atol=1e-12)
    kappa = (masses["A_log"] / ref_grads["A_log"].abs()).max().item()
    assert kappa > 1.5, f"the sample's A_log gradient did not cancel (condition number {kappa:.2f})"


def test_assert_close_against_a_scale():
    """With ``scale``, the error is measured against it: a difference too large for the
    (cancelled) reference passes against the terms' magnitudes, and one too large for
    those fails."""
    ref = torch.tensor([1e-3, -2e-3], dtype=torch.float64)
    mass = torch.tensor([1.0, 1.0], dtype=torch.float64)
    out = ref + 5e-3
    with pytest.raises(AssertionError, match="relative RMS error"):
        assert_close("d", out, ref, "fp32", "backward")
    assert_close("d", ref + 1e-5, ref, "fp32", "backward", mass)
    with pytest.raises(AssertionError, match="sum of its terms' magnitudes"):
        assert_close("d", ref + 1e-3, ref, "fp32", "backward", mass)
