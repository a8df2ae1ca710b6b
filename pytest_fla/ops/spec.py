"""Op specs: each op described once, as data; the checks are written once over all of them.

An :class:`OpSpec` says what an op is (its kernel entry point and its float64 reference),
how to draw inputs for it (:meth:`OpSpec.sample`), which inputs have gradients, which
bad inputs must raise what, which other op it must agree with, and at which sizes its
launch grids are pushed past CUDA's limits. The generic checks
(:mod:`pytest_fla.checks.conformance`) are parametrized over every spec the session's
``pytest_fla_specs`` hooks return (``docs/plugin-api.md``).

Dim names in layouts and cases are free, except three that the checks read:

* ``B``: the batch. The huge-grid and 64-bit-offset checks grow it, the varlen check
  sets it to 1; a tensor whose layout starts with ``B`` (or ``N``) is tiled along it.
* ``T``: time (tokens). Packed sequences lie along it; a tensor with ``T`` in its layout
  is sliced per sequence by the varlen check.
* ``N``: the number of sequences (``B``, or ``len(cu_seqlens) - 1``), set by the factory:
  per-sequence tensors (``initial_state``) start with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

DTYPE_NAMES = ("fp32", "bf16", "fp16")


def torch_dtype(name: str):
    """``"fp32"``, ``"bf16"``, ``"fp16"`` (the checked dtypes) or ``"fp64"`` (references)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}[name]


def dtype_name(dtype) -> str:
    """The name of a checked torch dtype (``torch.bfloat16`` -> ``"bf16"``)."""
    import torch

    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}[dtype]


# Checked dtypes from the finest to the coarsest unit roundoff (fp32 2^-24, fp16 2^-11, bf16 2^-8).
BY_ROUNDOFF = ("fp32", "fp16", "bf16")


def coarsest(*names: str) -> str:
    """The dtype of ``names`` with the largest unit roundoff: a value rounded to it is held
    to its budget whatever the run's dtype (e.g. a bf16 state's gradient in an fp32 run)."""
    return max(names, key=BY_ROUNDOFF.index)


@dataclass(frozen=True)
class Case:
    """A named input configuration: sizes, the distribution inputs are drawn from, options.

    ``dims`` holds the sizes the op's input factory understands (``B, T, H, K, V, HV`` for
    the linear-attention ops); ``dist`` names a distribution the factory knows
    (``realistic``, ``strong_decay``, ...); ``options`` are extra keyword arguments of the
    op (``output_final_state``, ``use_qk_l2norm_in_kernel``, ...) and factory switches
    (``initial_state``: draw one; ``True`` draws a state in float32, a dtype name such as
    ``"bf16"`` one rounded to that dtype). ``gpu_dims`` replaces ``dims`` on a CUDA device, where
    realistic sizes are affordable (CPU runs use the interpreter at small sizes).
    ``checks``, if given, limits the case to those checks (e.g. a large forward-only case).
    """

    name: str
    dims: Mapping[str, int]
    dist: str = "realistic"
    options: Mapping[str, Any] = field(default_factory=dict)
    gpu_dims: Mapping[str, int] | None = None
    checks: tuple[str, ...] | None = None

    def dims_for(self, device) -> Mapping[str, int]:
        """``gpu_dims`` on a CUDA device, unless ``FLA_SMALL_SHAPES=1`` (set under the
        sanitizer, which slows kernels down a hundredfold) asks for the small ones."""
        import os

        from .. import environment

        small = os.environ.get(environment.SMALL_SHAPES) == "1"
        return self.gpu_dims if (self.gpu_dims and str(device).startswith("cuda") and not small) else self.dims

    def with_dims(self, **dims) -> "Case":
        return dataclasses.replace(self, dims={**self.dims, **dims})

    def with_options(self, **options) -> "Case":
        return dataclasses.replace(self, options={**self.options, **options})


@dataclass
class Sample:
    """Keyword arguments for one call of an op (and of its reference)."""

    kwargs: dict[str, Any]

    def tensors(self) -> dict[str, Any]:
        import torch

        return {k: v for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)}


@dataclass(frozen=True)
class ErrorInput:
    """A call that must raise ``error`` with a message matching ``match``, before any launch.
    ``what``: what is wrong with the call, for a failure's message (``name`` where empty)."""

    name: str
    kwargs: Mapping[str, Any]
    error: type
    match: str
    what: str = ""


# (case, dtype, device, generator, lengths) -> Sample. With ``lengths`` the factory packs
# that many sequences along T (B = 1) and sets ``cu_seqlens`` (int64 unless the case says).
SampleFactory = Callable[..., Sample]
ErrorFactory = Callable[["OpSpec", Any], Iterable[ErrorInput]]


