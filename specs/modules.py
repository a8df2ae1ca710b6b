"""The modules around every linear-attention layer: rotary embedding, the three
normalisations and the short causal convolution.

Dims: ``D`` is the normalised, rotated or convolved dim, ``H`` heads (tokens of
``[B, T, H, D]``), ``W`` the conv width (4 where a case does not say) and ``S = W - 1``
its state length; the huge-grid and 64-bit-offset sizes are given per spec. Options a
factory turns into arguments (``offsets_tensor``) never reach the op.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import torch

from pytest_fla.api import (LOW_PRECISION_STATES, Arg, Case, ErrorInput, OpSpec, Sample, dtype_errors, huge_grid_dims,
                            make_factory, op_spec, state_dtype_errors, varlen_errors, with_args, zero_heads_errors,
                            zero_width_errors)

TOKENS = ("B", "T", "H", "D")
DEFAULT_WIDTH = 4
# B * H just past 65535 (B = 10923, H = 6), at a small D; the 64-bit-offset sample.
HUGE_TOKENS = huge_grid_dims({"T": 32, "H": 6, "D": 16})
INT64_TOKENS = {"B": 2, "T": 64, "H": 4, "D": 128}


def _factory(args, **hooks):
    """``make_factory(args, **hooks)`` that burns one draw first: the checks draw
    cotangents from a generator seeded like this one, and for an op whose output is its
    input rescaled (l2norm, rotary at position 0) the same draws would make dy parallel
    to x and the gradient vanish."""
    base = make_factory(args, **hooks)

    def factory(case: Case, dtype, device, gen, lengths) -> Sample:
        torch.randn(1, generator=gen)
        return base(case, dtype, device, gen, lengths)

    return factory


# ----------------------------------------------------------------------------- norms

NORM_ARGS = {
    "x": Arg(TOKENS),
    "g": Arg(TOKENS, optional=True),
    "weight": Arg(("D",), "positive", optional=True, float32=True),
    "bias": Arg(("D",), optional=True),
}
NORM_SMALL = {"B": 2, "T": 7, "H": 3, "D": 48}
NORM_GPU = {"B": 4, "T": 1024, "H": 16, "D": 128}
# 265 row blocks of one row (D = 8192): one more than the partial-sum programs of the backward
NORM_SHARED_PROGRAMS = {"B": 1, "T": 265, "H": 1, "D": 8192}
NORM_COMPILE_DIMS = {
    "d128": {"B": 1, "T": 64, "H": 4, "D": 128},
    "d4096": {"B": 1, "T": 16, "H": 1, "D": 4096},
    "d16384": {"B": 1, "T": 4, "H": 1, "D": 16384},
}


def _norm_errors(gated: bool, affine: bool):
    def errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
        kwargs = spec.sample(spec.cases[-1], "fp32", device).kwargs
        yield from dtype_errors(kwargs, "x")
        x = kwargs["x"]
        if gated:
            yield ErrorInput("g_shape", with_args(kwargs, g=kwargs["g"][..., :-1].contiguous()), ValueError, "`g`.*shape")
            yield ErrorInput("g_dtype_differs", with_args(kwargs, g=kwargs["g"].half()), TypeError, "`g`")
            yield ErrorInput("activation_unknown", with_args(kwargs, activation="relu"), ValueError, "`activation`")
        if affine or gated:
            yield ErrorInput("weight_shape", with_args(kwargs, weight=torch.ones(x.shape[-1] + 1, device=device)), ValueError, "`weight`.*shape")
        if affine:
            yield ErrorInput("bias_shape", with_args(kwargs, bias=torch.ones(1, x.shape[-1], device=device)), ValueError, "`bias`.*shape")
        wide = torch.zeros(2, 16385, device=device)
        big = {"x": wide, **({"g": wide} if gated else {})}
        yield ErrorInput("dim_16385", big, ValueError, "16385.*supported range")
        yield from zero_width_errors(spec, spec.cases[0], device, {"D": "x"})
        yield ErrorInput("eps_negative", with_args(kwargs, eps=-1.0), ValueError, "`eps`")

    return errors


def _norm_spec(name: str, args: dict, cases, grads, gated=False, affine=False) -> OpSpec:
    return op_spec(
        name,
        family="modules",
        op=f"kernels.{name}",
        reference=f"reference.{name}",
        args=args,
        factory=_factory(args),
        cases=cases,
        grads=grads,
        errors=_norm_errors(gated, affine),
        outputs=("y",),
        varlen=False,
        # every optional input switched on: the widest kernel variant of the op
        compile_cases=tuple(Case(name, dims, options={k: True for k in args if k != "x"})
                            for name, dims in NORM_COMPILE_DIMS.items()),
        huge_grid=HUGE_TOKENS,
        int64_dims=INT64_TOKENS,
    )


L2NORM = _norm_spec(
    "l2norm", {"x": NORM_ARGS["x"]},
    (Case("plain", NORM_SMALL, gpu_dims=NORM_GPU),
     Case("odd_dim", {"B": 3, "T": 5, "H": 1, "D": 100}, gpu_dims={**NORM_GPU, "D": 1000}),
     # rows whose squared norm is near eps (and the zero padding rows every sample has):
     # a kernel that adds 2 eps, or none, fails forward and backward
     Case("near_eps", NORM_SMALL, dist="near_eps", gpu_dims=NORM_GPU)),
    grads=("x",),
)
RMS_NORM = _norm_spec(
    "rms_norm", {k: NORM_ARGS[k] for k in ("x", "weight", "bias")},
    (Case("plain", NORM_SMALL, gpu_dims=NORM_GPU),
     Case("weight", {**NORM_SMALL, "D": 24}, options={"weight": True}, gpu_dims={"B": 2, "T": 512, "H": 1, "D": 4096}),
     Case("weight_bias", {"B": 2, "T": 3, "H": 2, "D": 100}, options={"weight": True, "bias": True},
          gpu_dims={**NORM_GPU, "D": 96}),
     # more row blocks than the backward's partial-sum programs (264 under the
     # interpreter, which assumes an H100): program 0 adds two blocks into its dweight
     # row, the [P, 2 D] partials sum has rows past P in its block, and each program's
     # dbias lands at its own row (the one case with more than one program and a bias)
     Case("shared_programs", NORM_SHARED_PROGRAMS, options={"weight": True, "bias": True},
          checks=("forward", "backward")),
     Case("near_eps", NORM_SMALL, dist="near_eps", options={"weight": True, "bias": True}, gpu_dims=NORM_GPU)),
    grads=("x", "weight", "bias"), affine=True,
)
RMS_NORM_GATED = _norm_spec(
    "rms_norm_gated", {k: NORM_ARGS[k] for k in ("x", "g", "weight")},
    (Case("swish", NORM_SMALL, options={"g": True, "weight": True}, gpu_dims=NORM_GPU),
     Case("sigmoid_no_weight", {**NORM_SMALL, "D": 20}, options={"g": True, "activation": "sigmoid"},
          gpu_dims={**NORM_GPU, "D": 256}),
     # the backward's tile by row width (kernels/norm.py): rows of 256 eight to a tile, of
     # 1024 two to a tile on the GPU, some tiles part-filled
     Case("tile_widths", {"B": 1, "T": 5, "H": 2, "D": 256}, options={"g": True, "weight": True},
          gpu_dims={"B": 2, "T": 333, "H": 3, "D": 1024}),
     Case("wide", {"B": 1, "T": 2, "H": 1, "D": 2000}, options={"g": True, "weight": True},
          gpu_dims={"B": 2, "T": 64, "H": 1, "D": 8192}),
     # three row blocks of 128 (D = 48): three partial-sum programs, summed in a block of four
     Case("three_blocks", {"B": 2, "T": 50, "H": 3, "D": 48}, options={"g": True, "weight": True},
          gpu_dims=NORM_GPU),
     # g's rows are scaled with x's: sigmoid keeps the small rows' output at half of xh
     # (swish would take it to about 1e-3 of it, below what the check sees)
     Case("near_eps", NORM_SMALL, dist="near_eps", options={"g": True, "weight": True, "activation": "sigmoid"},
          gpu_dims=NORM_GPU)),
    grads=("x", "g", "weight"), gated=True,
)


# ----------------------------------------------------------------------------- causal conv1d

CONV_ARGS = {
    "x": Arg(("B", "T", "D")),
    "weight": Arg(("D", "W"), float32=True),
    "bias": Arg(("D",), optional=True),
    "initial_state": Arg(("N", "D", "S"), "state", optional=True),
}


def _with_width(case: Case) -> Case:
    width = case.dims.get("W", DEFAULT_WIDTH)
    return dataclasses.replace(case, dims={**case.dims, "W": width, "S": width - 1})


CONV_SMALL = {"B": 2, "T": 19, "D": 24}
CONV_GPU = {"B": 2, "T": 2048, "D": 1024}
CONV_STATE = {"initial_state": True, "output_final_state": True}


def _conv_errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
    case = spec.cases[0]
    kwargs = spec.sample(case, "fp32", device).kwargs
    yield from dtype_errors(kwargs, "x")
    x, weight, state = kwargs["x"], kwargs["weight"], kwargs["initial_state"]
    D = x.shape[-1]
    yield ErrorInput("x_2d", with_args(kwargs, x=x[0].contiguous()), ValueError, "`x`")
    yield ErrorInput("weight_channels", with_args(kwargs, weight=torch.zeros(D + 1, 4, device=device)), ValueError, "`weight`.*shape")
    yield ErrorInput("weight_transposed", with_args(kwargs, weight=weight.t().contiguous()), ValueError, "`weight`|width")
    yield ErrorInput("width_5", with_args(kwargs, weight=torch.zeros(D, 5, device=device), initial_state=None),
                     ValueError, "width W.*5.*supported range")
    yield ErrorInput("width_1", with_args(kwargs, weight=torch.zeros(D, 1, device=device), initial_state=None),
                     ValueError, "width W.*1.*supported range")
    yield ErrorInput("bias_shape", with_args(kwargs, bias=torch.zeros(D + 1, device=device)), ValueError, "`bias`.*shape")
    yield ErrorInput("activation_unknown", with_args(kwargs, activation="relu"), ValueError, "`activation`")
    yield ErrorInput("initial_state_width", with_args(kwargs, initial_state=state[..., :-1].contiguous()), ValueError, "`initial_state`.*shape")
    yield from state_dtype_errors(spec, kwargs)
    yield ErrorInput("initial_state_channels_last", with_args(kwargs, initial_state=state.transpose(1, 2).contiguous()), ValueError, "`initial_state`")
    yield from zero_width_errors(spec, case, device, {"D": "x"})
    yield from varlen_errors(spec, case, device)


CAUSAL_CONV1D = op_spec(
    "causal_conv1d",
    family="modules",
    op="kernels.causal_conv1d",
    reference="reference.causal_conv1d",
    args=CONV_ARGS,
    factory=_factory(CONV_ARGS, prepare=_with_width),
    cases=(
        Case("silu_state", CONV_SMALL, options={"bias": True, "activation": "silu", **CONV_STATE}, gpu_dims=CONV_GPU),
        Case("plain", {**CONV_SMALL, "D": 40}, gpu_dims={**CONV_GPU, "D": 4096}),
        Case("width2_state", {"B": 3, "T": 9, "D": 16, "W": 2}, options={"bias": True, **CONV_STATE},
             gpu_dims={"B": 3, "T": 1000, "D": 2048, "W": 2}),
        Case("width3_short", {"B": 2, "T": 1, "D": 8, "W": 3}, options={"activation": "silu", **CONV_STATE},
             gpu_dims={"B": 2, "T": 1, "D": 4096, "W": 3}),
    ),
    grads=("x", "weight", "bias", "initial_state"),
    errors=_conv_errors,
    outputs=("y", "final_state"),
    state_dtypes=LOW_PRECISION_STATES,
    compile_cases=(
        Case("d4096_w4", {"B": 1, "T": 64, "D": 4096}, options={"bias": True, "activation": "silu", **CONV_STATE}),
        Case("d2048_w2", {"B": 1, "T": 64, "D": 2048, "W": 2}, options=CONV_STATE),
    ),
    # the same batch as the token ops' (the conv has no heads)
    huge_grid={k: v for k, v in HUGE_TOKENS.items() if k != "H"},
    int64_dims={k: v for k, v in INT64_TOKENS.items() if k != "H"},
)


# ----------------------------------------------------------------------------- rotary

ROTARY_ARGS = {"x": Arg(TOKENS)}


def _rotary_prepare(case: Case) -> Case:
    options = dict(case.options)
    options.setdefault("dim", case.dims["D"])
    return dataclasses.replace(case, options=options)


def _rotary_finish(case: Case, sample: Sample, lengths, gen) -> None:
    """``offsets_tensor``: one random position offset per sequence, as an int tensor."""
    if case.options.get("offsets_tensor"):
        x = sample.kwargs["x"]
        N = len(lengths) if lengths is not None else x.shape[0]
        sample.kwargs["seqlen_offset"] = torch.randint(0, 4096, (N,), generator=gen).to(x.device)


ROTARY_SMALL = {"B": 2, "T": 13, "H": 3, "D": 16}
ROTARY_GPU = {"B": 2, "T": 2048, "H": 16, "D": 128}
ROTARY_COMPILE_CASES = tuple(
    Case(f"d{d}_{'gptj' if il else 'neox'}", {"B": 1, "T": 16, "H": 32, "D": d}, options={"interleaved": il})
    for d in (64, 128, 256) for il in (False, True)
)


def _rotary_errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
    case = spec.cases[0]
    kwargs = spec.sample(case, "fp32", device).kwargs
    D = kwargs["x"].shape[-1]
    yield from dtype_errors(kwargs, "x")
    yield ErrorInput("x_3d", with_args(kwargs, x=kwargs["x"][0].contiguous()), ValueError, "`x`")
    yield ErrorInput("dim_is_model_width", with_args(kwargs, dim=D * 4), ValueError, f"{D * 4}.*{D}")
    yield ErrorInput("dim_odd", with_args(kwargs, dim=D - 1), ValueError, f"{D - 1}.*{D}")
    yield ErrorInput("dim_zero", with_args(kwargs, dim=0), ValueError, f"0.*{D}")
    yield ErrorInput("offsets_wrong_length", with_args(kwargs, seqlen_offset=torch.zeros(kwargs["x"].shape[0] + 1, dtype=torch.int64, device=device)),
                     ValueError, "`seqlen_offset`.*shape")
    yield ErrorInput("offsets_float", with_args(kwargs, seqlen_offset=torch.zeros(kwargs["x"].shape[0], device=device)),
                     TypeError, "`seqlen_offset`.*dtype")
    yield ErrorInput("offset_float", with_args(kwargs, seqlen_offset=1.5), TypeError, "`seqlen_offset`")
    yield ErrorInput("head_dim_2048", {"x": torch.zeros(1, 1, 1, 2048, device=device), "dim": 64}, ValueError, "2048.*supported range")
    yield from zero_heads_errors(spec, case, device, {"H": "x"})
    yield from zero_width_errors(spec, case, device, {"D": "x"})
    yield from varlen_errors(spec, case, device)


ROTARY = op_spec(
    "apply_rotary",
    family="modules",
    op="kernels.apply_rotary",
    reference="reference.apply_rotary",
    args=ROTARY_ARGS,
    factory=_factory(ROTARY_ARGS, drop=("offsets_tensor",), prepare=_rotary_prepare, finish=_rotary_finish),
    cases=(
        Case("neox", ROTARY_SMALL, options={"seqlen_offset": 5}, gpu_dims=ROTARY_GPU),
        Case("gptj_partial", {**ROTARY_SMALL, "D": 24}, options={"dim": 12, "interleaved": True}, gpu_dims={**ROTARY_GPU, "D": 96}),
        Case("offsets_tensor", {**ROTARY_SMALL, "H": 5}, options={"dim": 8, "offsets_tensor": True, "base": 500.0},
             gpu_dims={**ROTARY_GPU, "D": 64}),
        Case("gptj_offsets_tensor", ROTARY_SMALL, options={"interleaved": True, "offsets_tensor": True},
             gpu_dims={**ROTARY_GPU, "D": 256}),
    ),
    grads=("x",),
    errors=_rotary_errors,
    outputs=("y",),
    compile_cases=ROTARY_COMPILE_CASES,
    huge_grid=HUGE_TOKENS,
    int64_dims=INT64_TOKENS,
)


# Table positions past what a sequence reaches: the offsets' range, and a margin.
TABLE_OFFSETS = 64


def _table_finish(case: Case, sample: Sample, lengths, gen) -> None:
    """The cos/sin tables ``[max_pos, R/2]`` of random angles in ``[-pi, pi]`` (the rotary
    width ``R`` is the case's ``dim``), in x's dtype, long enough for every position;
    ``offsets_tensor``: one offset per sequence in ``[0, TABLE_OFFSETS)``."""
    x = sample.kwargs["x"]
    B, T, _, D = x.shape
    if case.options.get("offsets_tensor"):
        N = len(lengths) if lengths is not None else B
        sample.kwargs["seqlen_offsets"] = torch.randint(0, TABLE_OFFSETS, (N,), generator=gen).to(x.device)
    max_pos = T + int(case.options.get("seqlen_offsets", 0)) + TABLE_OFFSETS
    angles = (torch.rand(max_pos, case.options.get("dim", D) // 2, generator=gen) * 2 - 1) * math.pi
    sample.kwargs["cos"] = angles.cos().to(x.dtype).to(x.device)
    sample.kwargs["sin"] = angles.sin().to(x.dtype).to(x.device)


def _table_errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
    kwargs = spec.sample(spec.cases[0], "fp32", device).kwargs
    cos, sin, T = kwargs["cos"], kwargs["sin"], kwargs["x"].shape[1]
    yield from dtype_errors(kwargs, "x")
    yield ErrorInput("x_3d", with_args(kwargs, x=kwargs["x"][0].contiguous()), ValueError, "`x`")
    yield ErrorInput("cos_1d", with_args(kwargs, cos=cos[:, 0].contiguous()), ValueError, "`cos`")
    yield ErrorInput("sin_shape", with_args(kwargs, sin=sin[:, :-1].contiguous()), ValueError, "`sin`.*shape")
    yield ErrorInput("width_past_head_dim", with_args(kwargs, cos=cos.repeat(1, 4), sin=sin.repeat(1, 4)), ValueError,
                     "rotary dim")
    yield ErrorInput("tables_too_short", with_args(kwargs, cos=cos[: T - 1].contiguous(), sin=sin[: T - 1].contiguous()),
                     ValueError, "positions reach")
    yield ErrorInput("offset_negative", with_args(kwargs, seqlen_offsets=-1), ValueError, "positions reach")
    yield ErrorInput("offsets_wrong_length", with_args(kwargs, seqlen_offsets=torch.zeros(kwargs["x"].shape[0] + 1, dtype=torch.int64, device=device)),
                     ValueError, "`seqlen_offsets`.*shape")
    yield ErrorInput("tables_need_grad", with_args(kwargs, cos=cos.clone().requires_grad_()), ValueError, "`cos`")
    yield from zero_heads_errors(spec, spec.cases[0], device, {"H": "x"})
    yield from zero_width_errors(spec, spec.cases[0], device, {"D": "x"})
    yield from varlen_errors(spec, spec.cases[0], device)


ROTARY_EMBEDDING = op_spec(
    "rotary_embedding",
    family="modules",
    op="kernels.rotary_embedding",
    reference="reference.rotary_embedding",
    args=ROTARY_ARGS,
    factory=_factory(ROTARY_ARGS, drop=("offsets_tensor", "dim"), finish=_table_finish),
    cases=(
        Case("neox", ROTARY_SMALL, options={"seqlen_offsets": 5}, gpu_dims=ROTARY_GPU),
        Case("gptj_partial", {**ROTARY_SMALL, "D": 24}, options={"dim": 12, "interleaved": True},
             gpu_dims={**ROTARY_GPU, "D": 96}),
        Case("offsets_tensor", {**ROTARY_SMALL, "H": 5}, options={"dim": 8, "offsets_tensor": True},
             gpu_dims={**ROTARY_GPU, "D": 64}),
    ),
    grads=("x",),
    errors=_table_errors,
    outputs=("y",),
    compile_cases=ROTARY_COMPILE_CASES,
    huge_grid=HUGE_TOKENS,
    int64_dims=INT64_TOKENS,
)

SPECS = [ROTARY, ROTARY_EMBEDDING, L2NORM, RMS_NORM, RMS_NORM_GATED, CAUSAL_CONV1D]
