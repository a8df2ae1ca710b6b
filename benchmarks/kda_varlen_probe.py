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
variant = sys.argv[1]
import kernels._utils as u
u.POISON_ALLOCATIONS = True  # as the test suite has it (fla_poison)
if variant in ("gather", "scratch"):
    import kernels.delta_rule.chunk_kda as m
    base = m.kda_configs
    m.kda_configs = lambda *a: dataclasses.replace(base(*a), prepare_siblings=variant)
elif variant.startswith("warps"):
    import kernels.delta_rule.chunk_kda as m
    base = m.kda_configs
    m.kda_configs = lambda *a: dataclasses.replace(base(*a), prepare_warps=int(variant[5:]))
elif variant == "levels":
    import kernels._gate_levels as g
    g.SPREAD_BY_WORK.clear()
elif variant == "one":
    import kernels._gate_levels as g
    g.SPREAD_BY_WORK[torch.float32] = 1e30
from pytest_fla.specs import all_specs
from pytest_fla import checks
from pytest_fla.packings import packings
spec = next(s for s in all_specs() if s.name == "chunk_kda")
fails = 0
for packing in packings(spec.chunk_size or 16):
    for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
        try:
            checks.check_varlen(spec, spec.cases[0], packing, "fp32", torch.device("cuda"), checks.seed_for("varlen", spec.name, "fp32", packing.name))
            print(variant, packing.name, "ok", flush=True)
        except AssertionError as e:
            fails += 1
            print(variant, packing.name, "FAIL", str(e).splitlines()[0][:160], flush=True)
print(variant, "failures", fails)
