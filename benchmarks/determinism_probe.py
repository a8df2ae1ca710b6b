"""Which setting makes ``chunk_gated_delta_rule``'s bf16 forward differ between two runs.

    python benchmarks/determinism_probe.py

The GatedDeltaNet layer's output differed between two identical bf16 runs on an H200
while every input of its ``chunk_gated_delta_rule`` call agreed bit for bit
(``layer_determinism.py``). This runs that call (the layer spec's GPU sizes: B=2 T=2048
H=4 HV=8 K=V=128, in-kernel l2norm) and its neighbours twice each, with the kernels'
pipelining stages as chosen, all forced to 1, and each kernel's alone forced to 1, and prints whether the outputs agree.
"""

import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from kernels.delta_rule import _chunk_common, chunk as chunk_module  # noqa: E402

B, T, H, K = 2, 2048, 4, 128
gen = torch.Generator(device="cpu").manual_seed(0)


def inputs(hv, unit_keys, dtype=torch.bfloat16):
    """Unnormalised keys only with the in-kernel l2norm (the delta rule diverges on them)."""
    def rand(*shape):
        return torch.randn(shape, generator=gen).to("cuda", dtype)
    k = rand(B, T, H, K)
    return dict(
        q=rand(B, T, H, K), k=F.normalize(k.float(), dim=-1).to(dtype) if unit_keys else k, v=rand(B, T, hv, K),
        g=F.logsigmoid(torch.randn(B, T, hv, generator=gen)).div(8).cuda(),
        beta=torch.sigmoid(torch.randn(B, T, hv, generator=gen)).to("cuda", dtype),
    )


original = _chunk_common.choose_configs
STAGES = [f.name for f in dataclasses.fields(original(128, 128, torch.bfloat16)) if f.name.endswith("_stages")]


def with_stages(names):
    """choose_configs with the named kernels' pipelining stages forced to 1."""
    def choose(*args, **kwargs):
        cfg = original(*args, **kwargs)
        return dataclasses.replace(cfg, **{name: 1 for name in names})
    return choose


variants = [("as chosen", ()), ("all 1", STAGES)] + [(f"{name}=1", (name,)) for name in STAGES]
print("stages as chosen:", {name: getattr(original(K, K, torch.bfloat16), name) for name in STAGES})
for label, names in variants:
    chunk_module.choose_configs = with_stages(names)
    for hv in (H, 2 * H):
        for l2norm in (False, True):
            kw = inputs(hv, unit_keys=not l2norm)
            runs = [kernels.chunk_gated_delta_rule(**kw, use_qk_l2norm_in_kernel=l2norm)[0] for _ in range(3)]
            same = all(torch.equal(runs[0], r) for r in runs[1:])
            worst = max((runs[0].float() - r.float()).abs().max().item() for r in runs[1:])
            print(f"{label:22s} HV={hv:2d} l2norm={l2norm!s:5s}: {'same' if same else 'DIFFERS'} (max diff {worst:.3g})")
