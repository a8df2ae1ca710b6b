"""Checks that every op works under ``torch.compile``, written once over all op specs,
and the tests that run them over the session's specs (``from pytest_fla.checks.torch_compile
import *`` in a test module, like :mod:`pytest_fla.checks.conformance`).

* ``check_opcheck``: ``torch.library.opcheck`` on every custom op a call of the spec's op
  goes through, forward and backward, with the arguments the call gave it (seen by a
  ``TorchDispatchMode``, the library's ``fla_through_custom_ops`` flags set; under the interpreter without opcheck's AOT-dispatch test, which
  the next check covers). Allocations start at zero meanwhile (``fla_zero_allocations``):
  opcheck compares every output of two runs, the slots no kernel writes included.
* ``check_compiled_matches_eager``: ``torch.compile(fullgraph=True, dynamic=True)``
  around the op, at two sequence lengths (or two packings of ``cu_seqlens``), compiles
  once and gives the eager outputs and gradients (bit for bit where the graph holds the
  custom ops alone: they run the same launches).
* ``check_cuda_graphs``: under ``mode="reduce-overhead"`` (CUDA graphs), outputs of two
  calls alive at once are each right, over the calls that warm up, record and replay, and
  an eager call afterwards still matches (no cache the kernels keep was captured into a
  graph's memory: the library's ``fla_clear_caches`` functions empty them first).

Cases are the spec's first case, at its CPU sizes under the interpreter (T cut to a few
tokens where the case is longer: every check runs the op several times) and at its GPU
sizes on a GPU. Under the interpreter inductor compiles the graph for the CPU, and the
custom ops in it run the kernels in the interpreter as in eager mode.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import poison, switches
from .generic import differentiable, run_with_grads, seed_for
from ..running.devices import is_interpreter
from ..ops.registry import over_specs, spec_param
from ..ops.spec import Case, OpSpec, Sample
from .tolerance import assert_close

__all__ = [
    "test_opcheck",
    "test_opcheck_varlen",
    "test_compiled_matches_eager",
    "test_compiled_matches_eager_varlen",
    "test_cuda_graphs",
]

# Interpreter runs: one batch row of at most this many tokens (two lengths: this and
# 3/4 of it). opcheck alone runs the op about ten times, forward and backward.
CPU_MAX_T = 6


def _with_length(case: Case, T: int) -> Case:
    """``case`` with sequence length T on every device."""
    gpu_dims = None if case.gpu_dims is None else {**case.gpu_dims, "T": T}
    return dataclasses.replace(case, dims={**case.dims, "T": T}, gpu_dims=gpu_dims)


def _case(spec: OpSpec, device) -> Case:
    case = spec.cases[0]
    if torch.device(device).type != "cuda":
        if case.dims.get("T", 0) > CPU_MAX_T:
            case = _with_length(case, CPU_MAX_T)
        if case.dims.get("B", 1) > 1:
            case = case.with_dims(B=1)
    return case


def _lengths(case: Case, device) -> tuple[int, int]:
    """Two sequence lengths for one compiled graph (above 1, which dynamo specialises)."""
    T = case.dims_for(torch.device(device))["T"]
    return T, max(2, T * 3 // 4 + 1)


# ----------------------------------------------------------------------------- opcheck


# Namespaces of torch's own ops: every other op a call reaches is a library's custom op.
TORCH_NAMESPACES = frozenset({"aten", "prim", "prims"})


class _CustomOpCalls(TorchDispatchMode):
    """Every custom-op call (``torch.library``) made meanwhile, as ``(op, args, kwargs)``:
    the dispatcher hands each op to the mode below autograd, so the forward ops and the
    backward ops their autograd rules call are both seen, whichever library defines them."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace not in TORCH_NAMESPACES:
            self.calls.append((func, _detached(args), _detached(kwargs)))
        return func(*args, **kwargs)


@contextlib.contextmanager
def recorded_calls():
    """Every custom-op call made meanwhile, as ``(op, args, kwargs)``."""
    mode = _CustomOpCalls()
    with mode:
        yield mode.calls


