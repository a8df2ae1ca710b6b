"""Host time per call of the public ops, with every kernel launch suppressed.

What a call costs on the CPU before any kernel runs (validation, allocation, the autograd
node, the custom-op dispatcher): the eager path against the custom-op path that
``torch.compile`` graphs call. Small CPU tensors under ``TRITON_INTERPRET=1`` (the wrappers
accept them there); nothing is launched, so the numbers are host overhead only.

    TRITON_INTERPRET=1 PYTHONPATH=$PWD python benchmarks/dispatch_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

import kernels  # noqa: E402
from kernels import _library  # noqa: E402
from pytest_fla import compile_checks  # noqa: E402
from pytest_fla.checks import differentiable  # noqa: E402
from pytest_fla.specs import all_specs  # noqa: E402


def _per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time of ``calls`` calls, in microseconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ops", default=None, help="comma list of op names (default: every single-op spec)")
    args = parser.parse_args()
    wanted = set(args.ops.split(",")) if args.ops else None
    print(f"torch {torch.__version__}; microseconds per call, launches suppressed; "
          "eager = the public function as users call it, custom op = torch.ops.fla.* as a compiled graph calls it")
    print(f"{'op':36s} {'eager no_grad':>14s} {'op no_grad':>11s} {'eager grad':>11s} {'op grad':>9s}")
    for spec in all_specs():
        if wanted is not None and spec.name not in wanted:
            continue
        sample = spec.sample(spec.cases[0].with_dims(T=8) if "T" in spec.cases[0].dims else spec.cases[0])
        names = differentiable(spec, sample)
        kwargs = dict(sample.kwargs)
        leaves = {n: kwargs[n].detach().clone().requires_grad_() for n in names}
        grad_kwargs = {**kwargs, **leaves}
        with compile_checks.recorded_calls() as calls, _library.launches_suppressed():
            with torch.no_grad():
                spec.op_fn(**kwargs)
            spec.op_fn(**grad_kwargs)
        if len(calls) != 2:
            continue  # a layer: several ops per call
        (op, op_args, _), (_, grad_args, _) = calls
        forward, _ = op.custom_ops(op_args)
        with _library.launches_suppressed():
            with torch.no_grad():
                eager_ng = _per_call_us(lambda: spec.op_fn(**kwargs), args.calls)
                op_ng = _per_call_us(lambda: forward(*op_args, False), args.calls)
            eager_g = _per_call_us(lambda: spec.op_fn(**grad_kwargs), args.calls)
            op_g = _per_call_us(lambda: forward(*grad_args, True), args.calls)
        print(f"{spec.name:36s} {eager_ng:14.1f} {op_ng:11.1f} {eager_g:11.1f} {op_g:9.1f}")


if __name__ == "__main__":
    main()
