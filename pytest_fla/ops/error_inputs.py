"""Error inputs: bad calls an op must reject with a clear exception before any launch.

An op spec's ``errors`` is a factory ``errors(spec, device) -> Iterable[ErrorInput]``;
``test_error_inputs`` runs each one and checks that it raises the expected exception,
with a message matching the pattern, and that no kernel was launched first. The
builders here cover the mistakes every op of a kind must catch (the contract's
"Invalid input" rules, ``docs/ops.md``); an op's own mistakes are added with
:func:`chain_errors`::

    def conv_errors(spec, device):
        kwargs = spec.sample(spec.cases[0], "fp32", device).kwargs
        yield ErrorInput("width_5", with_args(kwargs, weight=...), ValueError, "width")

    errors = chain_errors(linear_attention_errors(), conv_errors)

Messages are matched with ``re.search``; the default patterns expect the argument's
name in backticks (`` `cu_seqlens` ``), as this project's validation writes it. A
library that words its errors differently passes its own patterns (``messages=``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping

import torch

from .spec import Case, ErrorInput, OpSpec, torch_dtype

ErrorFactory = Callable[[OpSpec, torch.device], Iterable[ErrorInput]]

# What each rejected cu_seqlens must say (regular expressions).
VARLEN_MESSAGES = {
    "float": "`cu_seqlens`.*dtype",
    "not_from_0": "`cu_seqlens`.*start at 0",
    "decreasing": "`cu_seqlens`.*non-decreasing",
    "end_at_T": "`cu_seqlens`.*end at T",
    "shape": "`cu_seqlens`",
    "device": "`cu_seqlens`.*on",
    "batch": "batch size must be 1",
    "initial_state": "`initial_state`",
}


def with_args(kwargs: Mapping, **changes) -> dict:
    """A copy of an op's keyword arguments with some replaced."""
    out = dict(kwargs)
    out.update(changes)
    return out


def wrong_device(device: torch.device) -> torch.device:
    """A device that is not ``device``: the CPU for a GPU run; ``meta`` for a CPU run
    (the interpreter runs on the CPU, so a tensor there is on the *right* device)."""
    return torch.device("cpu") if torch.device(device).type == "cuda" else torch.device("meta")


def chain_errors(*factories: ErrorFactory | None) -> ErrorFactory:
    """One error factory yielding every error input of ``factories``, in order."""

    def errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
        for factory in factories:
            if factory is not None:
                yield from factory(spec, device)

    return errors


def dtype_errors(kwargs: Mapping, name: str) -> Iterable[ErrorInput]:
    """``name`` as float64 and as int64: both a TypeError naming it and its dtype."""
    yield ErrorInput(f"{name}_float64", with_args(kwargs, **{name: kwargs[name].double()}), TypeError, f"`{name}`.*dtype")
    yield ErrorInput(f"{name}_int", with_args(kwargs, **{name: kwargs[name].long()}), TypeError, f"`{name}`.*dtype")


def state_dtype_errors(spec: OpSpec, kwargs: Mapping) -> Iterable[ErrorInput]:
    """``initial_state`` in float64, and in each 16-bit dtype the spec does not take it in
    (``OpSpec.state_dtypes``): a TypeError naming it and its dtype."""
    state = kwargs["initial_state"]
    yield ErrorInput("initial_state_float64", with_args(kwargs, initial_state=state.double()), TypeError,
                     "`initial_state`.*dtype")
    for name in ("bf16", "fp16"):
        if name not in spec.state_dtypes:
            yield ErrorInput(f"initial_state_{name}", with_args(kwargs, initial_state=state.to(torch_dtype(name))),
                             TypeError, "`initial_state`.*dtype")


def scale_errors(kwargs: Mapping) -> Iterable[ErrorInput]:
    """A non-finite ``scale`` (NaN, +-inf): a ValueError naming it, never an all-NaN output."""
    for name, value in (("nan", float("nan")), ("inf", float("inf")), ("minus_inf", float("-inf"))):
        yield ErrorInput(f"scale_{name}", with_args(kwargs, scale=value), ValueError, "`scale`.*finite")


def zero_heads_errors(spec: OpSpec, case: Case, device, heads: Mapping[str, str]) -> Iterable[ErrorInput]:
    """For each heads dim of ``heads`` (dim -> the argument it is read from, e.g.
    ``{"H": "q", "HV": "v"}``) that the spec's layouts use: the case drawn with that dim 0,
    a ValueError naming the argument, never an empty output (docs/ops.md, "Invalid input")."""
    case = dataclasses.replace(case, gpu_dims=None)  # explicit dims on every device
    used = {d for arg in spec.args.values() for d in arg.layout}
    for dim, name in heads.items():
        if dim in used:
            kwargs = spec.sample(case.with_dims(**{dim: 0}), "fp32", device).kwargs
            yield ErrorInput(f"zero_heads_{dim}", kwargs, ValueError, f"`{name}`.*at least one head")


def zero_width_errors(spec: OpSpec, case: Case, device, widths: Mapping[str, str]) -> Iterable[ErrorInput]:
    """For each width dim of ``widths`` (dim -> the argument whose last dim it is, e.g.
    ``{"K": "q", "V": "v"}``) that the spec's layouts use: the case drawn with that dim 0,
    a ValueError in this project's range error, naming the argument (`` key head dim K
    (q.shape[-1]) = 0 is outside the supported range 1..256 ``), never an empty output
    (docs/ops.md, "Zero widths")."""
    case = dataclasses.replace(case, gpu_dims=None)  # explicit dims on every device
    used = {d for arg in spec.args.values() for d in arg.layout}
    for dim, name in widths.items():
        if dim in used:
            kwargs = spec.sample(case.with_dims(**{dim: 0}), "fp32", device).kwargs
            yield ErrorInput(f"zero_width_{dim}", kwargs, ValueError,
                             rf"\({re.escape(name)}\.shape\[-1\]\) = 0 is outside the supported range")


