"""Host time per call of the public ops, with every kernel launch suppressed.

What a call costs on the CPU before any kernel runs (validation, allocation, the autograd
node, the custom-op dispatcher): the eager path users call, and the custom-op path that
``torch.compile`` graphs call (``torch.ops.fla.*``). Small CPU tensors under
``TRITON_INTERPRET=1`` (the wrappers accept them there); nothing is launched, and the
time is this process's CPU time (``time.process_time``), so a busy machine inflates it
less than wall time. Runs on a checkout without ``kernels._library`` too (eager columns
only), to compare the eager path before and after.

    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/dispatch_overhead.py [--calls 2000] [--ops a,b]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from triton.runtime.jit import KernelInterface  # noqa: E402

from pytest_fla.checks.generic import differentiable  # noqa: E402
from specs import all_specs  # noqa: E402

import host_timing  # noqa: E402  (beside this file)


@contextlib.contextmanager
def no_launches():
    """Every ``kernel[grid](...)`` does nothing meanwhile."""
    original = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean CPU time of ``calls`` calls, in microseconds."""
    return host_timing.per_call_us(fn, calls, repeats, clock=time.process_time)


@contextlib.contextmanager
def launch_op_calls(library):
    """Every ``library.LaunchOp`` call made meanwhile, as ``(op, args)``."""
    calls = []
    original = library.LaunchOp.__call__

    def recording(self, *args, offsets=None):
        calls.append((self, args))
        return original(self, *args, offsets=offsets)

    library.LaunchOp.__call__ = recording
    try:
        yield calls
    finally:
        library.LaunchOp.__call__ = original


def _custom_op_calls(spec, kwargs, grad_kwargs):
    """``(forward op, no-grad args, grad args)`` of the op's one custom-op call, or None
    (no ``kernels._library`` here, or a layer making several calls)."""
    try:
        from kernels import _library
    except ImportError:
        return None
    with launch_op_calls(_library) as calls, no_launches():
        with torch.no_grad():
            spec.op_fn(**kwargs)
        spec.op_fn(**grad_kwargs)
    if len(calls) != 2:
        return None
    (op, args), (_, grad_args) = calls
    return op.custom_ops(args)[0], args, grad_args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ops", default=None, help="comma list of op names (default: every spec)")
    options = parser.parse_args()
    wanted = set(options.ops.split(",")) if options.ops else None
    print(f"torch {torch.__version__}: CPU microseconds per call, launches suppressed (T = 8)")
    print(f"{'op':34s} {'eager no_grad':>13s} {'op no_grad':>10s} {'eager grad':>10s} {'op grad':>8s}")
    for spec in all_specs():
        if spec.op is None or (wanted is not None and spec.name not in wanted):
            continue
        case = spec.cases[0]
        if "T" in case.dims:
            case = case.with_dims(T=8)
        kwargs = dict(spec.sample(case).kwargs)
        names = differentiable(spec, spec.sample(case))
        grad_kwargs = {**kwargs, **{n: kwargs[n].detach().clone().requires_grad_() for n in names}}
        ops = _custom_op_calls(spec, kwargs, grad_kwargs)
        with no_launches():
            with torch.no_grad():
                eager_ng = per_call_us(lambda: spec.op_fn(**kwargs), options.calls)
                op_ng = per_call_us(lambda: ops[0](*ops[1], False), options.calls) if ops else float("nan")
            eager_g = per_call_us(lambda: spec.op_fn(**grad_kwargs), options.calls)
            op_g = per_call_us(lambda: ops[0](*ops[2], True), options.calls) if ops else float("nan")
        print(f"{spec.name:34s} {eager_ng:13.1f} {op_ng:10.1f} {eager_g:10.1f} {op_g:8.1f}")


if __name__ == "__main__":
    main()
