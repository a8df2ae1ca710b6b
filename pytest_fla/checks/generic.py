"""The generic checks, written once over all op specs (the bodies of the conformance suite).

Each function here is one check on one spec; :mod:`pytest_fla.checks.conformance` parametrizes
them over the session's specs. They raise ``AssertionError`` with the
measured errors on failure. Helpers that run an op forward and backward against its
float64 reference live here too, so focused tests can reuse them.
"""

from __future__ import annotations

import bisect
import re
import zlib

import torch

from ..running import gpu_share
from ..ops import inputs
from ..running.devices import dtype_skip_reason, numeric_device  # noqa: F401 - where focused tests found them
from ..running.devices import reference_call
from ..running.gpu_memory import forward_bytes, other_holders, released_on_error
from ..running.launches import observe_launches
from ..ops.packings import Packing
from .poison import poisoned
from ..ops.spec import Case, OpSpec, Sample, coarsest, dtype_name, torch_dtype
from .tolerance import assert_close, mismatch
from .tolerance import failure as tolerance_failure
from ..report import verdicts
from ..report.verdicts import ContractMismatch


def seed_for(*parts) -> int:
    """A stable seed per test, so a failure reproduces from its id alone."""
    return zlib.crc32("-".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def cotangents(outputs, seed: int) -> list:
    """Random upstream gradients, one per tensor output, rounded to the output's dtype.

    Drawn from a stream apart from the inputs' (same seed, other offset): were ``dy``
    equal to ``x``, the gradient of a normalisation ``x / |x|`` would be exactly zero and
    its check would prove nothing.
    """
    gen = torch.Generator().manual_seed(seed ^ 0x2545F491)
    grads = []
    for o in outputs:
        if o is None:
            grads.append(None)
        else:
            grads.append(torch.randn(o.shape, generator=gen, dtype=inputs.DRAW_DTYPE).to(o.device, o.dtype))
    return grads


def differentiable(spec: OpSpec, sample: Sample) -> list[str]:
    """Names of the sample's tensors that get gradients (``initial_state`` included)."""
    names = [n for n in spec.grads if isinstance(sample.kwargs.get(n), torch.Tensor)]
    if isinstance(sample.kwargs.get("initial_state"), torch.Tensor) and "initial_state" not in names:
        names.append("initial_state")
    return names


def run_with_grads(fn, sample: Sample, names, grad_outputs=None, *, upcast=False, seed=0, place=None):
    """Call ``fn(**kwargs)`` with fresh leaves for ``names``; return (outputs, grads).

    ``upcast`` makes the leaves float64 (for the reference; computed where
    ``devices.reference_device`` says, its results moved back to the sample's device).
    The upstream gradients are drawn from ``seed`` (or given), so kernel and reference see
    the same ones. ``place(t, key)``, when given, makes each leaf's storage from its detached
    input (``key`` the input's name) in place of a copy, and each upstream gradient, in its
    output's dtype, is passed through it too (``key`` the output's position): a check that
    wants every tensor of the call in memory of its own (:mod:`pytest_fla.checks.bounds`).
    """
    if not upcast:
        return _run_with_grads(fn, sample, names, grad_outputs, upcast, seed, place)
    return reference_call(
        lambda kwargs, upstream: _run_with_grads(fn, Sample(kwargs), names, upstream, upcast, seed, place),
        sample.kwargs, grad_outputs)


def _run_with_grads(fn, sample: Sample, names, grad_outputs, upcast: bool, seed: int, place=None):
    kwargs = dict(sample.kwargs)
    leaves = {}
    for name in names:
        t = kwargs[name].detach()
        if place is not None:
            leaves[name] = place(t, name).requires_grad_(True)
        else:
            leaves[name] = (t.double() if upcast else t.clone()).requires_grad_(True)
    kwargs.update(leaves)
    from ..ops.spec import as_tuple

    outputs = as_tuple(fn(**kwargs))
    if grad_outputs is None:
        grad_outputs = cotangents(outputs, seed)
    pairs = [(i, o, g) for i, (o, g) in enumerate(zip(outputs, grad_outputs)) if o is not None and g is not None]
    if names:
        grads = torch.autograd.grad(
            [o for _, o, _ in pairs],
            [leaves[n] for n in names],
            [g.to(o.dtype) if place is None else place(g.to(o.dtype), i) for i, o, g in pairs],
            allow_unused=True,
        )
    else:
        grads = ()
    return [o.detach() if o is not None else None for o in outputs], dict(zip(names, grads)), grad_outputs


def assert_finite(label: str, named_tensors, why: str) -> None:
    """Every element of each ``(name, tensor)`` is finite (a ``None`` tensor is skipped);
    else fail with ``label``, how many elements are not, the tensor's name, ``why`` and
    the first such element."""
    for name, t in named_tensors:
        if t is None:
            continue
        bad = ~torch.isfinite(t)
        assert not bad.any(), (
            f"{label}: {int(bad.sum())} of {t.numel()} elements of {name} {why}, "
            f"first at {tuple(torch.nonzero(bad)[0].tolist())}"
        )


# How a location names each dim of a layout; a dim not here is named as written.
DIM_WORDS = {"B": "batch", "T": "token", "N": "sequence", "H": "head", "HV": "value head", "HKV": "key/value head",
             "K": "key channel", "V": "value channel", "D": "channel", "C": "hidden channel"}


def locate(index, layout, cu_seqlens=None, shift=None) -> str:
    """``index`` into a tensor of ``layout`` in the layout's words (``batch 0, token 37
    (sequence 2, its token 5), head 1, value channel 12``): with ``cu_seqlens`` (host
    offsets) a token also names its sequence. ``shift``: dim -> what to add to its index (a
    tensor sliced out of a larger one names the element by the larger one's index)."""
    if layout is None or len(layout) != len(index):
        return f"index {tuple(index)}"
    parts = []
    for dim, i in zip(layout, index):
        i += (shift or {}).get(dim, 0)
        part = f"{DIM_WORDS.get(dim, dim)} {i}"
        if dim == "T" and cu_seqlens is not None and len(cu_seqlens) > 1:
            n = min(bisect.bisect_right(cu_seqlens, i), len(cu_seqlens) - 1) - 1
            part += f" (sequence {n}, its token {i - cu_seqlens[n]})"
        parts.append(part)
    return ", ".join(parts)


def dim_sizes(spec: OpSpec, sample: Sample) -> dict:
    """Each dim's size in ``sample``, read off its tensors' shapes (``N`` from ``cu_seqlens``
    where it is given, else the batch)."""
    sizes = {}
    for name, arg in spec.args.items():
        value = sample.kwargs.get(name)
        if isinstance(value, torch.Tensor) and value.dim() == len(arg.layout):
            sizes.update({d: n for d, n in zip(arg.layout, value.shape) if d not in sizes})
    cu = sample.kwargs.get("cu_seqlens")
    if isinstance(cu, torch.Tensor):
        sizes.setdefault("N", cu.numel() - 1)
    elif "B" in sizes:
        sizes.setdefault("N", sizes["B"])
    return sizes


def output_layout(spec: OpSpec, sample: Sample, out) -> tuple[str, ...] | None:
    """The layout of an output, which specs do not declare: an argument's whose sizes are
    the output's shape (``o`` is laid out as ``v``, ``final_state`` as ``initial_state``),
    else dim by dim, the first argument's dim of that size at that position."""
    if not isinstance(out, torch.Tensor):
        return None
    sizes = dim_sizes(spec, sample)
    layouts = [arg.layout for arg in spec.args.values()]
    for layout in layouts:
        if len(layout) == out.dim() and all(sizes.get(d) == n for d, n in zip(layout, out.shape)):
            return layout
    dims = []
    for i, n in enumerate(out.shape):
        found = [layout[i] for layout in layouts if len(layout) > i and sizes.get(layout[i]) == n]
        dims.append(found[0] if found else f"dim {i} index")
    return tuple(dims)


class Comparisons:
    """The comparisons of one check, against the reference or another kernel: every one is
    made whatever those before it found, each failure names the element that shows it in
    the layout's words (:func:`locate`), and the check fails once, with all of them (those
    past a tolerance first: the mutation report reads a kill by the ratchet off the first)."""

    def __init__(self, spec: OpSpec, sample: Sample):
        self.spec, self.sample = spec, sample
        self.failures: list[tuple[bool, str]] = []  # (by the ratchet alone, what it says)
        self.found: list = []  # the tolerance.Mismatch of each
        self.made = 0

    def output(self, label: str, out, ref, dtype: str, kind: str = "forward", *, layout_of=None, shift=None):
        """An output, laid out as ``layout_of`` (the tensor it was sliced from) or itself (:func:`output_layout`)."""
        layout = output_layout(self.spec, self.sample, out if layout_of is None else layout_of)
        self._compare(label, out, ref, dtype, kind, None, layout, shift)

    def grad(self, label: str, name: str, out, ref, dtype: str, kind: str = "backward", scale=None):
        """The gradient of input ``name``, laid out as the input."""
        arg = self.spec.args.get(name)
        self._compare(label, out, ref, dtype, kind, scale, arg.layout if arg is not None else None, None)

    def _compare(self, label, out, ref, dtype, kind, scale, layout, shift):
        self.made += 1
        found = mismatch(label, out, ref, dtype, kind, scale)
        if found is None:
            return
        where = "" if found.at is None else f"; {found.which} at {locate(found.at, layout, self._offsets(), shift)}"
        self.failures.append((found.by_ratchet, found.message + where))
        self.found.append(found)

    def _offsets(self) -> list | None:
        cu = self.sample.kwargs.get("cu_seqlens")
        return cu.tolist() if isinstance(cu, torch.Tensor) and cu.device.type != "meta" else None

    def check(self, before: str = "", error=None) -> None:
        """Fail with every failed comparison; ``before``, a line of the caller's put first (a
        report keeps a failure's opening); ``error``, the exception type to raise in place of
        the one the comparisons decide (``tolerance.failure``)."""
        if self.failures:
            ordered = [text for _, text in sorted(self.failures, key=lambda f: f[0])]
            message = ((f"{before}\n" if before else "") + "\n".join(ordered)
                       + f"\n({len(ordered)} of {self.made} comparisons failed)")
            raise tolerance_failure(message, self.found) if error is None else error(message)


def check_forward(spec: OpSpec, case: Case, dtype: str, device, seed: int) -> None:
    sample = spec.sample(case, dtype, device, seed)
    with torch.no_grad():
        out = spec.call(sample)
        ref = spec.call_reference(sample, dtype)
    compared = Comparisons(spec, sample)
    for name, o, r in zip(spec.outputs, out, ref):
        compared.output(f"{spec.name}.{name}", o, r, dtype)
    compared.check()


def check_backward(spec: OpSpec, sample: Sample, dtype: str, seed: int, compared: Comparisons | None = None) -> list:
    """Gradients of every differentiable input against float64 autograd of the reference,
    each held to the budget of the coarser of ``dtype`` and its input's dtype (a gradient
    comes back in its input's dtype: a bf16 state's in bf16, whatever the run's dtype).
    Returns the op's outputs (for checks that go on with them). Given ``compared``, the
    comparisons join it, for the caller to check with its own."""
    own = compared is None
    compared = Comparisons(spec, sample) if own else compared
    names = differentiable(spec, sample)
    out, grads, upstream = run_with_grads(spec.op_fn, sample, names, seed=seed)
    ref_out, ref_grads, _ = run_with_grads(spec.reference_for(dtype), sample, names, upstream, upcast=True)
    for name, o, r in zip(spec.outputs, out, ref_out):
        compared.output(f"{spec.name}.{name}", o, r, dtype)
    masses = token_masses(spec, sample, names, upstream, dtype)
    for name in names:
        budget = coarsest(dtype, dtype_name(sample.kwargs[name].dtype))
        compared.grad(f"{spec.name}: d{name}", name, grads[name], ref_grads[name], budget, "backward", masses.get(name))
    if own:
        compared.check()
    return out


def check_state_dtype(spec: OpSpec, dtype: str, state_dtype: str, device, seed: int) -> None:
    """A ``dtype`` run from an initial state kept in ``state_dtype`` (bf16, fp16): every
    output and gradient against the float64 reference run from the same rounded state
    (:func:`check_backward`), and the final state in float32 (docs/ops.md)."""
    sample = spec.sample(spec.state_case(state_dtype), dtype, device, seed)
    state = sample.kwargs["initial_state"]
    assert state.dtype == torch_dtype(state_dtype), f"{spec.name}: the sample's state is {state.dtype}"
    out = check_backward(spec, sample, dtype, seed)
    final = dict(zip(spec.outputs, out)).get("final_state")
    if final is not None and final.dtype != torch.float32:
        raise ContractMismatch(f"{spec.name}: the final state from a {state.dtype} initial state is {final.dtype}, "
                               "not float32 (docs/ops.md)")


def token_masses(spec: OpSpec, sample: Sample, names, upstream, dtype: str) -> dict:
    """For each of the spec's token-reduced parameters (``OpSpec.token_reduced``): the
    per-element sum over tokens of the magnitudes of its gradient's terms, from the float64
    reference called with one copy of the parameter per token.

    Such a gradient is ``sum_t c_t`` with terms of both signs. A kernel whose per-token
    terms are each within the budget (relative error ``e``) is off by up to ``e sum_t |c_t|``
    when the terms' errors move together, which relative to ``|sum_t c_t|`` is ``e`` times
    the sum's condition number ``sum_t |c_t| / |sum_t c_t|``: a property of the sample, not
    of the kernel. Measured against ``sum_t |c_t|`` the budget stays the kernel's own."""
    reduced = [n for n in spec.token_reduced if n in names]
    if not reduced:
        return {}
    tokens = next(sample.kwargs[n].shape[:2] for n, arg in spec.args.items()
                  if tuple(arg.layout[:2]) == ("B", "T") and isinstance(sample.kwargs.get(n), torch.Tensor))
    per_token = dict(sample.kwargs)
    for name in reduced:
        p = sample.kwargs[name].detach()
        per_token[name] = p.expand(*tokens, *p.shape)  # run_with_grads copies it into a leaf
    _, terms, _ = run_with_grads(spec.reference_for(dtype), Sample(per_token), reduced, upstream,
                                 upcast=True)
    return {n: terms[n].abs().sum(dim=(0, 1)) for n in reduced}


def sequence_slice(spec: OpSpec, kwargs: dict, start: int, end: int, n: int) -> dict:
    """The kwargs of packed sequence ``n`` (tokens ``start:end``) as a B = 1 call of its
    own: tensors with ``T`` in their layout are sliced along it, per-sequence ones
    (``initial_state``) take row ``n``, everything else stays."""
    out = {}
    for name, value in kwargs.items():
        if name == "cu_seqlens":
            continue
        arg = spec.args.get(name)
        if isinstance(value, torch.Tensor) and arg is not None and "T" in arg.layout:
            out[name] = value.narrow(arg.layout.index("T"), start, end - start).contiguous()
        elif isinstance(value, torch.Tensor) and arg is not None and arg.layout[:1] == ("N",):
            out[name] = value[n : n + 1].contiguous()
        else:
            out[name] = value
    return out


def check_varlen(spec: OpSpec, case: Case, packing: Packing, dtype: str, device, seed: int) -> None:
    """Packed ``cu_seqlens`` run == float64 reference (forward and backward), and each
    sequence's slice == the kernel run on that sequence alone."""
    sample = spec.sample(case, dtype, device, seed, lengths=packing.lengths)
    sample.kwargs["cu_seqlens"] = sample.kwargs["cu_seqlens"].to(packing.index_dtype)
    compared = Comparisons(spec, sample)
    packed = check_backward(spec, sample, dtype, seed, compared)  # its forward is the packed run (no second one)
    offsets = sample.kwargs["cu_seqlens"].tolist()
    for n in range(len(offsets) - 1):
        start, end = offsets[n], offsets[n + 1]
        if end == start:
            continue  # a zero-length sequence: checked through the reference above
        alone = sequence_slice(spec, sample.kwargs, start, end, n)
        with torch.no_grad():
            single = spec.call(Sample(alone))
        for name, p, s in zip(spec.outputs, packed, single):
            if p is None:
                continue
            if name == "final_state":
                p_n, shift = p[n : n + 1], {"N": n}
            else:  # every per-token output is laid out [B, T, ...]
                p_n, shift = p.narrow(1, start, end - start), {"T": start}
            compared.output(f"{spec.name}.{name}[sequence {n}] packed vs alone", p_n, s.double(), dtype,
                            "agreement", layout_of=p, shift=shift)
    compared.check()


def check_agreement(spec: OpSpec, other: OpSpec, case: Case, dtype: str, device, seed: int) -> None:
    """Two kernels for the same function (chunk vs fused_recurrent) agree, with gradients."""
    sample = spec.sample(case, dtype, device, seed)
    names = differentiable(spec, sample)
    out, grads, upstream = run_with_grads(spec.op_fn, sample, names, seed=seed)
    out2, grads2, _ = run_with_grads(other.op_fn, sample, names, upstream)
    compared = Comparisons(spec, sample)
    for name, a, b in zip(spec.outputs, out, out2):
        compared.output(f"{spec.name} vs {other.name}: {name}", a, b.double() if b is not None else None, dtype,
                        "agreement")
    for name in names:
        compared.grad(f"{spec.name} vs {other.name}: d{name}", name, grads[name], grads2[name].double(), dtype)
    if compared.failures:
        blame = agreement_blame(spec, other, sample, names, upstream, dtype,
                                {spec.name: (out, grads), other.name: (out2, grads2)})
        compared.check(before=blame.line, error=blame.error)


class Blame:
    """Which of two kernels that disagree is off the float64 reference: ``line`` says so,
    ``error`` is the exception type the failed agreement raises (``None``: as the
    comparisons decide)."""

    def __init__(self, line: str, error=None):
        self.line, self.error = line, error


def agreement_blame(spec: OpSpec, other: OpSpec, sample: Sample, names, upstream, dtype: str, results: dict) -> Blame:
    """Each of two kernels that disagree held to its own check's tolerances against the
    float64 reference (``check_backward``'s): a disagreement says only that one of them is
    wrong. The failure of ``spec``'s check is a defect of ``spec`` where it is off; a
    defect of ``other`` alone (:class:`verdicts.OtherKernelOff`, counted against ``other``)
    where only that one is; and, where neither is off by more than tf32 products give, the
    contract's (fp32 to fp32 precision, or an agreement tighter than the two budgets)."""
    ref_out, ref_grads, _ = run_with_grads(spec.reference_for(dtype), sample, names, upstream, upcast=True)
    masses = token_masses(spec, sample, names, upstream, dtype)
    found = {}
    for op_name, (out, grads) in results.items():
        found[op_name] = [(name, m) for name, o, r in zip(spec.outputs, out, ref_out)
                          if (m := mismatch(name, o, r, dtype)) is not None]
        found[op_name] += [(f"d{name}", m) for name in names
                           if (m := mismatch(f"d{name}", grads[name], ref_grads[name],
                                             coarsest(dtype, dtype_name(sample.kwargs[name].dtype)), "backward",
                                             masses.get(name))) is not None]

    def said(op_name):
        if not found[op_name]:
            return f"{op_name} within its tolerances"
        tf32 = all(m.within_tf32 for _, m in found[op_name])
        return (f"{op_name} off on {', '.join(name for name, _ in found[op_name])}"
                + (" (within the fp16 limits, as tf32 products give)" if tf32 else ""))

    wrong = [op_name for op_name, ms in found.items() if any(not m.within_tf32 for _, m in ms)]
    line = f"{spec.name} and {other.name} disagree; against the float64 reference: " + "; ".join(map(said, found))
    if wrong == [other.name]:
        return Blame(f"{line}: the disagreement is {other.name}'s",
                     lambda message: verdicts.OtherKernelOff(message, culprit=other.name))
    if wrong:
        return Blame(f"{line}: " + ("both are off" if len(wrong) > 1 else f"the disagreement is {spec.name}'s"))
    return Blame(f"{line}: neither is off the reference by more than tf32 products give", ContractMismatch)


def check_error_input(spec: OpSpec, error, device) -> None:
    """The bad call raises the expected error, and launches nothing first. A failure says
    what the call got wrong and what was expected, whatever the op did instead (an op with
    no check of its own fails deep inside its kernel's launch, with an error that names
    neither).

    How the call falls short decides what its failure says of the library
    (``pytest_fla.report.verdicts``): another error, or none, is a rule of this contract
    (:class:`ContractMismatch`), unless the call faulted the device or, accepted silently,
    then read or wrote out of bounds, which the call run again between guard bands tells
    (:func:`silent_acceptance_breaches`): a defect."""
    import pytest

    what = error.what or f"the bad call `{error.name}`"
    expected = f"expected a {error.error.__name__} matching {error.match!r} before any launch"
    with observe_launches() as launches:
        try:
            accepted = spec.op_fn(**error.kwargs)
        except error.error as raised:
            if not re.search(error.match, str(raised)):
                raise ContractMismatch(f"{spec.name}: {what}: {expected}; its message does not match: "
                                       f"{type(raised).__name__}: {raised}") from raised
        except Exception as raised:  # noqa: BLE001 - the type of error is the finding
            if verdicts.faulted(raised):
                raise  # a device fault or an out-of-bounds access on the bad input: a defect
            raise ContractMismatch(f"{spec.name}: {what}: {expected}; got {type(raised).__name__}: "
                                   f"{' '.join(str(raised).split())[:300]}") from raised
        else:
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()  # a fault of the accepted call surfaces here, as a defect
            breaches = silent_acceptance_breaches(spec, error.kwargs, accepted)
            if breaches:
                pytest.fail(f"{spec.name}: {what}: the bad input was accepted silently and the call then went "
                            f"out of bounds: {'; '.join(breaches)} ({expected})", pytrace=False)
            raise ContractMismatch(f"{spec.name}: {what}: {expected}; the call returned without raising "
                                   "(DID NOT RAISE; it stayed in bounds between guard bands)")
    if launches.count:
        raise ContractMismatch(f"{spec.name}: {what}: {launches.count} kernel launch(es) before the error")
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()  # the device is still healthy after the rejected call


def silent_acceptance_breaches(spec: OpSpec, kwargs: dict, plain) -> list[str]:
    """The bad call once more, every tensor argument and allocation between guard bands
    (``pytest_fla.checks.bounds``): what it wrote outside them, and the output elements a
    band's NaN reached (non-finite here, finite in the ``plain`` call's result: a read past
    an input's end; a bad input may make NaN of its own, as a negative ``eps`` does)."""
    from . import bounds

    records = []
    placed = {}
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor) and bounds.placeable(value):
            value, record = bounds.place(value.detach(), f"input `{name}`", copy=True)
            records.append(record)
        placed[name] = value
    try:
        with torch.no_grad(), bounds.banded_allocations(records):
            out = spec.op_fn(**placed)
        if any(r.buffer.device.type == "cuda" for r in records):
            torch.cuda.synchronize()
    except Exception as raised:  # noqa: BLE001 - the second call may refuse what the first let by
        return [f"the call between guard bands raised {type(raised).__name__}: {raised}"] if verdicts.faulted(raised) else []
    breaches = [b for record in records for b in record.breaches()]
    as_tuple = lambda result: result if isinstance(result, (tuple, list)) else (result,)  # noqa: E731
    for index, (banded, unbanded) in enumerate(zip(as_tuple(out), as_tuple(plain))):
        if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in (banded, unbanded)):
            continue
        if banded.shape == unbanded.shape:
            reached = int((~torch.isfinite(banded) & torch.isfinite(unbanded)).sum())
            if reached:
                breaches.append(f"{reached} element(s) of output {index} are NaN/Inf between guard bands and finite "
                                "without them (a read past an input's end)")
    return breaches


