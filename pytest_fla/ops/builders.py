"""Spec builders: an :class:`~pytest_fla.ops.spec.OpSpec` from an op's argument declaration.

:func:`op_spec` builds the spec of any op: its inputs (``{name: Arg}``), cases, gradients,
error inputs and the sizes at which the grid checks push it past CUDA's limits, all
explicit. :func:`linear_attention_spec` is ``op_spec`` with defaults for a q/k/v
recurrence (the ``<op_package>.<name>`` / ``<reference_package>.<family>`` naming, its
error inputs, the huge-grid and 64-bit-offset sizes of a ``[B, T, H, K]`` op).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .error_inputs import ErrorFactory, linear_attention_errors
from .inputs import Arg, make_factory
from .spec import Case, OpSpec, SampleFactory

GRID_AXIS_LIMIT = 65535  # CUDA's cap on grid axes 1 and 2


def huge_grid_dims(dims: Mapping[str, int], per_batch: str = "H") -> dict[str, int]:
    """``dims`` with the smallest batch ``B`` at which ``B * dims[per_batch]`` passes
    65535: a kernel that puts that product on grid axis 1 or 2 then fails to launch.
    ``huge_grid_dims({"T": 32, "H": 6, "K": 16, "V": 16})`` gives ``B = 10923``."""
    return {"B": GRID_AXIS_LIMIT // dims[per_batch] + 1, **dims}


# B*H = 10923 * 6 = 65538 > 65535, the first batch size at which a kernel that puts B*H
# on grid axis 1 or 2 fails with "invalid argument".
HUGE_GRID_DIMS = huge_grid_dims({"T": 32, "H": 6, "K": 16, "V": 16})
# A sample of 2 rows at a realistic head size; the 64-bit-offset check tiles it past 2**31.
INT64_DIMS = {"B": 2, "T": 64, "H": 4, "K": 128, "V": 128}
# The state dtypes besides float32 this project's recurrences take (docs/ops.md).
LOW_PRECISION_STATES = ("bf16", "fp16")


def op_spec(
    name: str,
    *,
    op: Callable | str | None,
    reference: Callable | str,
    args: Mapping[str, Arg],
    cases: tuple[Case, ...],
    family: str | None = None,
    grads: tuple[str, ...] = (),
    errors: ErrorFactory | None = None,
    outputs: tuple[str | None, ...] = ("o", "final_state"),
    factory: SampleFactory | None = None,
    varlen: bool = True,
    chunk_size: int | None = None,
    agrees_with: str | None = None,
    deterministic: bool = True,
    compile_cases: tuple[Case, ...] = (),
    min_arch: tuple[int, str] | None = None,
    huge_grid: Mapping[str, int] | None = None,
    int64_dims: Mapping[str, int] | None = None,
    state_dtypes: tuple[str, ...] = (),
    **factory_hooks: Any,
) -> OpSpec:
    """The spec of one op. Every field is explicit here:

    * ``op`` / ``reference``: the kernel entry point and its float64 reference
      (callables or dotted paths); ``op=None`` for a reference whose kernel is not written.
    * ``args``: the inputs, ``{name: Arg(layout, kind)}``; ``factory`` defaults to
      ``make_factory(args, **factory_hooks)`` (hooks: ``prepare``, ``extra``, ``finish``,
      ``drop``).
    * ``cases``: the input configurations the numeric checks run over (the first one also
      seeds the error inputs, the device and poison checks).
    * ``grads``: the inputs whose gradients are checked (``initial_state`` always is,
      when drawn); empty for a forward-only op.
    * ``errors``: the error-input factory (:mod:`pytest_fla.ops.error_inputs`), or None.
    * ``outputs``: names of the op's outputs in order (``("y",)`` for a plain function).
    * ``varlen`` / ``chunk_size``: whether the op takes ``cu_seqlens``, and the chunk the
      varlen packings put sequences around.
    * ``agrees_with``: another spec's name computing the same function.
    * ``compile_cases`` / ``min_arch``: realistic sizes compiled offline for every arch;
      the oldest arch supported and why.
    * ``huge_grid`` / ``int64_dims``: sizes for the grid-limit and 64-bit-offset checks
      (:func:`huge_grid_dims`, :data:`INT64_DIMS`); None leaves a check out.
    * ``state_dtypes``: the dtypes besides float32 that ``initial_state`` is taken in
      (``("bf16", "fp16")``); each is checked against the reference, others must be refused.
    """
    return OpSpec(
        name=name,
        family=family or name,
        op=op,
        reference=reference,
        factory=factory or make_factory(args, **factory_hooks),
        cases=tuple(cases),
        grads=tuple(grads),
        errors=errors,
        outputs=tuple(outputs),
        chunk_size=chunk_size,
        varlen=varlen,
        agrees_with=agrees_with,
        deterministic=deterministic,
        compile_cases=tuple(compile_cases),
        min_arch=min_arch,
        huge_grid=None if huge_grid is None else dict(huge_grid),
        int64_dims=None if int64_dims is None else dict(int64_dims),
        args=dict(args),
        state_dtypes=tuple(state_dtypes),
    )


_DEFAULT = object()


def linear_attention_spec(
    name: str,
    family: str,
    args: Mapping[str, Arg],
    cases: tuple[Case, ...],
    grads: tuple[str, ...],
    chunk_size: int | None = None,
    agrees_with: str | None = None,
    compile_cases: tuple[Case, ...] = (),
    *,
    op: Callable | str | None = _DEFAULT,
    reference: Callable | str | None = None,
    op_package: str | None = None,
    reference_package: str | None = None,
    errors: ErrorFactory | None = _DEFAULT,
    huge_grid: Mapping[str, int] | None = _DEFAULT,
    int64_dims: Mapping[str, int] | None = _DEFAULT,
    state_dtypes: tuple[str, ...] = LOW_PRECISION_STATES,
    **fields: Any,
) -> OpSpec:
    """:func:`op_spec` for a q/k/v recurrence returning ``(o, final_state)``, with this
    defaults for what is not given: ``op="<op_package>.<name>"``,
    ``reference="<reference_package>.<name less chunk_/fused_recurrent_>"`` (a library
    names its two packages once, e.g. with ``functools.partial``),
    ``errors=linear_attention_errors()``, ``huge_grid=HUGE_GRID_DIMS`` and
    ``int64_dims=INT64_DIMS`` (pass ``None`` to leave a check out), and initial states
    taken in bf16 and fp16 as well as float32."""
    base = name.removeprefix("chunk_").removeprefix("fused_recurrent_")
    if op is _DEFAULT and op_package is None:
        raise TypeError(f"linear_attention_spec({name!r}): give `op`, or `op_package` to take `<op_package>.{name}`")
    if reference is None and reference_package is None:
        raise TypeError(f"linear_attention_spec({name!r}): give `reference`, or `reference_package` to take "
                        f"`<reference_package>.{base}`")
    return op_spec(
        name,
        family=family,
        op=f"{op_package}.{name}" if op is _DEFAULT else op,
        reference=reference or f"{reference_package}.{base}",
        args=args,
        cases=cases,
        grads=grads,
        errors=linear_attention_errors() if errors is _DEFAULT else errors,
        chunk_size=chunk_size,
        agrees_with=agrees_with,
        compile_cases=compile_cases,
        huge_grid=HUGE_GRID_DIMS if huge_grid is _DEFAULT else huge_grid,
        int64_dims=INT64_DIMS if int64_dims is _DEFAULT else int64_dims,
        state_dtypes=state_dtypes,
        **fields,
    )
