"""Softmax attention: ``parallel_attn`` (flash style, GQA, sliding window, varlen).

Inputs use the recurrent ops' dim names where they can, so the generic huge-grid and
64-bit checks size them too: ``K`` is the query/key head dim, ``V`` the value head dim,
``HKV`` the key/value heads (``H`` where a case does not say). The op returns ``o`` alone,
like its reference. Options the generic checks ask of every op but attention has no use
for (``output_final_state``) are dropped by the factory.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import torch

from pytest_fla.api import Arg, Case, ErrorInput, OpSpec, Sample, make_factory
from .common import (HUGE_GRID_DIMS, INT64_DIMS, scale_errors, shape_errors, varlen_errors, with_args, zero_heads_errors,
                     zero_width_errors)

ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "HKV", "K")),
    "v": Arg(("B", "T", "HKV", "V")),
}
NOT_ATTENTION_OPTIONS = ("output_final_state",)


def _factory():
    draw = make_factory(ARGS)

    def factory(case: Case, dtype, device, gen, lengths) -> Sample:
        dims = {"HKV": case.dims["H"], **case.dims}
        options = {k: v for k, v in case.options.items() if k not in NOT_ATTENTION_OPTIONS}
        return draw(dataclasses.replace(case, dims=dims, options=options), dtype, device, gen, lengths)

    return factory


def _errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
    case = spec.cases[0]
    kwargs = spec.sample(case, "fp32", device).kwargs
    q, k, v = kwargs["q"], kwargs["k"], kwargs["v"]
    yield ErrorInput("q_float64", with_args(kwargs, q=q.double()), TypeError, "`q`.*dtype")
    yield ErrorInput("q_int", with_args(kwargs, q=q.long()), TypeError, "`q`.*dtype")
    yield ErrorInput("v_dtype_differs", with_args(kwargs, v=v.half()), TypeError, "`v`")
    yield ErrorInput("q_3d", with_args(kwargs, q=q[0].contiguous()), ValueError, "`q`")
    yield from shape_errors(spec, kwargs, "q")
    yield ErrorInput("k_head_dim_differs", with_args(kwargs, k=torch.cat([k, k[..., :1]], -1)), ValueError, "`k`")
    H = q.shape[2]
    three = with_args(kwargs, q=q[:, :, :1].expand(-1, -1, 4, -1).contiguous(),
                     k=k[:, :, :1].expand(-1, -1, 3, -1).contiguous(), v=v[:, :, :1].expand(-1, -1, 3, -1).contiguous())
    yield ErrorInput("heads_not_a_multiple", three, ValueError, "`k`.*HKV|HKV.*`k`")
    more_kv = with_args(kwargs, k=torch.cat([k] * (H + 1), 2)[:, :, : H + 1].contiguous(),
                       v=torch.cat([v] * (H + 1), 2)[:, :, : H + 1].contiguous())
    yield ErrorInput("more_kv_heads_than_q", more_kv, ValueError, "HKV")
    # explicit dims on every device: a case's GPU dims would put the head dim back in range
    big = dataclasses.replace(case, gpu_dims=None)
    yield ErrorInput("head_dim_512", spec.sample(big.with_dims(K=512, V=16), "fp32", device).kwargs, ValueError,
                     "512.*supported range")
    yield ErrorInput("value_head_dim_512", spec.sample(big.with_dims(K=16, V=512), "fp32", device).kwargs,
                     ValueError, "512.*supported range")
    yield ErrorInput("window_size_0", with_args(kwargs, window_size=0), ValueError, "`window_size`")
    yield ErrorInput("window_size_float", with_args(kwargs, window_size=2.5), TypeError, "`window_size`")
    yield ErrorInput("window_size_bool", with_args(kwargs, window_size=True), TypeError, "`window_size`")
    yield from scale_errors(kwargs)
    yield ErrorInput("scale_str", with_args(kwargs, scale="0.1"), TypeError, "`scale`")
    yield ErrorInput("scale_tensor", with_args(kwargs, scale=torch.tensor(0.1)), TypeError, "`scale`")
    yield ErrorInput("causal_none", with_args(kwargs, causal=None), TypeError, "`causal`")
    yield from zero_heads_errors(spec, case, device, {"H": "q"})
    yield from zero_width_errors(spec, case, device, {"K": "q", "V": "v"})
    yield from varlen_errors(spec, case, device)


# CPU sizes: T past one 64-key block and not a multiple of it, head dims not powers of two
# (masked columns), grouped heads; GPU sizes are the realistic ones.
SMALL = {"B": 2, "T": 80, "H": 4, "HKV": 2, "K": 24, "V": 40}
GPU = {"B": 4, "T": 4096, "H": 16, "HKV": 4, "K": 128, "V": 128}
GPU_SMALLER = {"B": 2, "T": 2048, "H": 8, "HKV": 2, "K": 128, "V": 128}

CASES = (
    Case("causal_gqa", SMALL, gpu_dims=GPU),
    # T = 129: the last key block holds one key (at blocks of 16, 32 and 64), and without the
    # causal mask every query row sees it: a loop that stops one key short misses it in
    # every row, not in the last row alone. Two rows: the last row's last token is a zero
    # padding token in every sample (its key adds nothing to dq), the first row's is not
    Case("noncausal", {**SMALL, "B": 2, "T": 129, "H": 2, "HKV": 1, "K": 32, "V": 32}, options={"causal": False},
         gpu_dims={**GPU_SMALLER, "K": 64, "V": 64}),
    # the window cuts key blocks on both sides; a non-causal window sees every later key
    Case("window", {**SMALL, "B": 1, "T": 150, "H": 2, "HKV": 1, "K": 16, "V": 16}, options={"window_size": 40},
         gpu_dims={**GPU_SMALLER, "T": 4096}, checks=("forward", "backward")),
    Case("noncausal_window", {**SMALL, "B": 1, "T": 150, "H": 2, "HKV": 2, "K": 16, "V": 16},
         options={"causal": False, "window_size": 70}, gpu_dims={**GPU_SMALLER, "HKV": 8},
         checks=("forward", "backward")),
    Case("d256", {**SMALL, "B": 1, "T": 40, "H": 2, "HKV": 1, "K": 256, "V": 256},
         gpu_dims={**GPU_SMALLER, "K": 256, "V": 256}, checks=("forward", "backward")),
)
COMPILE = (
    Case("d64_window", {"B": 1, "T": 256, "H": 4, "HKV": 2, "K": 64, "V": 64}, options={"window_size": 100}),
    Case("d128", {"B": 1, "T": 256, "H": 4, "HKV": 2, "K": 128, "V": 128}),
    Case("d128_noncausal", {"B": 1, "T": 256, "H": 4, "HKV": 2, "K": 128, "V": 128}, options={"causal": False}),
    Case("d256", {"B": 1, "T": 256, "H": 4, "HKV": 2, "K": 256, "V": 256}),
)

SPECS = [
    OpSpec(
        name="parallel_attn",
        family="attention",
        op="kernels.parallel_attn",
        reference="reference.attention",
        factory=_factory(),
        cases=CASES,
        grads=("q", "k", "v"),
        errors=_errors,
        outputs=("o",),
        chunk_size=64,
        compile_cases=COMPILE,
        huge_grid=HUGE_GRID_DIMS,
        int64_dims=INT64_DIMS,
        args=ARGS,
        min_arch=(80, "sm75's 64 KB of shared memory does not hold the attention tiles at every head dim"),
    ),
]
