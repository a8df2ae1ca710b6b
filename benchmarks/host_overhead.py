"""Host time of one launch and of the host-bound bench lines, on the GPU machine.

    python benchmarks/host_overhead.py [--profile] [--counts] [bench names]
    TRITON_INTERPRET=1 python benchmarks/host_overhead.py --cpu [--counts] [--profile] [bench names]

A bench line whose kernels take less time than the CPU needs to issue them is timed as
host time (``side_profile.py`` shows which). This splits that time: a no-op Triton
kernel's launch with few and with many arguments, ``torch.empty``, and each named line's
forward, forward with autograd, forward+backward, the backward alone and forward+backward
with every launch suppressed (our side), each as the CPU's time to issue one call, the GPU
left to lag behind (median of several rounds of many calls). ``FLA_HOST_TINY=1`` runs the
lines at tiny shapes, where the GPU never lags. ``--profile`` then shows where each line's
forward+backward with launches suppressed spends its CPU time
(``side_profile.host_functions``: operators and CUDA runtime calls by self CPU time, where a
device synchronize or a copy to the host shows up as ``cudaStreamSynchronize`` /
``cudaMemcpyAsync`` and an allocation that reaches the driver as ``cudaMalloc``, then the
Python functions of most own time).

``--counts`` gives, per call of each line's forward and forward+backward, the torch
operators it calls (the profiler's top-level ``aten::`` events: allocations, fills,
views, copies; each costs microseconds of host time on a GPU, and each fill or copy is a
launch there), the Triton launches (counted at ``kernel[grid]``) and, on a GPU, the device
kernels it runs (fills included).

``--cpu`` runs the same lines without a GPU: CPU tensors under ``TRITON_INTERPRET=1`` at the
tiny shapes, every launch suppressed, so the rows time the host code alone (Python,
validation, allocation, the autograd node and engine), as the process's CPU time (a
machine shared with other work inflates it less than wall time). CPU tensors are cheaper to make
than CUDA ones, and no launch is timed: the absolute times are lower than on the GPU
machine, the differences between two checkouts carry over.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench  # noqa: E402
import host_timing  # noqa: E402
from side_profile import host_functions  # noqa: E402


@triton.jit
def _noop_many(a, b, c, d, e, f, T, D, N, BT: tl.constexpr, BD: tl.constexpr, FLAG: tl.constexpr):
    pass


issue_us = bench.issue_us  # one definition, the bench's host calibration uses it too


@contextlib.contextmanager
def launches_counted(launch: bool = True):
    """Counts every ``kernel[grid](...)`` (the counter it yields), launching it unless
    ``launch`` is false."""
    from triton.runtime.jit import KernelInterface

    counter = collections.Counter()
    original = KernelInterface.__getitem__

    def getitem(self, grid):
        counter[getattr(getattr(self, "fn", self), "__name__", type(self).__name__)] += 1
        return original(self, grid) if launch else (lambda *args, **kwargs: None)

    KernelInterface.__getitem__ = getitem
    try:
        yield counter
    finally:
        KernelInterface.__getitem__ = original


def suppressed(fn):
    """``fn`` with every ``kernel[grid](...)`` doing nothing: the host code alone."""
    def call():
        with launches_counted(launch=False):
            return fn()
    return call


def counts(fn, on_gpu: bool) -> str:
    """One call of ``fn``: its top-level torch operators, Triton launches and (on a GPU)
    device kernels, each with what they are."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with launches_counted(launch=on_gpu) as launches, profile(activities=activities) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    events = prof.events()
    ops = collections.Counter(
        e.name for e in events if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    line = (f"{sum(ops.values())} torch ops ({_listed(ops)}); "
            f"{sum(launches.values())} Triton launches ({_listed(launches)})")
    if on_gpu:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        line += f"; {len(kernels)} GPU kernels"
    return line


def _listed(counter) -> str:
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counter.most_common())


