"""Forward time of chunk_gla and chunk_gated_delta_rule per kernel config, on one GPU.

    python benchmarks/config_sweep.py [--jobs 8] [--phase compile|time|all] [--out FILE]

Each variant overrides one kernel's config (block sizes, warps, stages) and leaves the
others at the chosen defaults; ``default`` is the config the op picks today. Variants are
compiled first in parallel processes (into the shared Triton cache), then timed one at a
time in this process on the idle GPU, at the benchmark size (B=4 T=4096 H=16 K=V=128,
bf16). A variant that fails to compile or run is reported with its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZE = dict(B=4, T=4096, H=16, K=128, V=128)

GLA_VARIANTS = {
    "default": {},
    "intra 4 warps": {"intra": {"num_warps": 4}},
    "intra BK 32": {"intra": {"BK": 32}},
    "intra BK 128": {"intra": {"BK": 128}},
    "intra 2 stages": {"intra": {"num_stages": 2}},
    "state BV 32": {"state": {"BV": 32}},
    "state BV 32, 4 warps": {"state": {"BV": 32, "num_warps": 4}},
    "state BV 128": {"state": {"BV": 128}},
    "state 4 warps": {"state": {"num_warps": 4}},
    "state 2 stages": {"state": {"num_stages": 2}},
    "state 1 stage": {"state": {"num_stages": 1}},
}
GDR_VARIANTS = {
    "default": {},
    "prepare 8 warps": {"prepare_warps": 8},
    "prepare 1 stage": {"prepare_stages": 1},
    "state BV 32": {"state_BV": 32},
    "state 8 warps": {"state_warps": 8},
    "state 1 stage": {"state_stages": 1},
    "state 3 stages": {"state_stages": 3},
    "output BV 64": {"output_BV": 64},
    "output 8 warps": {"output_warps": 8},
    "output 3 stages": {"output_stages": 3},
    "output BK 128": {"output_BK": 128},
}


def patch(op: str, over: dict):
    """Make the op pick its default config with ``over`` applied."""
    if op == "chunk_gla":
        import kernels.gla.chunk as mod
        base = mod._configs
        mod._configs = lambda *a: {name: {**cfg, **over.get(name, {})} for name, cfg in base(*a).items()}
    else:
        import kernels.delta_rule.chunk as mod
        base = mod.choose_configs
        mod.choose_configs = lambda *a, **k: dataclasses.replace(base(*a, **k), **over)


def inputs(op: str):
    B, T, H, K, V = (SIZE[d] for d in "BTHKV")
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(torch.bfloat16)
    q, v = r(B, T, H, K), r(B, T, H, V)
    if op == "chunk_gla":
        g = (F.logsigmoid(torch.randn(B, T, H, K, device="cuda", generator=gen)) / 16).to(torch.bfloat16)
        return dict(q=q, k=r(B, T, H, K), v=v, g=g)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen)).to(torch.bfloat16)
    beta = torch.rand(B, T, H, device="cuda", generator=gen).to(torch.bfloat16)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def run_one(op: str, over: dict, time_it: bool):
    import kernels
    patch(op, over)
    fn = getattr(kernels, op)
    kw = inputs(op)
    with torch.no_grad():
        fn(**kw)
        torch.cuda.synchronize()
        if not time_it:
            return None
        from triton.testing import do_bench
        return do_bench(lambda: fn(**kw), warmup=50, rep=300, return_mode="median")


def compile_variant(op: str, label: str, over: dict) -> str | None:
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            f"import config_sweep; config_sweep.run_one({op!r}, {over!r}, False)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=400)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--phase", choices=("compile", "time", "all"), default="all")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    todo = [("chunk_gla", label, over) for label, over in GLA_VARIANTS.items()]
    todo += [("chunk_gated_delta_rule", label, over) for label, over in GDR_VARIANTS.items()]
    errors = [None] * len(todo)
    if args.phase != "time":
        with ThreadPoolExecutor(args.jobs) as pool:
            errors = list(pool.map(lambda t: compile_variant(*t), todo))
        if args.phase == "compile":
            for (op, label, _), err in zip(todo, errors):
                print(f"compiled {op} {label}: {err or 'ok'}")
            return
    rows = []
    for (op, label, over), err in zip(todo, errors):
        ms = None
        if err is None:
            # each variant in a fresh process: patches do not stack, a fault stays there
            code = (f"import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                    f"import config_sweep; print(config_sweep.run_one({op!r}, {over!r}, True))")
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200)
            if r.returncode == 0:
                ms = float(r.stdout.strip().splitlines()[-1])
            else:
                err = (r.stderr.strip().splitlines() or ["?"])[-1]
        rows.append(dict(op=op, variant=label, override=over, ms=ms, error=err))
        print(f"{op:24s} {label:24s} " + (f"{ms:.3f} ms" if ms is not None else f"error: {err}"), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(size=SIZE, device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
