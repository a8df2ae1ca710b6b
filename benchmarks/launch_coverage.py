"""Which kernels a GPU conformance run compiles, and how many of them the compile checks
(``tests/test_compile.py``) compile too: offline, no GPU needed.

    FLA_TARGET_ARCH=sm90 python benchmarks/launch_coverage.py [--ops chunk_kda,gated_delta_net] [--arch 90]

A cold GPU run spends most of its time compiling (benchmarks/results/README.md, 2026-11-26).
On a native GPU the compile checks write to the numeric checks' Triton cache, so run first
they would warm it, for the kernels whose compile identity (kernel, specialised signature,
constexprs, attributes, options: ``capture.Launch.key``) both sides share. Each op runs on
CPU tensors under launch capture (``pytest_fla.checks.capture``), at the GPU sizes of its cases
(``Case.gpu_dims``): the forward and backward checks' cases in bf16 and fp32, and the
varlen check's packings (both index types, the packed run and each sequence alone); against
the compile checks' compile cases. Printed per op: the distinct compiles of each side and
how many of the run's the compile checks cover.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DTYPES = ("bf16", "fp32")


def _keys(launches) -> set:
    """Compile identities: ``Launch.key`` less the kernel's id, with its name instead."""
    return {launch.key()[1:] + (launch.name,) for launch in launches}


def _capture(spec, arch: int, samples, backward: bool) -> set:
    """What running ``spec`` on each sample launches: the forward as the forward and varlen
    checks run it (no autograd), or with ``backward`` as the backward check does
    (``checks.run_with_grads``: the forward with gradients, then the backward)."""
    import torch

    from pytest_fla.checks.capture import capture_launches
    from pytest_fla.checks.generic import differentiable, run_with_grads

    with capture_launches(arch) as recorder:
        for sample in samples:
            if backward:
                run_with_grads(spec.op_fn, sample, differentiable(spec, sample))
            else:
                with torch.no_grad():
                    spec.call(sample)
    return _keys(recorder.launches)


def _gpu_case(case):
    return dataclasses.replace(case, dims=dict(case.gpu_dims or case.dims), gpu_dims=None)


def _runs(case, check: str) -> bool:
    return case.checks is None or check in case.checks


def run_launches(spec, arch: int) -> set:
    """What the GPU run's forward, backward and varlen checks compile."""
    from pytest_fla.checks.generic import sequence_slice
    from pytest_fla.ops.packings import packings
    from pytest_fla.ops.spec import Sample

    keys = set()
    for dtype in DTYPES:
        for case in spec.cases:
            sample = spec.sample(_gpu_case(case), dtype, "cpu")
            if _runs(case, "forward"):
                keys |= _capture(spec, arch, [sample], backward=False)
            if spec.grads and _runs(case, "backward"):
                keys |= _capture(spec, arch, [sample], backward=True)
        if not spec.varlen:
            continue
        for packing in packings(spec.chunk_size or 16):
            sample = spec.sample(_gpu_case(spec.cases[0]), dtype, "cpu", lengths=packing.lengths)
            sample.kwargs["cu_seqlens"] = sample.kwargs["cu_seqlens"].to(packing.index_dtype)
            keys |= _capture(spec, arch, [sample], backward=bool(spec.grads))
            offsets = sample.kwargs["cu_seqlens"].tolist()
            alone = [Sample(sequence_slice(spec, sample.kwargs, offsets[n], offsets[n + 1], n))
                     for n in range(len(offsets) - 1) if offsets[n + 1] > offsets[n]]
            keys |= _capture(spec, arch, alone, backward=False)
    return keys


def compile_check_launches(spec, arch: int) -> set:
    """What the compile checks compile: ``compile_per_arch.capture_op``'s launches, both
    directions, in the default scope (every distinct launch)."""
    from pytest_fla.checks.compile_per_arch import capture_op

    keys = _keys(capture_op(spec, arch, "fwd", DTYPES))
    return keys | (_keys(capture_op(spec, arch, "bwd", DTYPES)) if spec.grads else set())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="chunk_kda,gated_delta_net")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    from specs import all_specs

    specs = {s.name: s for s in all_specs()}
    print("| op | the run compiles | the compile checks compile | of the run's, covered |")
    print("|---|---|---|---|")
    totals = [0, 0, 0]
    for name in args.ops.split(","):
        spec = specs[name]
        run, warm = run_launches(spec, args.arch), compile_check_launches(spec, args.arch)
        kernels = sorted({k[-1] for k in run - warm})
        print(f"| {name} | {len(run)} | {len(warm)} | {len(run & warm)} ({100 * len(run & warm) // max(len(run), 1)}%) |")
        print(f"  {name}: not covered, by kernel: {', '.join(kernels)}", file=sys.stderr)
        totals = [t + n for t, n in zip(totals, (len(run), len(warm), len(run & warm)))]
    print(f"| all | {totals[0]} | {totals[1]} | {totals[2]} ({100 * totals[2] // max(totals[0], 1)}%) |")


if __name__ == "__main__":
    main()
