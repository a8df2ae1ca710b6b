"""Both sides of a bench line, kernel by kernel: where a ratio below 1 comes from.

    python benchmarks/side_profile.py gated_deltanet_layer_core [more bench names]

Builds our side and the peer's exactly as ``bench.py`` does (same inputs, builders and
calls), then prints each GPU kernel's time per call (torch.profiler, ``config_sweep.
kernel_shares``), forward and forward+backward, side by side. Timings only guide; the
ratios come from ``bench.py``.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import bench  # noqa: E402
import config_sweep  # noqa: E402


def profile_line(name: str) -> None:
    b = next(x for x in bench.BENCHES if x.name == name)
    kwargs = b.inputs()
    for label, path, call, build in (("ours", b.ours, b.call, b.build), ("peer", b.peer, b.peer_call, b.peer_build)):
        side, state = bench.make_side(path, call, build, kwargs, b.grads)
        if side is None:
            print(f"{name} {label}: {state.get('error')}")
            continue
        modes = config_sweep.kernel_shares(side, top=16)
        for mode, rows in modes.items():
            total = sum(ms for _, ms, _ in rows)
            print(f"{name} {label} {mode} (top {len(rows)} kernels, {total:.3f} ms a call):")
            for kernel, ms, count in rows:
                print(f"    {ms:8.3f} ms x{count}  {kernel}")


if __name__ == "__main__":
    for op in sys.argv[1:] or ["gated_deltanet_layer_core"]:
        profile_line(op)