def check_every_output_written(spec: OpSpec, case: Case, dtype: str, device, seed: int) -> None:
    """Every output and gradient element is written: the library's allocations start as
    NaN (``pytest_fla.checks.poison``, the ``fla_poison`` ini option), so one never written
    stays NaN."""
    with poisoned():
        sample = spec.sample(case, dtype, device, seed)
        names = differentiable(spec, sample)
        out, grads, _ = run_with_grads(spec.op_fn, sample, names, seed=seed)
    assert_finite(spec.name, list(zip(spec.outputs, out)) + [(f"d{n}", grads[n]) for n in names],
                  "were never written (still NaN from the poisoned allocation)")


def check_in_bounds(spec: OpSpec, case: Case, dtype: str, device, seed: int) -> None:
    """Forward and backward with every input, upstream gradient and allocation of the call
    between guard bands (``pytest_fla.checks.bounds``): no band may change, and no NaN from
    a band may reach an output or a gradient."""
    from . import bounds

    sample = spec.sample(case, dtype, device, seed)
    names = differentiable(spec, sample)
    records = []

    def place(t: torch.Tensor, key) -> torch.Tensor:
        """``t`` copied between bands; ``key``: an input's name or an output's position."""
        if not bounds.placeable(t):
            return t.clone()
        what = f"input `{key}`" if isinstance(key, str) else f"the upstream gradient of {spec.outputs[key]}"
        placed, record = bounds.place(t, what, copy=True)
        records.append(record)
        return placed

    kwargs = dict(sample.kwargs)
    for name, value in sample.kwargs.items():
        if isinstance(value, torch.Tensor) and bounds.placeable(value) and name not in names:
            kwargs[name] = place(value.detach(), name)  # the leaves are placed by run_with_grads
    with bounds.banded_allocations(records):
        out, grads, _ = run_with_grads(spec.op_fn, Sample(kwargs), names, seed=seed, place=place)
    label = f"{spec.name} ({case.name}, {dtype})"
    breaches = [b for record in records for b in record.breaches()]
    assert not breaches, f"{label}: " + "; ".join(breaches)
    results = list(zip(spec.outputs, out)) + [(f"d{n}", grads[n]) for n in names]
    found = [f for name, t in results if t is not None for f in bounds.not_finite(name, t, records)]
    assert not found, f"{label}: " + "; ".join(found)