def _detached(value):
    """``value`` with every tensor detached (keeping whether it requires a gradient, which
    opcheck's autograd-registration test reads), through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def check_opcheck(spec: OpSpec, device, seed: int, lengths=None) -> list[str]:
    """opcheck every custom op one call of ``spec``'s op reaches (each op once); returns
    their names."""
    sample = spec.sample(_case(spec, device), "fp32", device, seed, lengths=lengths)
    names = differentiable(spec, sample)
    with switches.flags_set(switches.THROUGH_CUSTOM_OPS), recorded_calls() as calls:
        run_with_grads(spec.op_fn, sample, names, seed=seed)
    if not calls:
        pytest.skip(f"{spec.name}: the op calls no custom op (torch.library): opcheck has nothing to check")
    checked = []
    with poison.zeroed(), no_persistent_compile_caches():
        for op, args, kwargs in calls:
            if str(op) not in checked:
                torch.library.opcheck(op, args, kwargs, test_utils=_opcheck_utils())
                checked.append(str(op))
    return checked


# opcheck's AOT-dispatch test is left out under the interpreter (the CPU CI): there it was
# half of opcheck's time (chunk_gla's forward op 2.1 of 3.9 s, fused_recurrent_gla's 1.6 of
# 1.7 s), and check_compiled_matches_eager runs the same path on the same ops (AOTAutograd
# with dynamic shapes, outputs and gradients against eager, through torch.compile). On a
# GPU opcheck runs every test it has.
AOT_DISPATCH_TEST = "test_aot_dispatch_dynamic"
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", AOT_DISPATCH_TEST)  # its default


def _opcheck_utils() -> tuple:
    if is_interpreter():
        return tuple(u for u in OPCHECK_TESTS if u != AOT_DISPATCH_TEST)
    return OPCHECK_TESTS


# ----------------------------------------------------------------------------- compiled == eager


@contextlib.contextmanager
def no_persistent_compile_caches():
    """Inductor's FX-graph cache and AOTAutograd's cache off while a check compiles. They
    persist on disk between processes, and their keys cover a custom op's schema, not its
    implementation: a kernel change that altered how many tensors an op returns (``Tensor[]``,
    ``kernels/_library.py``), such as one more intermediate saved for the backward, met a
    graph compiled before it and failed as "wrong number of dimensions" on a machine that had
    run the checks earlier, a false failure of the change."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


@contextlib.contextmanager
def counting_graphs():
    """Yields a callable giving the number of graphs dynamo has installed meanwhile (a
    recompile for a new length adds one; a retrace of the same frame, as for a float
    argument dynamo first tries as a symbol, does not)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield lambda: counters["stats"]["unique_graphs"]


def _compiled_call(spec: OpSpec, static: dict, backend, **options):
    """``torch.compile`` of a fresh function calling ``spec``'s op with ``static`` (the
    sample's non-tensor arguments, constant for the graph) and the tensors it is given."""
    op = spec.op_fn

    def call(**tensors):
        return op(**tensors, **static)

    return torch.compile(call, backend=backend, **options)


def _split(sample: Sample) -> tuple[dict, dict]:
    tensors = {k: v for k, v in sample.kwargs.items() if isinstance(v, torch.Tensor)}
    static = {k: v for k, v in sample.kwargs.items() if not isinstance(v, torch.Tensor)}
    return tensors, static


def _assert_equal(what: str, compiled, eager) -> None:
    """Bit for bit where the graph holds the ops alone; where inductor also computes
    around them (a layer's projections, a decay vector), within the fp32 agreement
    tolerance of the eager result."""
    if compiled is None or eager is None:
        assert compiled is None and eager is None, f"{what}: one of compiled and eager is None"
        return
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype, (
        f"{what}: compiled gives {compiled.dtype}{list(compiled.shape)}, eager {eager.dtype}{list(eager.shape)}")
    if not torch.equal(compiled, eager):
        assert_close(f"{what} (compiled vs eager)", compiled, eager.double(), "fp32", "agreement")


def _compare_runs(spec: OpSpec, label: str, compiled_fn, sample: Sample, seed: int) -> None:
    names = differentiable(spec, sample)
    tensors, _ = _split(sample)
    out_c, grads_c, upstream = run_with_grads(compiled_fn, Sample(tensors), names, seed=seed)
    out_e, grads_e, _ = run_with_grads(spec.op_fn, sample, names, upstream)
    for name, c, e in zip(spec.outputs, out_c, out_e):
        _assert_equal(f"{spec.name} [{label}] {name}", c, e)
    for name in names:
        _assert_equal(f"{spec.name} [{label}] d{name}", grads_c[name], grads_e[name])


def check_compiled_matches_eager(spec: OpSpec, device, seed: int, backend: str = "inductor",
                                 packings=None) -> None:
    """``torch.compile(fullgraph=True, dynamic=True)``: two lengths (``packings``: two
    tuples of sequence lengths for ``cu_seqlens``), one compile, eager's outputs and
    gradients exactly."""
    case = _case(spec, device)
    if packings is None:
        samples = [(f"T={T}", spec.sample(_with_length(case, T), "fp32", device, seed))
                   for T in _lengths(case, device)]
    else:
        samples = [(f"lengths={lengths}", spec.sample(case, "fp32", device, seed, lengths=lengths))
                   for lengths in packings]
    compiled = None
    with no_persistent_compile_caches(), counting_graphs() as graphs:
        for label, sample in samples:
            _, static = _split(sample)
            if compiled is None:
                compiled = _compiled_call(spec, static, backend, fullgraph=True, dynamic=True)
            _compare_runs(spec, label, compiled, sample, seed)
        assert graphs() == 1, (
            f"{spec.name}: {graphs()} graphs for {[label for label, _ in samples]}; the second length should "
            "reuse the first (a guard on a size specialised it: TORCH_LOGS=recompiles)")


