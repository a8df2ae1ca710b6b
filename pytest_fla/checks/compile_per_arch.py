"""The per-arch compile check over op specs: capture an op's launches, compile them offline.

``test_compile[<op>-<fwd|bwd>-<arch>]`` runs the op on CPU tensors under launch capture
for every compile case (realistic sizes) and dtype, forward or backward, with the
target's configs (``FLA_TARGET_ARCH``), then compiles every distinct launch for the
arch and checks it against the arch's limits (``pytest_fla.checks.capture``). A repository
gets the test by importing it into one of its test modules::

    from pytest_fla.compile_check import test_compile  # noqa: F401

Each runs in the process of its own arch's target (``--fla-arch=sm86`` or ``all``) and
is deselected elsewhere; on a CPU machine that process is compile-only.

``--fla-compile-scope=kernels`` compiles each kernel once per dtype (its first launch)
instead of every distinct launch: every kernel the op launches still goes through the
arch's code generator, at a fraction of the time (the specialisations of other compile
cases, such as a head dim of 256, are the ones left out; the grid checks see every launch).
``--fla-compile-scope=run`` (``--fla-quick``'s) compiles each kernel once per arch for the
whole run: an op's test compiles the kernels no earlier op's test of that arch compiled.
``--fla-compile-dtypes=bf16`` runs the ops in bf16 alone (default: bf16 and fp32). The
first compile case draws its initial state in the run's dtype where the op takes one in it
(a bf16 state in the bf16 run), the others a float32 state.
"""

from __future__ import annotations

from .capture import COMPILED_IN_PROCESS, CompileResult, assert_compiles, capture_launches
from ..ops.registry import over_specs
from ..targets import ALL_ARCHS, arch_name, parse_arch

DIRECTIONS = ("fwd", "bwd")
COMPILE_DTYPES = ("bf16", "fp32")
SCOPES = ("launches", "kernels", "run")  # --fla-compile-scope: see the module's docstring


def compile_params(specs) -> list:
    """pytest params ``(spec, direction, arch)``, marked with the op and the arch."""
    import pytest

    return [
        pytest.param(
            spec, direction, arch_name(arch),
            id=f"{spec.name}-{direction}-{arch_name(arch)}",
            marks=[pytest.mark.fla_op(spec.name), pytest.mark.fla_compile(arch_name(arch))]
            + ([pytest.mark.skip(reason=f"{spec.name} supports sm{spec.min_arch[0]} and newer: {spec.min_arch[1]}")]
               if spec.min_arch and arch < spec.min_arch[0] else []),
        )
        for spec in specs
        if spec.compile_cases
        for direction in DIRECTIONS
        if direction == "fwd" or spec.grads
        for arch in ALL_ARCHS
    ]


def capture_op(spec, arch: int, direction: str, dtypes=COMPILE_DTYPES) -> list:
    """The launches of ``spec``'s op (``fwd``, or the ``bwd`` launches alone) over its compile cases."""
    import torch

    from .generic import cotangents, differentiable

    launches = []
    with capture_launches(arch) as recorder:
        for index, case in enumerate(spec.compile_cases):
            for dtype in dtypes:
                case_in = _state_in(spec, case, dtype) if index == 0 else case
                state = " state " + dtype if case_in is not case else ""
                recorder.label = f"{case.name} {dtype}{state} {direction}"
                sample = spec.sample(case_in, dtype, "cpu")
                if direction == "fwd":
                    with torch.no_grad():
                        spec.call(sample)
                    continue
                kwargs = dict(sample.kwargs)
                leaves = [kwargs[n].detach().requires_grad_(True) for n in differentiable(spec, sample)]
                kwargs.update(zip(differentiable(spec, sample), leaves))
                produced = [o for o in spec.call(type(sample)(kwargs)) if o is not None]
                # none that requires a gradient: an op with no backward, which torch's own
                # "does not require grad" error then says (the library's refusal, not a check's)
                outputs = [o for o in produced if o.requires_grad] or produced
                start = len(recorder.launches)
                torch.autograd.backward(outputs, cotangents(outputs, 0))
                launches += recorder.launches[start:]
                del recorder.launches[start:]
    return launches if direction == "bwd" else recorder.launches


def _state_in(spec, case, dtype: str):
    """The first compile case with its initial state in the run's dtype, where the op takes
    a state in it (``OpSpec.state_dtypes``, or ``compile_state_dtypes`` where set): the
    state's loads convert to float32 and its gradient's stores back, typed code that a
    float32 state never compiles. The other cases keep the float32 state of the usual call."""
    state_dtypes = spec.state_dtypes if spec.compile_state_dtypes is None else spec.compile_state_dtypes
    if dtype in state_dtypes and case.options.get("initial_state"):
        return case.with_options(initial_state=dtype)
    return case


def check_op_compiles(spec, direction: str, arch: str, scope: str = "launches",
                      dtypes=COMPILE_DTYPES) -> CompileResult:
    """The test body: capture the op in ``dtypes``, compile for ``arch`` (``scope``: every
    distinct launch, or each kernel once per dtype), fail with every problem found."""
    cap = parse_arch(arch)
    assert cap in ALL_ARCHS
    return assert_compiles(capture_op(spec, cap, direction, dtypes), cap, per_kernel=scope != "launches",
                           compiled_before=COMPILED_IN_PROCESS if scope == "run" else None)


def compile_dtypes(text: str) -> tuple[str, ...]:
    """``--fla-compile-dtypes``: a comma list of bf16, fp32 (others have no compile cases)."""
    import pytest

    dtypes = tuple(d.strip() for d in text.split(",") if d.strip())
    unknown = [d for d in dtypes if d not in COMPILE_DTYPES]
    if unknown or not dtypes:
        raise pytest.UsageError(f"--fla-compile-dtypes: {unknown or text!r}; choose from {', '.join(COMPILE_DTYPES)}")
    return dtypes


@over_specs("spec,direction,arch", compile_params)
def test_compile(spec, direction, arch, request):
    """Every kernel config the op launches compiles for ``arch`` within its limits."""
    scope, dtypes = scope_and_dtypes(request.config)
    print(check_op_compiles(spec, direction, arch, scope, dtypes).summary())


def scope_and_dtypes(config) -> tuple[str, tuple[str, ...]]:
    """The run's compile scope and dtypes: the options', or a quick run's where not given."""
    from ..collection import quick

    option = config.getoption
    fast = option("fla_quick", False)
    scope = option("fla_compile_scope", None) or (quick.SCOPE if fast else "launches")
    dtypes = option("fla_compile_dtypes", None) or (quick.COMPILE_DTYPES if fast else ",".join(COMPILE_DTYPES))
    return scope, compile_dtypes(dtypes)