def check_deterministic(spec: OpSpec, case: Case, dtype: str, device, seed: int) -> None:
    sample = spec.sample(case, dtype, device, seed)
    names = differentiable(spec, sample)
    out1, grads1, upstream = run_with_grads(spec.op_fn, sample, names, seed=seed)
    out2, grads2, _ = run_with_grads(spec.op_fn, sample, names, upstream)
    compared = [(name, a, b, output_layout(spec, sample, a) if a is not None else None)
                for name, a, b in zip(spec.outputs, out1, out2)]
    compared += [(f"d{n}", grads1[n], grads2[n], spec.args[n].layout if n in spec.args else None) for n in names]
    for name, a, b, layout in compared:
        if a is None:
            continue
        differ = bitwise_differences(a, b)
        if differ is not None:
            count, at = differ
            diff = (a.double() - b.double()).abs()
            nan = int(a.isnan().sum()), int(b.isnan().sum())
            raise AssertionError(
                f"{spec.name}: {name} differs between two identical runs: {count} of {a.numel()} elements, "
                f"the first at {locate(at, layout, None, None)}, the largest difference "
                f"{diff.nan_to_num(nan=0.0).max().item():.3g}" + (f"; NaN in the runs: {nan[0]} and {nan[1]}" if any(nan) else ""))


