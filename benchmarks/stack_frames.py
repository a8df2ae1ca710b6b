"""The kernels whose compiled code spills to a stack frame, and the local memory each makes
a process keep on a GPU.

    FLA_TRITON_CACHE_BASE=/tmp/cache pytest tests/test_compile.py --fla-arch=sm90 -n 2
    python benchmarks/stack_frames.py /tmp/cache/fla-sm90 [--sms 132] [--top 20]

A launch of a kernel with a stack frame grows its CUDA context's per-thread stack limit to
that frame, and the driver backs the limit with local memory for every thread the GPU can
hold (2048 a multiprocessor since Volta), kept until the limit is set again or the process
ends (``pytest_fla/running/gpu_memory.py``). Reads every cubin of a Triton cache directory with the
``cuobjdump`` that Triton ships (``--dump-resource-usage``) and prints, largest frame
first, the frame (STACK plus LOCAL bytes a thread), registers, warps and stages, and the
local memory a GPU of ``--sms`` multiprocessors (132: the H100 SXM) reserves for it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess

THREADS_PER_SM = 2048
_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")


def cuobjdump() -> str:
    import triton

    return str(pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def parse_usage(text: str) -> tuple[int, int]:
    """(registers, stack frame bytes) from ``cuobjdump --dump-resource-usage`` of one kernel."""
    match = _USAGE.search(text)
    if match is None:
        raise ValueError(f"no resource usage line in: {text[:200]!r}")
    return int(match.group(1)), int(match.group(2)) + int(match.group(3))


def frames(cache: pathlib.Path, tool: str) -> list[dict]:
    rows = []
    for cubin in sorted(cache.glob("*/*.cubin")):
        out = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        registers, frame = parse_usage(out)
        meta = json.loads(cubin.with_suffix(".json").read_text())
        rows.append(dict(kernel=cubin.stem, frame=frame, registers=registers,
                         warps=meta.get("num_warps"), stages=meta.get("num_stages")))
    return sorted(rows, key=lambda r: (-r["frame"], r["kernel"]))


def reserved_gib(frame: int, sms: int) -> float:
    return frame * THREADS_PER_SM * sms / 2**30


def main(cache: str, sms: int, top: int) -> None:
    rows = frames(pathlib.Path(cache), cuobjdump())
    spilling = [r for r in rows if r["frame"]]
    print(f"{len(rows)} compiled kernels, {len(spilling)} with a stack frame; "
          f"local memory kept per process, at {sms} multiprocessors:")
    for r in spilling[:top]:
        print(f"{r['frame']:7d} B a thread  {reserved_gib(r['frame'], sms):5.2f} GiB  "
              f"{r['registers']:3d} registers  {r['warps']} warps  {r['stages']} stages  {r['kernel']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache", help="a Triton cache directory (one target's, as the plugin keeps them)")
    parser.add_argument("--sms", type=int, default=132, help="multiprocessors of the GPU (132: H100 SXM)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    main(args.cache, args.sms, args.top)
