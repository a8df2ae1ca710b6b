"""Focused tests of the modules (rotary, norms, causal conv) for what the generic
conformance checks do not reach: the rotary misuse error, the custom op under opcheck and
torch.compile, the cos/sin-table form, strided inputs and gradients, short sequences with
a carried state, streaming ranges that cross sequences, and deterministic parameter
gradients. Runs on the GPU, or on the CPU under TRITON_INTERPRET=1 at small sizes.
"""

from __future__ import annotations

import pytest
import torch
import triton

import reference
from kernels import RotaryEmbedding, apply_rotary, causal_conv1d, l2norm, rms_norm, rms_norm_gated, rotary_embedding
from kernels import _partials
from kernels import conv as conv_module
from kernels import norm as norm_module
from kernels.rotary import APPLY_ROTARY, ROTARY_EMBEDDING
from pytest_fla.running.devices import numeric_device
from pytest_fla.running.launches import observe_launches
from pytest_fla.checks.tolerance import assert_close

DEVICE = numeric_device()


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def grads_of(fn, inputs, cotangents):
    """Outputs (detached) and gradients of ``fn(*inputs)`` for the given cotangents."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    pairs = [(o, c) for o, c in zip(outs, cotangents) if o is not None and c is not None]
    wanted = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], wanted, [c.to(o.dtype) for o, c in pairs])
    return [None if o is None else o.detach() for o in outs], list(grads)


def check_against_reference(fn, ref_fn, inputs, cotangents, dtype="fp32"):
    """Kernel vs float64 reference, outputs and every gradient."""
    out, grads = grads_of(fn, [leaf(t) if t is not None else None for t in inputs], cotangents)
    inputs64 = [leaf(t.double()) if t is not None else None for t in inputs]
    ref_out, ref_grads = grads_of(ref_fn, inputs64, [c.double() for c in cotangents])
    for i, (o, r) in enumerate(zip(out, ref_out)):
        assert_close(f"output {i}", o, r, dtype)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(f"gradient {i}", g, r, dtype, "backward")


# ----------------------------------------------------------------------------- rotary


def test_rotary_model_width_is_a_clear_error():
    """The classic misuse passes the model width as ``dim``: a ValueError naming both numbers."""
    q = torch.randn(1, 4, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"64.*16"):
        RotaryEmbedding(64)(q, q)
    with pytest.raises(ValueError, match=r"15.*16"):
        RotaryEmbedding(15)(q, q)
    with pytest.raises(ValueError, match=r"40.*16"):
        apply_rotary(q, 40)
    table = torch.zeros(8, 20, device=DEVICE)
    with pytest.raises(ValueError, match=r"40.*16"):
        rotary_embedding(q, table, table)


def test_rotary_module_rotates_q_and_k_with_fewer_heads():
    q = torch.randn(2, 9, 4, 16, device=DEVICE)
    k = torch.randn(2, 9, 2, 16, device=DEVICE)
    q2, k2 = RotaryEmbedding(8, base=500.0, interleaved=True)(q, k, seqlen_offset=3)
    assert_close("q", q2, reference.apply_rotary(q, 8, 500.0, True, 3), "fp32")
    assert_close("k", k2, reference.apply_rotary(k, 8, 500.0, True, 3), "fp32")


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_varlen_with_offsets_per_sequence(interleaved):
    x = torch.randn(1, 21, 3, 16, device=DEVICE)
    cu = torch.tensor([0, 4, 4, 13, 21], device=DEVICE, dtype=torch.int32)
    offsets = torch.tensor([0, 7, 100, 2000], device=DEVICE)
    dy = torch.randn_like(x)
    check_against_reference(
        lambda x: apply_rotary(x, 12, 10000.0, interleaved, offsets, cu),
        lambda x: reference.apply_rotary(x, 12, 10000.0, interleaved, offsets.cpu(), cu.cpu()),
        [x], [dy],
    )


def test_rotary_reads_strided_inputs():
    """q, k as slices of one fused projection, and a gradient arriving as a slice."""
    qkv = torch.randn(2, 7, 3, 4, 16, device=DEVICE)
    dy = torch.randn(2, 7, 4, 32, device=DEVICE)[..., 8:24]
    check_against_reference(
        lambda qkv: apply_rotary(qkv[:, :, 1], 16, 10000.0, False, 5),
        lambda qkv: reference.apply_rotary(qkv[:, :, 1], 16, 10000.0, False, 5),
        [qkv], [dy],
    )


def _tables(dim, positions, base=10000.0):
    inv = base ** (-torch.arange(dim // 2, dtype=torch.float64) * 2 / dim)
    angle = torch.arange(positions, dtype=torch.float64)[:, None] * inv
    return angle.cos().float().to(DEVICE), angle.sin().float().to(DEVICE)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_from_tables_matches_reference(interleaved):
    x = torch.randn(1, 17, 2, 24, device=DEVICE)
    cos, sin = _tables(16, 64)
    cu = torch.tensor([0, 5, 17], device=DEVICE)
    offsets = torch.tensor([3, 40], device=DEVICE)
    dy = torch.randn_like(x)
    check_against_reference(
        lambda x: rotary_embedding(x, cos, sin, interleaved, offsets, cu),
        lambda x: reference.apply_rotary(x, 16, 10000.0, interleaved, offsets.cpu(), cu.cpu()),
        [x], [dy],
    )


def test_rotary_positions_past_the_table_are_an_error():
    x = torch.randn(2, 10, 2, 16, device=DEVICE)
    cos, sin = _tables(16, 12)
    with pytest.raises(ValueError, match=r"\[3, 13\).*\[0, 12\)"):
        rotary_embedding(x, cos, sin, seqlen_offsets=3)
    with pytest.raises(ValueError, match=r"positions reach"):
        rotary_embedding(x, cos, sin, seqlen_offsets=torch.tensor([0, 5], device=DEVICE))
    with pytest.raises(ValueError, match=r"positions reach"):
        rotary_embedding(x, cos, sin, seqlen_offsets=-1)
    with pytest.raises(ValueError, match=r"`cos` and `sin`"):
        rotary_embedding(x, cos.requires_grad_(), sin)


def _rotary_op_args(x):
    cu = torch.tensor([0, 3, 8], device=DEVICE)
    offsets = torch.tensor([2, 30], device=DEVICE)
    cos, sin = _tables(8, 40)
    # (op, its arguments, keep)
    return [
        (APPLY_ROTARY, (x, None, None, None, None, None, 16, 10000.0, 0, False), True),
        (APPLY_ROTARY, (x[:1], None, None, offsets, cu, cu.cpu(), 8, 500.0, 0, True), True),
        (ROTARY_EMBEDDING, (x, cos, sin, None, None, None, 8, 0.0, 3, False), False),
    ]


@pytest.mark.parametrize("case", range(3))
def test_rotary_custom_op_passes_opcheck(case):
    x = torch.randn(2, 8, 2, 16, device=DEVICE, requires_grad=True)
    op, args, keep = _rotary_op_args(x)[case]
    torch.library.opcheck(op.forward_op, (*args, keep))


def _compile_backend():
    return "inductor" if DEVICE.type == "cuda" else "aot_eager"


def test_rotary_under_torch_compile_fullgraph():
    torch._dynamo.reset()
    rope = RotaryEmbedding(16)

    def step(q, k):
        q2, k2 = rope(q, k, seqlen_offset=5)
        return (q2 * q2).sum() + (k2 * torch.arange(k2.shape[-1], device=k2.device)).sum()

    q = torch.randn(2, 6, 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 6, 2, 16, device=DEVICE, requires_grad=True)
    eager = step(q, k)
    eager_grads = torch.autograd.grad(eager, (q, k))
    compiled = torch.compile(step, fullgraph=True, backend=_compile_backend())
    out = compiled(q, k)
    grads = torch.autograd.grad(out, (q, k))
    torch.testing.assert_close(out, eager)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e)


def test_rotary_misuse_under_torch_compile_is_the_same_error():
    torch._dynamo.reset()
    rope = RotaryEmbedding(64)
    q = torch.randn(1, 4, 2, 16, device=DEVICE)
    with pytest.raises(Exception, match=r"64.*16"):
        torch.compile(lambda q: rope(q, q), fullgraph=True, backend=_compile_backend())(q)


def test_rotary_varlen_under_torch_compile():
    torch._dynamo.reset()
    rope = RotaryEmbedding(8, interleaved=True)
    cu = torch.tensor([0, 2, 9], device=DEVICE)
    q = torch.randn(1, 9, 2, 8, device=DEVICE, requires_grad=True)
    fn = lambda q: rope(q, q, cu_seqlens=cu)[0].square().sum()  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend=_compile_backend())(q), fn(q))


# ----------------------------------------------------------------------------- causal conv1d


@pytest.mark.parametrize("activation", [None, "silu"])
def test_conv_gradients_for_strided_x_and_dy(activation):
    """x is a channel slice of one projection; dy arrives as a slice of a concat."""
    D, W = 12, 4
    proj = torch.randn(2, 11, 3 * D, device=DEVICE)
    weight = torch.randn(D, W, device=DEVICE)
    bias = torch.randn(D, device=DEVICE)
    dy = torch.cat([torch.randn(2, 11, D, device=DEVICE), torch.randn(2, 11, D, device=DEVICE)], -1)[..., D:]
    assert not dy.is_contiguous()
    check_against_reference(
        lambda proj, w, b: causal_conv1d(proj[..., D:2 * D], w, b, activation),
        lambda proj, w, b: reference.causal_conv1d(proj[..., D:2 * D], w, b, activation),
        [proj, weight, bias], [dy],
    )


@pytest.mark.parametrize("width", [2, 3, 4])
def test_conv_short_sequences_carry_the_state(width):
    """Sequences shorter than W - 1 (and empty ones) take their final state partly from
    the initial state; its gradient flows back to both x and initial_state."""
    D = 8
    lengths = [0, 1, 2, 5, 0, 1]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=DEVICE)
    T = int(cu[-1])
    N = len(lengths)
    x = torch.randn(1, T, D, device=DEVICE)
    weight = torch.randn(D, width, device=DEVICE)
    state = torch.randn(N, D, width - 1, device=DEVICE)
    dy, dfinal = torch.randn(1, T, D, device=DEVICE), torch.randn(N, D, width - 1, device=DEVICE)
    check_against_reference(
        lambda x, w, h: causal_conv1d(x, w, None, "silu", h, True, cu),
        lambda x, w, h: reference.causal_conv1d(x, w, None, "silu", h, True, cu.cpu()),
        [x, weight, state], [dy, dfinal],
    )


def test_conv_batch_shorter_than_the_window():
    x = torch.randn(3, 2, 8, device=DEVICE)
    weight, state = torch.randn(8, 4, device=DEVICE), torch.randn(3, 8, 3, device=DEVICE)
    check_against_reference(
        lambda x, w, h: causal_conv1d(x, w, None, None, h, True),
        lambda x, w, h: reference.causal_conv1d(x, w, None, None, h, True),
        [x, weight, state], [torch.randn(3, 2, 8, device=DEVICE), torch.randn(3, 8, 3, device=DEVICE)],
    )


@pytest.mark.parametrize("fwd,bwd", [((3, 1, 8, 1), (2, 1, 8, 1)), ((5, 3, 16, 1), (4, 2, 16, 1))],
                         ids=["3-rows", "5-rows"])
@pytest.mark.parametrize("channels_fastest", [False, True], ids=["2d-grid", "channels-fastest"])
def test_conv_streaming_ranges_cross_sequences(monkeypatch, fwd, bwd, channels_fastest):
    """Short row ranges per program, so ranges start inside sequences, sequences start
    inside ranges, and the channel dim spans several blocks; in both program orders."""
    monkeypatch.setattr(conv_module, "_fwd_config", lambda D: fwd)
    monkeypatch.setattr(conv_module, "FWD_CHANNELS_FASTEST", channels_fastest)
    monkeypatch.setattr(conv_module, "_bwd_config", lambda D, W: bwd)
    D, W = 20, 4
    cu = torch.tensor([0, 1, 7, 7, 8, 19, 23], device=DEVICE)
    x = torch.randn(1, 23, D, device=DEVICE)
    weight, bias = torch.randn(D, W, device=DEVICE), torch.randn(D, device=DEVICE)
    state = torch.randn(6, D, W - 1, device=DEVICE)
    check_against_reference(
        lambda x, w, b, h: causal_conv1d(x, w, b, "silu", h, True, cu),
        lambda x, w, b, h: reference.causal_conv1d(x, w, b, "silu", h, True, cu.cpu()),
        [x, weight, bias, state], [torch.randn(1, 23, D, device=DEVICE), torch.randn(6, D, W - 1, device=DEVICE)],
    )


def test_conv_parameter_gradients_are_bitwise_deterministic(monkeypatch):
    monkeypatch.setattr(conv_module, "_bwd_config", lambda D, W: (4, 2, 16, 1))
    x = torch.randn(2, 30, 16, device=DEVICE, requires_grad=True)
    weight = torch.randn(16, 4, device=DEVICE, requires_grad=True)
    bias = torch.randn(16, device=DEVICE, requires_grad=True)
    dy = torch.randn(2, 30, 16, device=DEVICE)
    first = torch.autograd.grad(causal_conv1d(x, weight, bias, "silu")[0], (weight, bias), dy)
    second = torch.autograd.grad(causal_conv1d(x, weight, bias, "silu")[0], (weight, bias), dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- norms


def test_norms_read_row_strided_inputs():
    """x and g as slices of wider tensors (a row stride that is not D)."""
    base = torch.randn(6, 5, 80, device=DEVICE)
    weight = torch.randn(24, device=DEVICE)
    dy = torch.randn(6, 5, 24, device=DEVICE)
    check_against_reference(
        lambda base, w: rms_norm_gated(base[..., 8:32], base[..., 40:64], w, activation="sigmoid"),
        lambda base, w: reference.rms_norm_gated(base[..., 8:32], base[..., 40:64], w, activation="sigmoid"),
        [base, weight], [dy],
    )
    check_against_reference(lambda base: l2norm(base[..., :24]), lambda base: reference.l2norm(base[..., :24]), [base], [dy])


def test_norm_weight_gradient_sums_over_many_programs(monkeypatch):
    """Few multiprocessors and two-row tiles, so each backward program loops over about ten
    row blocks (the last program fewer) before writing its partial sums: dweight and dbias
    still match the reference, bit for bit from run to run."""
    monkeypatch.setattr(_partials, "multiprocessor_count", lambda device: 1)
    monkeypatch.setattr(norm_module, "BWD_TILE_ELEMENTS", 64)  # 2 rows of 32: 150 blocks, 10 programs
    x = torch.randn(300, 20, device=DEVICE)
    weight, bias = torch.randn(20, device=DEVICE), torch.randn(20, device=DEVICE)
    dy = torch.randn(300, 20, device=DEVICE)
    check_against_reference(rms_norm, reference.rms_norm, [x, weight, bias], [dy])
    runs = [torch.autograd.grad(rms_norm(x, w, b), (w, b), dy) for w, b in [(leaf(weight), leaf(bias))] * 2]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_norm_backward_without_parameters_over_many_row_blocks(monkeypatch):
    """l2norm's backward has no parameter gradient, so it takes its own tile
    (``BWD_TILE_ELEMENTS_NO_PARAMS``) and one row block a program: at two-row tiles over an odd
    row count (151 programs, the last one row) every block still matches the reference."""
    monkeypatch.setattr(norm_module, "BWD_TILE_ELEMENTS_NO_PARAMS", 64)
    monkeypatch.setattr(norm_module, "BWD_TILE_ELEMENTS", 1 << 14)  # the tile with parameters: one block
    x, dy = torch.randn(301, 20, device=DEVICE), torch.randn(301, 20, device=DEVICE)
    check_against_reference(l2norm, reference.l2norm, [x], [dy])
    y = l2norm(leaf(x))
    with observe_launches() as launches:
        y.backward(dy)
    assert launches.grids == [(151,)]


def test_norm_of_a_single_row_and_of_a_1d_tensor():
    for shape in [(1, 33), (33,)]:
        x, g = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
        check_against_reference(rms_norm_gated, reference.rms_norm_gated, [x, g], [torch.randn(shape, device=DEVICE)])


def test_norm_dims_beyond_the_supported_range_are_an_error():
    with pytest.raises(ValueError, match=r"16385.*1\.\.16384"):
        l2norm(torch.zeros(2, 16385, device=DEVICE))
    with pytest.raises(ValueError, match=r"`weight`.*\[8\]"):
        rms_norm(torch.zeros(2, 8, device=DEVICE), torch.zeros(9, device=DEVICE))


@pytest.mark.parametrize("D", [16, 48, 128, 200, 256, 512, 1000, 1024, 2048, 16384])
@pytest.mark.parametrize("gated", [False, True])
def test_a_backward_tile_holds_whole_rows_at_32_values_a_thread(D, gated):
    # the register budget every backward tile with parameter gradients was timed at
    # (kernels/norm.py): more values a thread spill, fewer left the H200's tiles slower
    BLOCK_R, BLOCK_D, warps = norm_module._backward_tile(D, True, gated)
    assert BLOCK_D == triton.next_power_of_2(D)
    assert 1 <= warps <= 16
    assert BLOCK_R * BLOCK_D == 32 * 32 * warps