# ----------------------------------------------------------------------------- CUDA graphs


def check_cuda_graphs(spec: OpSpec, device, seed: int, rounds: int = 3) -> None:
    """``mode="reduce-overhead"``: two calls' outputs alive together are both right, in
    every round (warm-up, recording, replay), with their gradients; an eager call after
    them matches the eager call before them."""
    with no_persistent_compile_caches():
        _check_cuda_graphs(spec, device, seed, rounds)


def _check_cuda_graphs(spec: OpSpec, device, seed: int, rounds: int) -> None:
    torch._dynamo.reset()
    case = _case(spec, device)
    first = spec.sample(case, "fp32", device, seed)
    second = spec.sample(case, "fp32", device, seed + 1)
    names = differentiable(spec, first)
    _, static = _split(first)
    compiled = _compiled_call(spec, static, "inductor", mode="reduce-overhead")
    before = run_with_grads(spec.op_fn, first, names, seed=seed)
    # the compiled calls fill the library's caches: inside graphs, were any captured
    switches.call_each(switches.CLEAR_CACHES)
    for round_ in range(rounds):
        results = []
        for sample in (first, second):
            leaves = {n: sample.kwargs[n].detach().clone().requires_grad_(True) for n in names}
            tensors, _ = _split(sample)
            outputs = compiled(**{**tensors, **leaves})
            results.append((sample, leaves, outputs if isinstance(outputs, (tuple, list)) else (outputs,)))
        for which, (sample, leaves, outputs) in enumerate(results):
            label = f"round {round_}, call {which + 1} of 2, read after both"
            eager_out, eager_grads, upstream = run_with_grads(spec.op_fn, sample, names, seed=seed)
            for name, c, e in zip(spec.outputs, outputs, eager_out):
                _assert_equal(f"{spec.name} [{label}] {name}", None if c is None else c.detach(), e)
            pairs = [(o, g) for o, g in zip(outputs, upstream) if o is not None and g is not None and o.requires_grad]
            if pairs and names:
                grads = torch.autograd.grad([o for o, _ in pairs], [leaves[n] for n in names],
                                            [g for _, g in pairs], allow_unused=True)
                for name, g in zip(names, grads):
                    _assert_equal(f"{spec.name} [{label}] d{name}", g, eager_grads[name])
        torch.compiler.cudagraph_mark_step_begin()
    after = run_with_grads(spec.op_fn, first, names, before[2])
    for name, a, b in zip(spec.outputs, after[0], before[0]):
        _assert_equal(f"{spec.name} eager after the CUDA-graph calls: {name}", a, b)
    for name in names:
        _assert_equal(f"{spec.name} eager after the CUDA-graph calls: d{name}", after[1][name], before[1][name])


# ----------------------------------------------------------------------------- the tests


def _one_per_spec(where=lambda spec: True):
    def params(specs):
        return [spec_param(spec) for spec in specs if where(spec)]

    return params


def _varlen(spec) -> bool:
    return spec.varlen


# Sequence lengths of the varlen checks: empty and one-token sequences among others; on a
# GPU they cross the chunk edges (``c`` the spec's chunk length).
def _packings(spec, device) -> tuple:
    c = spec.chunk_size or 16
    if torch.device(device).type == "cuda":
        return (3, c + 1, 0, 2 * c), (c - 1, 1, 4, c + 5)
    return (2, 3, 0, 1), (3, 1, 2, 2)


@over_specs("spec", _one_per_spec())
def test_opcheck(spec, fla_device):
    checked = check_opcheck(spec, fla_device, seed_for("opcheck", spec.name))
    print(", ".join(checked))


@over_specs("spec", _one_per_spec(_varlen))
def test_opcheck_varlen(spec, fla_device):
    check_opcheck(spec, fla_device, seed_for("opcheck-varlen", spec.name), lengths=(2, 0, 3))


@over_specs("spec", _one_per_spec())
def test_compiled_matches_eager(spec, fla_device):
    check_compiled_matches_eager(spec, fla_device, seed_for("compiled", spec.name))


@over_specs("spec", _one_per_spec(_varlen))
def test_compiled_matches_eager_varlen(spec, fla_device):
    check_compiled_matches_eager(spec, fla_device, seed_for("compiled-varlen", spec.name),
                                 packings=_packings(spec, fla_device))


@over_specs("spec", _one_per_spec())
def test_cuda_graphs(spec, fla_device):
    if torch.device(fla_device).type != "cuda":
        pytest.skip("CUDA graphs (mode='reduce-overhead') need a GPU")
    check_cuda_graphs(spec, fla_device, seed_for("cudagraphs", spec.name))
