"""Input factories: realistic and stress distributions for every argument kind.

An op's inputs are declared once as ``{name: Arg(layout, kind)}``; :func:`make_factory`
turns that into the ``OpSpec.factory`` callable. Layouts are tuples of dim names
(``("B", "T", "H", "K")``) resolved against the case's dims, with ``N`` the number of
sequences (``B``, or the number of packed sequences under ``cu_seqlens``).

Distributions (the contract's realistic inputs, ``docs/ops.md``): gates are ``logsigmoid(randn) / normalizer``;
``realistic`` uses normalizer 8 (a few percent decay per step), ``strong_decay`` 0.01
(per-step log gates down to about -500: naive chunk forms overflow ``exp``),
``weak_decay`` 64; ``near_eps`` draws realistic gates and scales ``normal`` data rows
(:data:`ROW_SCALES`) so that some have a squared norm near a normalisation's ``eps``.
Every sample also carries degenerate tokens (:func:`degenerate_tokens`: all-zero padding
rows, a zero key, a zero gate). Everything is drawn on the CPU from one seeded generator,
then moved, so a sample is the same on every device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import math

import torch
import torch.nn.functional as F

from .spec import Case, Sample, torch_dtype

GATE_NORMALIZER = {"realistic": 8.0, "strong_decay": 0.01, "weak_decay": 64.0, "near_eps": 8.0}
# Per distribution, the factors of successive rows (over the last dim, cycling) of a
# ``normal`` input. ``near_eps``: rows of RMS 1e-3, 3e-4, 1e-4 beside unscaled ones put
# mean(x^2) at 1 to 0.01 times a norm's eps of 1e-6 (rms_norm) and sum(x^2) at 48 to
# 0.5 times it at D = 48 (l2norm), where eps moves the result by more than any budget:
# with every row's squared norm about D, doubling eps changes nothing fp32 can see.
# The first factor is 1: an input of one row (a bias ``[D]``) stays as drawn.
ROW_SCALES = {"near_eps": (1.0, 1e-3, 3e-4, 1e-4)}


@dataclass(frozen=True)
class Arg:
    """One tensor argument: its layout and how its values are drawn.

    ``layout`` names each dim (``("B", "T", "H", "K")``); names are free except ``B``,
    ``T`` and ``N``, which the checks read (see :mod:`pytest_fla.ops.spec`).

    kinds: ``normal`` (randn; its rows scaled under the distributions of :data:`ROW_SCALES`),
    ``unit`` (randn, L2-normalised over the last dim),
    ``log_gate`` (``logsigmoid(randn) / normalizer``), ``head_gate`` (a constant log gate per
    head, ``log(1 - 2^(-5-h))`` scaled by the distribution), ``beta`` (``sigmoid(randn)``),
    ``positive`` (``1 + 0.1 randn``, e.g. norm weights), ``state`` (float32 randn, or in the
    dtype the case's option names),
    ``rwkv_decay`` (RWKV-7's log decay ``-e^{-1/2} sigmoid(randn)``, scaled like ``head_gate``).
    ``optional`` arguments are drawn only when the case's options switch them on.
    ``times`` couples an argument to another: the drawn values are multiplied elementwise
    by those of the named argument (declared earlier, same shape), then by ``scale``;
    e.g. RWKV-7's ``a = -kk``, ``b = kk * sigmoid(randn)`` is ``Arg(.., "unit", scale=-1)``
    and ``Arg(.., "beta", times="a", scale=-1)``.
    """

    layout: tuple[str, ...]
    kind: str = "normal"
    optional: bool = False
    float32: bool = False  # drawn in float32 whatever the sample's dtype
    times: str | None = None
    scale: float = 1.0
    # False: this argument never takes its degenerate value (:func:`degenerate_tokens`)
    degenerate: bool = True


# The normal draws are float32: every sample is rounded to its dtype (bf16, fp32) before
# any kernel or reference sees it, and the CPU's float32 randn is several times faster.
# At the H100 sizes, drawing chunk_dplr_delta_rule's realistic_large sample took 12.8 s in
# float64 against 1.8 s (chunk_gla 5.1 against 1.1) on one core, and drawing inputs was a
# quarter of the suite's test seconds there (benchmarks/results/README.md).
DRAW_DTYPE = torch.float32


def draw(kind: str, shape, gen: torch.Generator, dist: str) -> torch.Tensor:
    """Values of one argument (``DRAW_DTYPE``), on the CPU."""
    x = torch.randn(shape, generator=gen, dtype=DRAW_DTYPE)
    if kind == "normal":
        return _scale_rows(x, ROW_SCALES[dist]) if dist in ROW_SCALES else x
    if kind == "state":
        return x
    if kind == "unit":
        return F.normalize(x, dim=-1)
    if kind == "log_gate":
        return F.logsigmoid(x) / GATE_NORMALIZER[dist]
    if kind == "head_gate":
        h = torch.arange(shape[-1], dtype=DRAW_DTYPE)
        return torch.log1p(-torch.pow(2.0, -5.0 - h)) * (8.0 / GATE_NORMALIZER[dist])
    if kind == "beta":
        return torch.sigmoid(x)
    if kind == "positive":
        return 1.0 + 0.1 * x
    if kind == "rwkv_decay":
        return -math.exp(-0.5) * torch.sigmoid(x) * (8.0 / GATE_NORMALIZER[dist])
    raise ValueError(f"unknown argument kind {kind!r}")


def _scale_rows(x: torch.Tensor, scales: tuple[float, ...]) -> torch.Tensor:
    """``x`` with row ``i`` (over the last dim, leading dims flattened) times ``scales[i % len(scales)]``."""
    if x.dim() == 0 or x.numel() == 0:
        return x
    rows = x.numel() // x.shape[-1]
    factors = torch.tensor(scales, dtype=x.dtype).repeat(-(-rows // len(scales)))[:rows]
    return x * factors.view(*x.shape[:-1], 1)


# Degenerate but common inputs, carried by every sample at fixed tokens (docs/ops.md,
# "Inputs"): padding tokens, whose data rows are all zero (an l2norm or rms_norm without
# its eps turns them into NaN); a zero key (the token writes nothing to the state); a log
# gate of 0 (no decay); a multiplicative gate (beta) of 0 (no write).
DATA_KINDS = ("normal", "unit")
LOG_GATE_KINDS = ("log_gate", "rwkv_decay")
MULTIPLICATIVE_GATE_KINDS = ("beta",)
KEY_NAMES = ("k",)


def degenerate_tokens(name: str, arg: Arg, B: int, T: int) -> list[tuple]:
    """``(row, token)`` indices of a ``[B, T, ...]`` argument set to zero in every sample:

    * data (kinds ``normal``, ``unit``): padding, the second token of the first row and
      the last token of the last row (under ``cu_seqlens``, B = 1: of the packed batch).
      Not the first token: with an initial state under strong decay, a zero query there
      leaves the state's gradient only through two or more decays (``e^{-140}``, measured
      on fused_recurrent_gated_delta_rule), below fp32's normal range, where a relative
      check measures fp32's subnormals, not the kernel;
    * keys (an argument named ``k``): also token ``T // 2`` of every row;
    * log gates (``log_gate``, ``rwkv_decay``): token ``T // 3`` of every row (no decay);
    * multiplicative gates (``beta``): token ``2T // 3`` of every row (no write).

    An argument coupled to another (``times``) follows it; ``Arg(degenerate=False)``
    leaves an argument out, for an op where the value is outside its contract."""
    if not arg.degenerate or arg.times is not None or tuple(arg.layout[:2]) != ("B", "T") or T == 0 or B == 0:
        return []
    every = slice(None)
    if arg.kind in DATA_KINDS:
        return [(0, min(1, T - 1)), (B - 1, T - 1)] + ([(every, T // 2)] if name in KEY_NAMES else [])
    if arg.kind in LOG_GATE_KINDS:
        return [(every, T // 3)]
    if arg.kind in MULTIPLICATIVE_GATE_KINDS:
        return [(every, 2 * T // 3)]
    return []


def resolve_dims(case: Case, lengths) -> dict[str, int]:
    dims = dict(case.dims)
    dims.setdefault("V", dims.get("K", 0))
    dims.setdefault("HV", dims.get("H", 0))
    if lengths is not None:
        dims["B"], dims["T"], dims["N"] = 1, int(sum(lengths)), len(lengths)
    else:
        dims["N"] = dims.get("B", 1)
    return dims


def cu_seqlens_for(lengths, dtype=torch.int64) -> torch.Tensor:
    """Offsets ``[0, l0, l0 + l1, ...]`` of sequences of the given lengths, packed along T."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=dtype)


def make_factory(
    args: Mapping[str, Arg],
    extra: Callable[[Case, dict], dict] | None = None,
    *,
    prepare: Callable[[Case], Case] | None = None,
    finish: Callable[[Case, Sample, Any, torch.Generator], None] | None = None,
    drop: tuple[str, ...] = (),
    degenerate: bool = True,
):
    """An ``OpSpec.factory`` drawing ``args`` for a case.

    Case options whose name is an optional argument switch it on (``initial_state=True``;
    for a ``state`` argument a dtype name, ``initial_state="bf16"``, also rounds it to that dtype);
    every other option is passed to the op as a keyword (``output_final_state=True``),
    except the factory switches named in ``drop``. Hooks, for ops whose inputs are more
    than independent draws: ``prepare(case) -> case`` before drawing (derive a dim or an
    option), ``extra(case, dims) -> kwargs`` to add arguments computed from the dims,
    ``finish(case, sample, lengths, gen)`` to edit the drawn sample in place (``case`` as
    given, before ``prepare``). ``degenerate=False`` draws no degenerate tokens
    (:func:`degenerate_tokens`) for any argument.
    """

    def factory(case: Case, dtype, device, gen, lengths) -> Sample:
        original = case
        if prepare is not None:
            case = prepare(case)
        dims = resolve_dims(case, lengths)
        kwargs: dict = {}
        drawn: dict = {}  # the drawn values, for the arguments coupled to them (``times``)
        for name, arg in args.items():
            if arg.optional and not case.options.get(name, False):
                continue
            shape = tuple(dims[d] for d in arg.layout)
            values = draw(arg.kind, shape, gen, case.dist)
            if arg.times is not None:
                values = values * drawn[arg.times]
            if arg.scale != 1.0:
                values = values * arg.scale
            if degenerate:
                for row, token in degenerate_tokens(name, arg, dims["B"], dims["T"]):
                    values[row, token] = 0.0
            drawn[name] = values
            target = torch.float32 if (arg.float32 or arg.kind == "state") and dtype != torch.float64 else dtype
            if arg.kind == "state" and isinstance(case.options.get(name), str) and dtype != torch.float64:
                target = torch_dtype(case.options[name])  # a state kept in a lower precision
            kwargs[name] = values.to(target).to(device)
        for key, value in case.options.items():
            if key not in args and key not in drop:
                kwargs[key] = value
        if extra is not None:
            kwargs.update(extra(case, dims))
        if lengths is not None:
            kwargs["cu_seqlens"] = cu_seqlens_for(lengths).to(device)
        sample = Sample(kwargs)
        if finish is not None:
            finish(original, sample, lengths, gen)
        return sample

    return factory
