"""Pieces every recurrent (linear-attention) op spec shares: the spec builder and the
error inputs that OPS.md requires of every op.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

import torch

from ..inputs import Arg, cu_seqlens_for, make_factory
from ..spec import Case, ErrorInput, OpSpec

STATE = Arg(("N", "H", "K", "V"), "state", optional=True)
STATE_GVA = Arg(("N", "HV", "K", "V"), "state", optional=True)

# Sizes for the huge-grid check: B*H = 10923 * 6 = 65538 > 65535, the first batch size
# at which a kernel that puts B*H on grid axis 1 or 2 fails with "invalid argument".
HUGE_GRID_DIMS = {"B": 10923, "T": 32, "H": 6, "K": 16, "V": 16}
# for ops whose chunk kernels need sm80's shared memory (kernels raise on older targets)
SM80_AND_NEWER = (80, "the chunk kernels' [64, K] tiles exceed sm75's 64 KB of shared memory")


def wrong_device(device: torch.device) -> torch.device:
    """A device that is not ``device``: the CPU for a GPU run; ``meta`` for a CPU run
    (the interpreter runs on the CPU, so a tensor there is on the *right* device)."""
    return torch.device("cpu") if device.type == "cuda" else torch.device("meta")


def _replace(kwargs, **changes):
    out = dict(kwargs)
    out.update(changes)
    return out


def shape_error_inputs(spec: OpSpec, kwargs: Mapping, anchor: str) -> Iterable[ErrorInput]:
    """For every tensor argument but ``anchor`` (whose shape defines the sizes): one with
    a dim the anchor defines off by one (T where the layout has it, else the last dim),
    and one with an extra trailing dim (the classic gate of the wrong rank, e.g.
    ``[B, T, H, K]`` where ``[B, T, H]`` is expected)."""
    for name, value in kwargs.items():
        if name == anchor or name not in spec.args or not isinstance(value, torch.Tensor):
            continue
        layout = spec.args[name].layout
        dim = layout.index("T") if "T" in layout else value.dim() - 1
        if value.shape[dim] > 1:
            shrunk = value.narrow(dim, 0, value.shape[dim] - 1)
        else:
            shrunk = torch.cat([value, value], dim)
        yield ErrorInput(f"{name}_wrong_{layout[dim]}", _replace(kwargs, **{name: shrunk.contiguous()}), ValueError, f"`{name}`")
        widened = value.unsqueeze(-1).expand(*value.shape, 2).contiguous()
        yield ErrorInput(f"{name}_extra_dim", _replace(kwargs, **{name: widened}), ValueError, f"`{name}`")


def varlen_error_inputs(spec: OpSpec, case: Case, device) -> Iterable[ErrorInput]:
    """The ``cu_seqlens`` mistakes OPS.md lists, each a ValueError/TypeError naming it."""
    lengths = (3, 5)
    packed = spec.sample(case, "fp32", device, lengths=lengths).kwargs
    good = packed["cu_seqlens"]
    T = int(sum(lengths))

    def offsets(values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=device)

    yield ErrorInput("cu_seqlens_float", _replace(packed, cu_seqlens=good.float()), TypeError, "`cu_seqlens`.*dtype")
    yield ErrorInput("cu_seqlens_not_from_0", _replace(packed, cu_seqlens=offsets([1, 3, T])), ValueError, "`cu_seqlens`.*start at 0")
    yield ErrorInput("cu_seqlens_decreasing", _replace(packed, cu_seqlens=offsets([0, 5, 3, T])), ValueError, "`cu_seqlens`.*non-decreasing")
    yield ErrorInput("cu_seqlens_short_of_T", _replace(packed, cu_seqlens=offsets([0, 3, T - 1])), ValueError, "`cu_seqlens`.*end at T")
    yield ErrorInput("cu_seqlens_past_T", _replace(packed, cu_seqlens=offsets([0, 3, T + 4])), ValueError, "`cu_seqlens`.*end at T")
    yield ErrorInput("cu_seqlens_2d", _replace(packed, cu_seqlens=good.reshape(1, -1)), ValueError, "`cu_seqlens`")
    yield ErrorInput("cu_seqlens_wrong_device", _replace(packed, cu_seqlens=good.to(wrong_device(torch.device(device)))), ValueError, "`cu_seqlens`.*on")
    batched = spec.sample(case.with_dims(B=2, T=T), "fp32", device).kwargs
    batched.pop("initial_state", None)
    yield ErrorInput("cu_seqlens_with_batch_2", _replace(batched, cu_seqlens=offsets([0, 3, T])), ValueError, "batch size must be 1")
    if "initial_state" in packed:
        # One state per *sequence*: passing one per batch row (N = B = 1) is the usual slip.
        yield ErrorInput("initial_state_per_batch_row", _replace(packed, initial_state=packed["initial_state"][:1].contiguous()), ValueError, "`initial_state`")


def linear_attention_errors(anchor: str = "q", head_dim_arg: str = "k", head_dims: bool = True) -> Callable:
    """The error factory for a recurrent op whose sizes are defined by ``anchor``;
    ``head_dims=False`` for an op without a bounded head dim (hgrn's channels)."""

    def errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
        case = dataclasses.replace(spec.cases[0], options={**spec.cases[0].options, "initial_state": True})
        kwargs = spec.sample(case, "fp32", device).kwargs
        yield ErrorInput(f"{anchor}_float64", _replace(kwargs, **{anchor: kwargs[anchor].double()}), TypeError, f"`{anchor}`.*dtype")
        yield ErrorInput(f"{anchor}_int", _replace(kwargs, **{anchor: kwargs[anchor].long()}), TypeError, f"`{anchor}`.*dtype")
        if "v" in kwargs and anchor != "v":
            yield ErrorInput("v_dtype_differs", _replace(kwargs, v=kwargs["v"].half()), TypeError, "`v`")
        yield from shape_error_inputs(spec, kwargs, anchor)
        if "initial_state" in kwargs:
            yield ErrorInput("initial_state_bf16", _replace(kwargs, initial_state=kwargs["initial_state"].bfloat16()), TypeError, "`initial_state`.*dtype")
        if head_dims:
            # explicit dims on every device: a case's GPU dims would put the head dim back in range
            big = spec.sample(dataclasses.replace(case.with_dims(K=512, V=16), gpu_dims=None), "fp32", device).kwargs
            yield ErrorInput("head_dim_512", big, ValueError, "512.*supported range")
        if spec.varlen:
            yield from varlen_error_inputs(spec, case, device)

    return errors


def linear_attention_spec(
    name: str,
    family: str,
    args: Mapping[str, Arg],
    cases: tuple[Case, ...],
    grads: tuple[str, ...],
    chunk_size: int | None = None,
    agrees_with: str | None = None,
    compile_cases: tuple[Case, ...] = (),
    **fields,
) -> OpSpec:
    """An OpSpec for ``kernels.<name>`` against ``reference.<name minus prefix>``."""
    base = name.removeprefix("chunk_").removeprefix("fused_recurrent_")
    return OpSpec(
        name=name,
        family=family,
        op=f"kernels.{name}",
        reference=f"reference.{base}",
        factory=make_factory(args),
        cases=cases,
        grads=grads,
        errors=fields.pop("errors", None) or linear_attention_errors(),
        chunk_size=chunk_size,
        agrees_with=agrees_with,
        compile_cases=compile_cases,
        huge_grid=fields.pop("huge_grid", HUGE_GRID_DIMS),
        args=args,
        **fields,
    )


__all__ = [
    "Arg",
    "Case",
    "STATE",
    "STATE_GVA",
    "HUGE_GRID_DIMS",
    "cu_seqlens_for",
    "linear_attention_spec",
    "linear_attention_errors",
    "shape_error_inputs",
    "varlen_error_inputs",
    "wrong_device",
]