@dataclass(frozen=True)
class OpSpec:
    """One op, as data. See the module docstring; build one with
    :func:`pytest_fla.ops.builders.op_spec` (any op) or
    :func:`pytest_fla.ops.builders.linear_attention_spec` (q/k/v recurrences)."""

    name: str
    family: str
    # The kernel entry point and the float64 reference: callables, or dotted paths
    # ("kernels.chunk_simple_gla") imported on first use, which keeps collection
    # import-light and lets the same specs point at another library's kernels.
    # ``op=None`` describes a reference alone (its kernel not written yet): the
    # reference's own tests use it, the conformance checks skip it.
    op: Callable | str | None
    reference: Callable | str
    factory: SampleFactory
    cases: tuple[Case, ...]
    grads: tuple[str, ...] = ()
    errors: ErrorFactory | None = None
    # Outputs of the op, in order; ``None`` entries are allowed (e.g. no final state).
    outputs: tuple[str, ...] = ("o", "final_state")
    # Chunk length of a chunked kernel: varlen packings put sequences at chunk-1/chunk/chunk+1.
    chunk_size: int | None = None
    varlen: bool = True
    # Name of an op computing the same function differently (chunk vs fused_recurrent).
    agrees_with: str | None = None
    deterministic: bool = True
    # Cases at realistic sizes (K=V=128, 256, ...) whose launches are captured and
    # compiled offline for each target arch (the plugin's compile-only mode).
    compile_cases: tuple[Case, ...] = ()
    # The oldest arch the op supports (e.g. 80) and why; older targets raise
    # NotImplementedError before any launch, and their compile checks are skipped.
    min_arch: tuple[int, str] | None = None
    # Dims for the huge-grid check: a batch whose launch grid passes 65535 programs along
    # the batch (B*H above 65535, see ``builders.huge_grid_dims``); None: not checked.
    huge_grid: Mapping[str, int] | None = None
    # Dims of a small sample that the 64-bit-offset check tiles along ``B`` until its
    # tensors pass 2**31 elements (GPU only); None: not checked.
    int64_dims: Mapping[str, int] | None = None
    # The input declaration the factory was built from (name -> inputs.Arg), for checks
    # that mutate single arguments (wrong shape, wrong device).
    args: Mapping[str, Any] = field(default_factory=dict)
    # A composite (a layer) that hands activations of the checked dtype from op to op: its
    # reference takes ``activation_dtype`` and rounds at those hand-overs (values and their
    # gradients), so each op is held to its own budget, not to the composition's rounding
    # (``reference_for``; docs/tolerances.md, "Layers").
    reference_rounds: bool = False
    # Parameters broadcast over every token (a layer's per-head ``A_log``, ``dt_bias``): each
    # one's gradient is a signed sum of per-token terms, so its error is measured against the
    # sum of the terms' magnitudes, not against the (cancelling) sum (``checks.token_masses``;
    # docs/tolerances.md, "Token-reduced parameters"). The reference must broadcast such a
    # parameter against [B, T, ...] (it is passed one copy per token to get the terms).
    token_reduced: tuple[str, ...] = ()
    # Dtypes besides float32 that the op takes ``initial_state`` in ("bf16", "fp16"): the
    # kernels read it as float32, the final state stays float32 and the state's gradient
    # comes back in its dtype. ``test_state_dtype`` checks each against the float64
    # reference (the state rounded to it); the error checks expect the others refused.
    state_dtypes: tuple[str, ...] = ()
    # The dtypes of ``state_dtypes`` the compile checks' first case draws its state in (None:
    # all of them): a library that documents float32 states alone (another library's
    # adapters) compiles with float32 states, so that one refused bf16 state does not keep
    # every other launch of its compile check from compiling.
    compile_state_dtypes: tuple[str, ...] | None = None

    @property
    def op_fn(self) -> Callable:
        if self.op is None:
            raise TypeError(f"{self.name}: the spec describes a reference alone, it has no kernel to call")
        return resolve(self.op)

    @property
    def reference_fn(self) -> Callable:
        return resolve(self.reference)

    def sample(self, case: Case, dtype: str = "fp32", device="cpu", seed: int = 0, lengths=None) -> Sample:
        import torch

        from ..report import time_split

        device = torch.device(device)
        case = dataclasses.replace(case, dims=case.dims_for(device))
        gen = torch.Generator(device="cpu").manual_seed(seed)
        with time_split.part(time_split.INPUTS):
            return self.factory(case, torch_dtype(dtype), device, gen, lengths)

    def call(self, sample: Sample):
        """Run the op; always returns a tuple of outputs (``None`` where absent)."""
        return as_tuple(self.op_fn(**sample.kwargs))

    def reference_for(self, dtype: str | None = None) -> Callable:
        """The reference to compare a ``dtype`` run with: ``reference_fn``, told the
        activation dtype where the spec's reference rounds (``reference_rounds``)."""
        fn = self.reference_fn
        if self.reference_rounds and dtype in ("bf16", "fp16"):
            import functools

            fn = functools.partial(fn, activation_dtype=torch_dtype(dtype))
        return fn

    def call_reference(self, sample: Sample, dtype: str | None = None):
        """The reference's outputs for ``sample``, on the sample's device (computed where
        ``devices.reference_device`` says)."""
        from ..running.devices import reference_call

        fn = self.reference_for(dtype)
        return reference_call(lambda kwargs: as_tuple(fn(**kwargs)), sample.kwargs)

    def state_case(self, state_dtype: str) -> Case:
        """The first case that draws an initial state (else the first case, given one),
        with the state in ``state_dtype`` and the final state asked for."""
        case = next((c for c in self.cases if c.options.get("initial_state")), self.cases[0])
        options = {"initial_state": state_dtype}
        if "final_state" in self.outputs:
            options["output_final_state"] = True
        return case.with_options(**options)

    def case(self, name: str) -> Case:
        for c in self.cases:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no case {name!r}")

    def at_small_dims(self) -> "OpSpec":
        """This spec with every case at its small ``dims`` on every device (no ``gpu_dims``).
        The bad-input checks take it: what they check, validation before any launch, does
        not depend on size, while at the cases' GPU dims every error check drew tensors of
        up to 2**25 elements on the host first (1.6-2.0 s a check on the H100 machine, 12%
        and 32% of two suite runs' test seconds: benchmarks/results/README.md)."""
        return dataclasses.replace(self, cases=tuple(dataclasses.replace(c, gpu_dims=None) for c in self.cases))


def resolve(target: Callable | str) -> Callable:
    """A callable, or the object a dotted path ``"package.module.name"`` names."""
    if callable(target):
        return target
    import importlib

    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
