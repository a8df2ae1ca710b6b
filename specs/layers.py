"""Layers: GatedDeltaNet as a function of its parameters (``kernels.layers.gated_delta_net``).

Every parameter is an input, so the generic checks run on the layer as they do on an op:
forward and backward (through the input and every weight) against the float64
composition of the references (``reference.layers``; in bf16 and fp16 rounded where the
layer hands its activations from op to op), packed sequences, bad inputs,
devices, huge batches. Dims: ``C`` the hidden size, ``H`` / ``HV`` query-key / value
heads of dims ``K`` / ``V``, ``W`` the conv width; ``HK = H K`` and ``HVV = HV V`` are
derived. Weights are drawn as ``randn / sqrt(fan_in)`` (conv weights ``randn / 2``), so
activations keep unit scale through the layer.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch

from pytest_fla.api import Arg, Case, ErrorInput, OpSpec, Sample, make_factory
from .common import INT64_DIMS, varlen_errors, with_args

ARGS = {
    "x": Arg(("B", "T", "C")),
    "q_weight": Arg(("HK", "C")),
    "k_weight": Arg(("HK", "C")),
    "v_weight": Arg(("HVV", "C")),
    "a_weight": Arg(("HV", "C")),
    "b_weight": Arg(("HV", "C")),
    "A_log": Arg(("HV",), float32=True),
    "dt_bias": Arg(("HV",), float32=True),
    "q_conv_weight": Arg(("HK", "W")),
    "k_conv_weight": Arg(("HK", "W")),
    "v_conv_weight": Arg(("HVV", "W")),
    "o_weight": Arg(("C", "HVV")),
    "g_weight": Arg(("HVV", "C"), optional=True),
    "norm_weight": Arg(("V",), "positive"),
}
FAN_IN = {"q_weight": "C", "k_weight": "C", "v_weight": "C", "a_weight": "C", "b_weight": "C",
          "g_weight": "C", "o_weight": "HVV"}


def _dims(case: Case) -> dict:
    dims = dict(case.dims)
    dims.setdefault("HV", dims["H"])
    dims.setdefault("V", dims["K"])
    dims.setdefault("C", dims["H"] * dims["K"])
    dims.setdefault("W", 4)
    dims["HK"], dims["HVV"] = dims["H"] * dims["K"], dims["HV"] * dims["V"]
    return dims


def _factory():
    base = make_factory(ARGS)

    def factory(case: Case, dtype, device, gen, lengths) -> Sample:
        dims = _dims(case)
        options = {k: v for k, v in case.options.items() if k != "output_final_state"}
        sample = base(dataclasses.replace(case, dims=dims, options=options), dtype, device, gen, lengths)
        kw = sample.kwargs
        for name, fan_in in FAN_IN.items():
            if name in kw:
                kw[name] = kw[name] * max(dims[fan_in], 1) ** -0.5  # a zero width's error input has empty weights
        for name in ("q_conv_weight", "k_conv_weight", "v_conv_weight"):
            kw[name] = kw[name] * 0.5
        kw["num_heads"], kw["num_v_heads"] = dims["H"], dims["HV"]
        return sample

    return factory


def _errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
    case = spec.cases[0]
    kw = spec.sample(case, "fp32", device).kwargs
    yield ErrorInput("x_float64", with_args(kw, x=kw["x"].double()), TypeError, "`x`.*dtype")
    yield ErrorInput("x_2d", with_args(kw, x=kw["x"][0].contiguous()), ValueError, "`x`")
    yield ErrorInput("q_weight_bf16", with_args(kw, q_weight=kw["q_weight"].bfloat16()), TypeError, "`q_weight`")
    for name in ("k_weight", "v_weight", "a_weight", "o_weight", "A_log", "v_conv_weight", "g_weight", "norm_weight"):
        t = kw[name]
        yield ErrorInput(f"{name}_shape", with_args(kw, **{name: t[..., :-1].contiguous()}), ValueError, f"`{name}`.*shape")
    yield ErrorInput("num_heads_not_dividing", with_args(kw, num_heads=kw["num_v_heads"] + 1), ValueError, "num_heads|num_v_heads")
    yield ErrorInput("mode_unknown", with_args(kw, mode="parallel"), ValueError, "`mode`")
    # zero widths (docs/ops.md): the hidden size, each head dim read off its projection, the conv's width
    flat = dataclasses.replace(case, gpu_dims=None)
    for dim, what in (("C", r"hidden size \(x\.shape\[-1\]\)"), ("K", r"key head dim K \(q_weight"),
                      ("V", r"value head dim V \(v_weight"), ("W", r"conv width W \(q_conv_weight")):
        yield ErrorInput(f"zero_width_{dim}", spec.sample(flat.with_dims(**{dim: 0}), "fp32", device).kwargs,
                         ValueError, f"{what}.* = 0 is outside the supported range")
    yield from varlen_errors(spec, case, device)


SMALL = {"B": 2, "T": 80, "C": 32, "H": 1, "HV": 2, "K": 16, "V": 24}
GPU = {"B": 2, "T": 2048, "C": 1024, "H": 4, "HV": 8, "K": 128, "V": 128}
DEFAULT_HEAD_DIMS = {"B": 1, "T": 70, "C": 256, "H": 1, "K": 256, "V": 512}

GATED_DELTA_NET = OpSpec(
    name="gated_delta_net",
    family="layers",
    op="kernels.layers.gated_delta_net",
    reference="reference.layers.gated_delta_net",
    factory=_factory(),
    cases=(
        # a ragged second chunk, grouped value heads, the swish-gated output norm
        Case("chunk_gva_gate", SMALL, options={"g_weight": True}, gpu_dims=GPU),
        # the inference path for short inputs: one pass over time, a plain output norm
        Case("fused_recurrent_short", {"B": 2, "T": 20, "C": 24, "H": 2, "K": 16, "V": 16},
             options={"mode": "fused_recurrent"},
             gpu_dims={"B": 8, "T": 64, "C": 1024, "H": 8, "K": 128, "V": 128}),
        # the module's default head dims (head_dim 256, expand_v 2: value heads of 512), as
        # GatedDeltaNet(256, num_heads=1) and, on the GPU, GatedDeltaNet(1024, num_heads=4)
        Case("default_head_dims", DEFAULT_HEAD_DIMS, options={"g_weight": True},
             gpu_dims={**DEFAULT_HEAD_DIMS, "B": 2, "T": 2048, "C": 1024, "H": 4}),
        Case("default_head_dims_fused_recurrent", {**DEFAULT_HEAD_DIMS, "T": 12},
             options={"g_weight": True, "mode": "fused_recurrent"},
             gpu_dims={**DEFAULT_HEAD_DIMS, "B": 8, "T": 64, "C": 1024, "H": 4}),
    ),
    grads=tuple(name for name in ARGS),
    errors=_errors,
    outputs=("y",),
    chunk_size=64,
    compile_cases=(
        Case("d128", {"B": 1, "T": 128, "C": 512, "H": 2, "HV": 4, "K": 128, "V": 128}, options={"g_weight": True}),
        Case("default_head_dims", {**DEFAULT_HEAD_DIMS, "T": 128}, options={"g_weight": True}),
    ),
    min_arch=(80, "chunk_gated_delta_rule's [64, K] tiles exceed sm75's 64 KB of shared memory"),
    # the reported layer: hidden 128, 6 heads of 16, value heads of 32 (B * H = 65538)
    huge_grid={"B": 10923, "T": 32, "C": 128, "H": 6, "K": 16, "V": 32},
    int64_dims=INT64_DIMS,
    args=ARGS,
    # bf16/fp16 runs compare with the composition rounded where the layer stores its
    # activations: at the small sizes the sanitizer runs, rounding them alone moves the
    # weight gradients by 1-2e-2 (docs/tolerances.md, "Layers")
    reference_rounds=True,
    # one value per head, each a sum over every token of terms of both signs: their errors
    # are measured against the terms' magnitudes (docs/tolerances.md, "Token-reduced parameters")
    token_reduced=("A_log", "dt_bias"),
)

SPECS = [GATED_DELTA_NET]
