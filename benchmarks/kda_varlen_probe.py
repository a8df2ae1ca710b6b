"""chunk_kda's fp32 varlen check (packed == reference, each sequence alone == its slice of
the packed run) outside pytest, per variant of the intra kernel, to find what a failure
under the plugin's memcheck run depends on. On the GPU machine, the repo installed:

    FLA_SMALL_SHAPES=1 python3 benchmarks/kda_varlen_probe.py <variant> [repeats]
    # variant: a key of VARIANTS; FLA_SMALL_SHAPES=1 is what --fla-sanitizer sets (the
    # specs' CPU sizes); wrap in compute-sanitizer as wanted

Allocations are poisoned (NaN) as in the test suite.
"""
import os
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import config_sweep as sweep  # noqa: E402 - the config patches of the sweep

# one product in every program that runs fp32 work, however strong the decay
ONE_PRODUCT_ALWAYS = ("kernels._gate_levels", "SPREAD_BY_WORK", lambda base: {**base, torch.float32: 1e30})
VARIANTS = {
    "default": [],
    "gather": sweep._kda(prepare_siblings="gather"),
    "scratch": sweep._kda(prepare_siblings="scratch"),
    "levels": sweep.LEVELS_ALWAYS,
    "one": ONE_PRODUCT_ALWAYS,
    **{f"warps{n}": sweep._kda(prepare_warps=n) for n in (4, 8, 16)},
}


def main(variant: str, repeats: int) -> int:
    import kernels._utils as utils
    from pytest_fla import checks
    from pytest_fla.packings import packings
    from pytest_fla.specs import all_specs

    utils.POISON_ALLOCATIONS = True  # as the test suite has it (fla_poison)
    sweep.apply_patches(VARIANTS[variant])
    spec = next(s for s in all_specs() if s.name == "chunk_kda")
    fails = 0
    for packing in packings(spec.chunk_size or 16):
        for _ in range(repeats):
            seed = checks.seed_for("varlen", spec.name, "fp32", packing.name)
            try:
                checks.check_varlen(spec, spec.cases[0], packing, "fp32", torch.device("cuda"), seed)
                print(variant, packing.name, "ok", flush=True)
            except AssertionError as e:
                fails += 1
                print(variant, packing.name, "FAIL", str(e).splitlines()[0][:160], flush=True)
    print(variant, "failures", fails)
    return fails


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1) else 0)
