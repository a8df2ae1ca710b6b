"""chunk_hgrn's kernels, replayed from CUDA graphs (GPU time, no host time): the summary
launch's in-kernel scan of the chunk maps at several widths (``NC`` maps a step; the
width sets the launch's registers, and so its occupancy), against the three-launch
form before it (a kernels tree carried in ``--baseline``, imported under another name).

    python benchmarks/hgrn_scan_probe.py [--baseline .carry/baseline] [--rounds 5]

Bench size and inputs (``bench.py``: B=4 T=4096 D=2048 bf16); interleaved rounds, median
and min-max per variant, forward and forward+backward.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import bench  # noqa: E402


def load_tree(path: str, name: str = "baseline_kernels"):
    """The ``kernels`` package of another tree, as package ``name`` (its imports are relative)."""
    init = os.path.join(path, "kernels", "__init__.py")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def scan_width(nc: int):
    import kernels.hgrn.chunk as chunk
    base = chunk.configs
    chunk.configs = lambda D: {**base(D), "carry": {**base(D)["carry"], "NC": nc}}
    try:
        yield
    finally:
        chunk.configs = base


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--widths", default="8,16,64")
    args = parser.parse_args()
    import kernels
    b = next(x for x in bench.BENCHES if x.name == "chunk_hgrn")
    inputs = b.inputs()
    # context factories, not managers: a generator-based manager enters only once
    variants = {f"NC={nc}": (kernels.chunk_hgrn, functools.partial(scan_width, int(nc))) for nc in args.widths.split(",")}
    if args.baseline:
        variants["three launches (baseline)"] = (load_tree(args.baseline).chunk_hgrn, contextlib.nullcontext)
    for mode in ("fwd_graph", "fwd_bwd_graph"):
        sides = {}
        for label, (fn, ctx) in variants.items():
            side = bench.Side(fn, bench.strict_call, inputs, b.grads)
            with ctx():
                side.forward(), side.forward_backward()
                side.graphed(mode.removesuffix("_graph"))  # captured under the variant's config
            sides[label] = side
        samples = bench.time_rounds(sides, mode, args.rounds, 25, 100)
        for label, s in samples.items():
            print(f"{mode:14s} {label:28s} {statistics.median(s):.4f} ms ({min(s):.4f}-{max(s):.4f})", flush=True)


if __name__ == "__main__":
    main()