def bitwise_differences(a: torch.Tensor, b: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """(how many elements, the index of the first) where ``a`` and ``b`` differ bit for bit,
    or None where none does: a NaN in the same place with the same bits is no difference
    (``torch.equal`` counts every NaN as one)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return (max(a.numel(), b.numel()), ())
    if not a.is_floating_point():
        bad = a != b
    else:
        bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        bad = a.detach().contiguous().view(bits) != b.detach().contiguous().view(bits)
    if not bad.any():
        return None
    return int(bad.sum()), tuple(torch.nonzero(bad)[0].tolist())


def grid_axes_by_batch(spec: OpSpec, case: Case, device, seed: int) -> list[tuple]:
    """Launch grids (forward and backward) at two batch sizes, paired launch by launch."""
    runs = []
    for batch in (1, 3):
        # A short T: the grid's shape, not the values, is what this looks at.
        sample = spec.sample(case.with_dims(B=batch, T=min(case.dims.get("T", 8), 8)), "fp32", device, seed)
        names = differentiable(spec, sample)
        with observe_launches() as launches:
            run_with_grads(spec.op_fn, sample, names, seed=seed)
        runs.append(launches.grids)
    assert len(runs[0]) == len(runs[1]), f"{spec.name}: the number of launches depends on the batch size"
    return list(zip(*runs))


def check_huge_grid(spec: OpSpec, dtype: str, device, seed: int) -> None:
    """B*H above 65535 runs and matches the reference (GPU); on the CPU, the grid rule:
    grid axes 1 and 2 (capped at 65535 by CUDA) never grow with the batch size."""
    if torch.device(device).type != "cuda":
        case = spec.cases[0]
        for small, large in grid_axes_by_batch(spec, case, device, seed):
            if small is None or large is None:
                continue
            assert tuple(small[1:]) == tuple(large[1:]), (
                f"{spec.name}: grid {small} at B=1 became {large} at B=3: the batch is on grid "
                "axis 1 or 2, which CUDA caps at 65535"
            )
        return
    # Beside the other checks: its inputs and float64 reference take 1-3 GB (measured on the
    # CPU at HUGE_GRID_DIMS), no more than an ordinary check at GPU sizes.
    case = Case("huge_grid", dict(spec.huge_grid), options=_grid_check_options(spec))
    check_forward(spec, case, dtype, device, seed)
    torch.cuda.empty_cache()


def _grid_check_options(spec: OpSpec) -> dict:
    """The first case's options (a gated norm needs its gate), with the final state asked
    for where the op has one (its kernel's state writes are the ones to check)."""
    options = dict(spec.cases[0].options)
    if "final_state" in spec.outputs:
        options["output_final_state"] = True
    return options


def check_int64_offsets(spec: OpSpec, device, seed: int, elements: int = 2**31) -> None:
    """A batch whose tensors hold more than 2**31 elements (32-bit offsets wrap there):
    the last rows must still be right. Forward only, bf16; the rows are tiled from a small
    sample so that drawing inputs stays cheap, and the reference runs on that sample.
    Its memory is measured first, beside the other checks (at 2 and 4 rows, scaled); it is
    skipped, with the numbers, where the GPU has not that memory, and otherwise runs alone
    on its GPU (``gpu_share.alone_on``)."""
    small, repeats, need = _int64_plan(spec, device, seed, elements)
    total = torch.cuda.get_device_properties(device).total_memory
    if need > 0.9 * total:  # decided without stopping the other checks
        _skip_int64(need, total, "this GPU has")
    with gpu_share.alone_on(device):
        free, _ = torch.cuda.mem_get_info(device)
        if need > 0.9 * free:
            _skip_int64(need, free, "are free on this GPU" + other_holders(gpu_share.physical_gpu(torch.device(device).index or 0)))
        try:
            with released_on_error():
                _check_int64_offsets(spec, small, repeats)
        except torch.cuda.OutOfMemoryError as error:
            # The need is a measurement scaled up, not a bound (fused_recurrent_rwkv7 measured
            # under it and then ran out on the H100): the check could not run, which is a skip
            # with the numbers, not a wrong answer.
            reason = str(error).split(". ")[0]
            _skip_int64(need, free, f"were free, and the run still ran out of memory ({reason})")
        finally:
            torch.cuda.empty_cache()


def _skip_int64(need: int, have: int, where: str):
    import pytest

    pytest.skip(f"a batch past 2**31 elements needs about {need / 2**30:.0f} GiB here (measured at "
                f"2 and 4 rows, scaled); {have / 2**30:.0f} GiB {where}")


def _int64_plan(spec: OpSpec, device, seed: int, elements: int) -> tuple[Sample, int, int]:
    """The small sample, how many times to tile it, and the bytes the tiled forward needs."""
    base = Case("int64_offsets", dict(spec.int64_dims), options=_grid_check_options(spec))
    small = spec.sample(base, "bf16", device, seed)
    per_row = max(t[0].numel() for name, t in small.tensors().items() if spec.args.get(name) and spec.args[name].layout[0] == "B")
    rows = -(-elements // per_row) + 1
    repeats = -(-rows // 2)
    # Memory grows with the rows: measured at the sample tiled once and twice, the
    # difference is what `repeats` tilings add (fixed allocations, compiling and autotuning
    # drop out of it).
    doubled = _tiled(spec, small, 2)
    with torch.no_grad():
        spec.call(small), spec.call(doubled)  # compiled and tuned before anything is measured
    once, twice = forward_bytes(spec.call, small, device), forward_bytes(spec.call, doubled, device)
    return small, repeats, once + max(twice - once, 0) * (repeats - 1)


def _check_int64_offsets(spec: OpSpec, small: Sample, repeats: int) -> None:
    with torch.no_grad():
        out = spec.call(_tiled(spec, small, repeats))
        ref = spec.call_reference(small, "bf16")
    last = (2 * repeats - 1) % 2  # the small-sample row the big batch's last row came from
    compared = Comparisons(spec, small)
    for name, o, r in zip(spec.outputs, out, ref):
        if r is None:
            continue
        layout = output_layout(spec, small, r)  # the tiled rows' layout: the small sample's, more rows
        shift = {layout[0]: o.shape[0] - 1} if layout else None
        compared.output(f"{spec.name}.{name}[last row of {o.shape[0]}]", o[-1:], r[last : last + 1], "bf16",
                        layout_of=r, shift=shift)
        compared.output(f"{spec.name}.{name}[first row]", o[:1], r[:1], "bf16", layout_of=r)
    compared.check()


def _tiled(spec: OpSpec, sample: Sample, repeats: int) -> Sample:
    """``sample`` with every batch (or sequence) dimension repeated ``repeats`` times."""
    tiled = {}
    for name, value in sample.kwargs.items():
        arg = spec.args.get(name)
        if isinstance(value, torch.Tensor) and arg is not None and arg.layout[0] in ("B", "N"):
            value = value.repeat(repeats, *([1] * (value.dim() - 1)))
        tiled[name] = value
    return Sample(tiled)


def check_no_host_sync(spec: OpSpec, device, seed: int) -> None:
    """With ``cu_seqlens_cpu`` given, or the same ``cu_seqlens`` seen before, a varlen
    forward makes no device-to-host sync (``torch.cuda.set_sync_debug_mode('error')``
    turns any sync into an error)."""
    sample = spec.sample(spec.cases[0], "bf16", device, seed, lengths=(5, 70, 1, 33))
    with torch.no_grad():
        spec.call(sample)  # compiles, and validates this cu_seqlens once
        # a device tensor not seen before: its values must come from the CPU copy, not a sync
        cu = sample.kwargs["cu_seqlens"]
        with_cpu = Sample({**sample.kwargs, "cu_seqlens": cu.clone(), "cu_seqlens_cpu": cu.cpu()})
        for label, s in (("cu_seqlens seen before", sample), ("cu_seqlens_cpu given", with_cpu)):
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                spec.call(s)
            except RuntimeError as e:
                raise ContractMismatch(f"{spec.name}: a device-to-host sync with {label}: {e}") from None
            finally:
                torch.cuda.set_sync_debug_mode("default")