def line_rows(names: list[str]) -> tuple[list, dict]:
    """(label, fn) of each named line's calls (forward, with autograd, forward+backward, the
    backward alone), and the line's side by name (None where it could not be built)."""
    rows, sides = [], {}
    for name in names:
        b = next(x for x in bench.BENCHES if x.name == name)
        side, state = bench.make_side(b.ours, b.call, b.build, b.inputs(), b.grads)
        sides[name] = side
        if side is None:
            print(f"{name}: {state}")
            continue
        outs = bench.tensors_of(side.call(side.obj, dict(side.train_kwargs)))
        cotangents = [torch.randn_like(o) for o in outs]

        def backward_only(outs=outs, cotangents=cotangents, side=side):
            for t in side.grad_tensors:
                t.grad = None
            torch.autograd.backward(outs, cotangents, retain_graph=True)

        rows += [
            (f"{name} forward, no grad", side.forward),
            (f"{name} forward, autograd", lambda s=side: s.call(s.obj, dict(s.train_kwargs))),
            (f"{name} forward+backward", side.call_as_timed(side.forward_backward)),
            (f"{name} backward alone", backward_only),
        ]
    return rows, sides


def main(names: list[str], profiled: bool = False, counted: bool = False, on_cpu: bool = False) -> None:
    tiny = on_cpu or os.environ.get("FLA_HOST_TINY") == "1"
    if tiny:  # shapes whose kernels take next to no GPU time
        bench.HGRN.update(B=1, T=64, D=64)
        bench.LINEAR.update(B=1, T=64, H=2)
        bench.MODULE.update(B=1, T=64, H=2)
    if on_cpu:
        main_on_cpu(names, profiled, counted)
        return
    x = torch.empty(1 << 20, device="cuda")
    t = [torch.empty(16, device="cuda") for _ in range(6)]
    rows = [
        ("no-op kernel, 1 argument", 200, lambda: bench._noop[(1,)](x)),
        ("no-op kernel, 12 arguments", 200, lambda: _noop_many[(1,)](*t, 4096, 2048, 4, BT=64, BD=64, FLAG=True,
                                                                        num_warps=4, enable_fp_fusion=True)),
        ("torch.empty [4, 4096, 2048] bf16", 200,
         lambda: torch.empty((4, 4096, 2048), device="cuda", dtype=torch.bfloat16)),
    ]
    line, sides = line_rows(names)
    for label, fn in line:
        rows.append((label, 50, fn))
        if label.endswith("forward+backward"):
            rows.append((label + ", launches suppressed", 50, suppressed(fn)))
    print(f"torch {torch.__version__} triton {triton.__version__}: CPU microseconds to issue one call"
          f"{' (tiny shapes)' if tiny else ''}; {os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.2f}")
    for label, calls, fn in rows:
        print(f"{issue_us(fn, calls=calls):9.1f}  {label}")
    if counted:
        print_counts(sides, on_gpu=True)
    if profiled:
        for label, _, fn in rows:
            if label.endswith("launches suppressed"):
                fn()
                print(f"\n{label}, per call: self CPU time by operator and CUDA runtime call")
                print(host_functions(fn, calls=50))


def print_counts(sides: dict, on_gpu: bool) -> None:
    for name, side in sides.items():
        if side is None:
            continue
        print(f"\n{name}, per call:")
        print(f"    forward, no grad:  {counts(side.forward, on_gpu)}")
        print(f"    forward+backward:  {counts(side.call_as_timed(side.forward_backward), on_gpu)}")


def main_on_cpu(names: list[str], profiled: bool, counted: bool) -> None:
    """The lines' host code on CPU tensors, every launch suppressed (module docstring)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu runs the kernels' wrappers on CPU tensors: set TRITON_INTERPRET=1")
    bench.DEVICE = "cpu"
    with launches_counted(launch=False):
        rows, sides = line_rows(names)
        print(f"torch {torch.__version__} triton {triton.__version__}: CPU microseconds of host code a call, "
              f"CPU tensors at tiny shapes, launches suppressed (this process's CPU time, median of 9 rounds of "
              f"2000 calls); "
              f"{os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.2f}")
        for label, fn in rows:
            print(f"{host_timing.per_call_us(fn, calls=2000, rounds=9, clock=time.process_time):9.1f}  {label}")
    if counted:
        print_counts(sides, on_gpu=False)
    if profiled:
        for label, fn in rows:
            if label.endswith("forward+backward"):
                print(f"\n{label}, per call: self CPU time by operator, then Python function")
                print(host_functions(suppressed(fn), calls=200, sync=None))


if __name__ == "__main__":
    args = sys.argv[1:]
    flags = {"--profile", "--counts", "--cpu"}
    main([a for a in args if a not in flags] or ["chunk_hgrn"], profiled="--profile" in args,
         counted="--counts" in args, on_cpu="--cpu" in args)