def shape_errors(spec: OpSpec, kwargs: Mapping, anchor: str) -> Iterable[ErrorInput]:
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
        yield ErrorInput(f"{name}_wrong_{layout[dim]}", with_args(kwargs, **{name: shrunk.contiguous()}), ValueError, f"`{name}`")
        widened = value.unsqueeze(-1).expand(*value.shape, 2).contiguous()
        yield ErrorInput(f"{name}_extra_dim", with_args(kwargs, **{name: widened}), ValueError, f"`{name}`")


def varlen_errors(spec: OpSpec, case: Case, device, messages: Mapping[str, str] = VARLEN_MESSAGES) -> Iterable[ErrorInput]:
    """The ``cu_seqlens`` mistakes the contract lists: a float dtype, not starting at 0,
    decreasing, ending short of or past T, 2-D, on the wrong device, with a batch of 2;
    and, where the op takes one, an ``initial_state`` per batch row instead of per
    sequence."""
    lengths = (3, 5)
    packed = spec.sample(case, "fp32", device, lengths=lengths).kwargs
    good = packed["cu_seqlens"]
    T = int(sum(lengths))
    m = {**VARLEN_MESSAGES, **messages}

    def offsets(values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=device)

    yield ErrorInput("cu_seqlens_float", with_args(packed, cu_seqlens=good.float()), TypeError, m["float"])
    yield ErrorInput("cu_seqlens_not_from_0", with_args(packed, cu_seqlens=offsets([1, 3, T])), ValueError, m["not_from_0"])
    yield ErrorInput("cu_seqlens_decreasing", with_args(packed, cu_seqlens=offsets([0, 5, 3, T])), ValueError, m["decreasing"])
    yield ErrorInput("cu_seqlens_short_of_T", with_args(packed, cu_seqlens=offsets([0, 3, T - 1])), ValueError, m["end_at_T"])
    yield ErrorInput("cu_seqlens_past_T", with_args(packed, cu_seqlens=offsets([0, 3, T + 4])), ValueError, m["end_at_T"])
    yield ErrorInput("cu_seqlens_2d", with_args(packed, cu_seqlens=good.reshape(1, -1)), ValueError, m["shape"])
    yield ErrorInput("cu_seqlens_wrong_device", with_args(packed, cu_seqlens=good.to(wrong_device(torch.device(device)))),
                     ValueError, m["device"])
    batched = spec.sample(case.with_dims(B=2, T=T), "fp32", device).kwargs
    batched.pop("initial_state", None)
    yield ErrorInput("cu_seqlens_with_batch_2", with_args(batched, cu_seqlens=offsets([0, 3, T])), ValueError, m["batch"])
    if "initial_state" in packed:
        # One state per *sequence*: passing one per batch row (N = B = 1) is the usual slip.
        yield ErrorInput("initial_state_per_batch_row", with_args(packed, initial_state=packed["initial_state"][:1].contiguous()),
                         ValueError, m["initial_state"])


def linear_attention_errors(anchor: str = "q", head_dim: str | None = "K", too_large: int = 512,
                            heads: Mapping[str, str] | None = None, scale: bool = True,
                            widths: Mapping[str, str] | None = None) -> ErrorFactory:
    """The error factory for a recurrent op whose sizes are defined by ``anchor``: its
    dtype (float64, int), ``v``'s dtype differing, every other argument mis-shaped,
    ``initial_state`` in a dtype it is not taken in (:func:`state_dtype_errors`), the head
    dim ``head_dim`` at ``too_large`` (out of the supported range; ``head_dim=None`` for an
    op whose channel count is unbounded, e.g. hgrn's), zero heads (:func:`zero_heads_errors`;
    ``heads`` defaults to ``H`` read from ``anchor`` and ``HV`` from ``v``; ``{}`` for an op
    without heads), zero widths (:func:`zero_width_errors`; ``widths`` defaults to ``K``
    read from ``anchor`` and ``V`` from ``v``), a non-finite ``scale`` (``scale=False``: the
    op takes none), and (for a varlen op) every ``cu_seqlens`` mistake."""

    def errors(spec: OpSpec, device) -> Iterable[ErrorInput]:
        case = dataclasses.replace(spec.cases[0], options={**spec.cases[0].options, "initial_state": True})
        kwargs = spec.sample(case, "fp32", device).kwargs
        yield from dtype_errors(kwargs, anchor)
        if "v" in kwargs and anchor != "v":
            yield ErrorInput("v_dtype_differs", with_args(kwargs, v=kwargs["v"].half()), TypeError, "`v`")
        yield from shape_errors(spec, kwargs, anchor)
        if "initial_state" in kwargs:
            yield from state_dtype_errors(spec, kwargs)
        if scale:
            yield from scale_errors(kwargs)
        yield from zero_heads_errors(spec, case, device, {"H": anchor, "HV": "v"} if heads is None else heads)
        yield from zero_width_errors(spec, case, device, {"K": anchor, "V": "v"} if widths is None else widths)
        if head_dim is not None:
            # explicit dims on every device: a case's GPU dims would put the head dim back in range
            dims = {head_dim: too_large, **({"V": 16} if head_dim != "V" else {})}
            big = spec.sample(dataclasses.replace(case.with_dims(**dims), gpu_dims=None), "fp32", device).kwargs
            yield ErrorInput(f"head_dim_{too_large}", big, ValueError, f"{too_large}.*supported range")
        if spec.varlen:
            yield from varlen_errors(spec, case, device)

    return errors
