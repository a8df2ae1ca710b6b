"""chunk_kda's fp32 varlen check (packed == reference, each sequence alone == its slice of
the packed run) outside pytest, per variant of the intra kernel, to find what a failure
under the plugin's memcheck run depends on. On the GPU machine, the repo installed:

    FLA_SMALL_SHAPES=1 python3 benchmarks/kda_varlen_probe.py <variant> [repeats]
    # variant: default | gather | scratch | levels | one | warps<N>; FLA_SMALL_SHAPES=1 is
    # what --fla-sanitizer sets (the specs' CPU sizes); wrap in compute-sanitizer as wanted

Allocations are poisoned (NaN) as in the test suite.
"""
import dataclasses
import sys

import torch

sys.path.insert(0, ".")


def apply(variant: str) -> None:
    """Put the variant's kernel choice in place before the first launch compiles."""
    import kernels.delta_rule.chunk_kda as kda
    import kernels._gate_levels as levels

    base = kda.kda_configs
    if variant in ("gather", "scratch"):
        kda.kda_configs = lambda *a: dataclasses.replace(base(*a), prepare_siblings=variant)
    elif variant.startswith("warps"):
        kda.kda_configs = lambda *a: dataclasses.replace(base(*a), prepare_warps=int(variant[5:]))
    elif variant == "levels":
        levels.SPREAD_BY_WORK.clear()
    elif variant == "one":
        levels.SPREAD_BY_WORK[torch.float32] = 1e30
    elif variant != "default":
        raise SystemExit(f"unknown variant {variant!r}")


def main(variant: str, repeats: int) -> int:
    import kernels._utils as utils
    from pytest_fla import checks
    from pytest_fla.packings import packings
    from pytest_fla.specs import all_specs

    utils.POISON_ALLOCATIONS = True  # as the test suite has it (fla_poison)
    apply(variant)
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
