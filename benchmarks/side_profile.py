"""Both sides of a bench line, kernel by kernel: where a ratio below 1 comes from.

    python benchmarks/side_profile.py gated_deltanet_layer_core [more bench names]

Builds our side and the peer's exactly as ``bench.py`` does (same inputs, builders and
calls, gradients set to None before each call), then prints, forward and
forward+backward, side by side:

* each GPU kernel's time per call (torch.profiler, ``config_sweep.kernel_shares``);
* the call's time as the bench takes it (``do_bench``), the sum of its kernels, and its
  host time (the CPU's time to issue one call, the GPU left to lag behind): a bench time
  well above the kernels' sum and near the host time means the CPU is what is timed;
* for our side, the host functions that take that time (cProfile, by own time).

Timings only guide; the ratios come from ``bench.py``.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import bench  # noqa: E402
import host_timing  # noqa: E402
import config_sweep  # noqa: E402


def profile_line(name: str) -> None:
    b = next(x for x in bench.BENCHES if x.name == name)
    kwargs = b.inputs()
    for label, path, call, build in bench.side_specs(b):
        side, state = bench.make_side(path, call, build, kwargs, b.grads)
        if side is None:
            print(f"{name} {label}: {state.get('error')}")
            continue
        modes = config_sweep.kernel_shares(side, top=16)
        for mode, rows in modes.items():
            total = sum(ms for _, ms, _ in rows)
            fn = side.call_as_timed(side.forward if mode == "fwd" else side.forward_backward)
            bench_ms, host = bench_time(fn), host_ms(fn)
            print(f"{name} {label} {mode}: bench {bench_ms:.3f} ms, kernels {total:.3f} ms (top {len(rows)}), "
                  f"host {host:.3f} ms a call")
            for kernel, ms, count in rows:
                print(f"    {ms:8.3f} ms x{count}  {kernel}")
            if label == "ours":
                print(host_functions(fn))


def bench_time(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def host_ms(fn, calls: int = 50) -> float:
    """The CPU's time to issue one call (nothing waits for the GPU until the end)."""
    import torch

    return host_timing.per_call_us(fn, calls, rounds=1, sync=torch.cuda.synchronize) / 1e3


def host_functions(fn, calls: int = 20, top: int = 14, sync="cuda") -> str:
    """Where one call's host time goes: torch.profiler's CPU events (CUDA runtime calls
    such as launches, allocations and synchronizations included) by self time, and the
    host functions by own time (cProfile), each per call. ``sync=None``: CPU tensors, no
    device to wait for."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_gpu = sync == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        for _ in range(calls):
            fn()
        sync()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    lines = [f"    {e.self_cpu_time_total / 1e3 / calls:8.3f} ms x{e.count // calls:<3} {e.key[:70]}" for e in events]
    sync()
    stats = cProfile.Profile()
    stats.enable()
    for _ in range(calls):
        fn()
    stats.disable()
    sync()
    text = io.StringIO()
    pstats.Stats(stats, stream=text).sort_stats("tottime").print_stats(top)
    rows = [line for line in text.getvalue().splitlines() if line.strip()]
    start = next((i for i, line in enumerate(rows) if "ncalls" in line), 0)
    lines.append(f"    cProfile over {calls} calls:")
    lines += ["    " + line for line in rows[max(start - 2, 0):]]
    return "\n".join(lines)


if __name__ == "__main__":
    for op in sys.argv[1:] or ["gated_deltanet_layer_core"]:
        profile_line(op)
