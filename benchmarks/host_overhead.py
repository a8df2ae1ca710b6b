"""Host time of one launch and of the host-bound bench lines, on the GPU machine.

    python benchmarks/host_overhead.py [--profile] [bench names]

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
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench  # noqa: E402
from side_profile import host_functions  # noqa: E402


@triton.jit
def _noop_many(a, b, c, d, e, f, T, D, N, BT: tl.constexpr, BD: tl.constexpr, FLAG: tl.constexpr):
    pass


issue_us = bench.issue_us  # one definition, the bench's host calibration uses it too


def suppressed(fn):
    """``fn`` with every ``kernel[grid](...)`` doing nothing: the host code alone."""
    from triton.runtime.jit import KernelInterface

    def call():
        original = KernelInterface.__getitem__
        KernelInterface.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)
        try:
            return fn()
        finally:
            KernelInterface.__getitem__ = original
    return call


def main(names: list[str], profiled: bool = False) -> None:
    if os.environ.get("FLA_HOST_TINY") == "1":  # shapes whose kernels take next to no GPU time
        bench.HGRN.update(B=1, T=64, D=64)
        bench.LINEAR.update(B=1, T=64, H=2)
        bench.MODULE.update(B=1, T=64, H=2)
    x = torch.empty(1 << 20, device="cuda")
    t = [torch.empty(16, device="cuda") for _ in range(6)]
    rows = [
        ("no-op kernel, 1 argument", 200, lambda: bench._noop[(1,)](x)),
        ("no-op kernel, 12 arguments", 200, lambda: _noop_many[(1,)](*t, 4096, 2048, 4, BT=64, BD=64, FLAG=True,
                                                                        num_warps=4, enable_fp_fusion=True)),
        ("torch.empty [4, 4096, 2048] bf16", 200,
         lambda: torch.empty((4, 4096, 2048), device="cuda", dtype=torch.bfloat16)),
    ]
    for name in names:
        b = next(x for x in bench.BENCHES if x.name == name)
        side, state = bench.make_side(b.ours, b.call, b.build, b.inputs(), b.grads)
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
            (f"{name} forward, no grad", 50, side.forward),
            (f"{name} forward, autograd", 50, lambda s=side: s.call(s.obj, dict(s.train_kwargs))),
            (f"{name} forward+backward", 50, side.call_as_timed(side.forward_backward)),
            (f"{name} backward alone", 50, backward_only),
            (f"{name} forward+backward, launches suppressed", 50, suppressed(side.call_as_timed(side.forward_backward))),
        ]
    tiny = " (tiny shapes)" if os.environ.get("FLA_HOST_TINY") == "1" else ""
    print(f"torch {torch.__version__} triton {triton.__version__}: CPU microseconds to issue one call{tiny}; "
          f"{os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.2f}")
    for label, calls, fn in rows:
        print(f"{issue_us(fn, calls=calls):9.1f}  {label}")
    if profiled:
        for label, _, fn in rows:
            if label.endswith("launches suppressed"):
                fn()
                print(f"\n{label}, per call: self CPU time by operator and CUDA runtime call")
                print(host_functions(fn, calls=50))


if __name__ == "__main__":
    args = sys.argv[1:]
    main([a for a in args if a != "--profile"] or ["chunk_hgrn"], profiled="--profile" in args)
