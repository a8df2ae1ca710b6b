"""Which DPLR launch faults at K = V = 64, bf16, B=4 T=4096 H=16, per config variant, each
variant in a process of its own (a fault poisons its CUDA context) under
CUDA_LAUNCH_BLOCKING, so the failing launch is the one the traceback names.

    python3 benchmarks/dplr_fault_probe.py    # on the GPU machine, the repo installed
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def _config(**over) -> str:
    """Source that replaces fields of the DPLR configs before the op runs."""
    fields = ", ".join(f"{k}={v!r}" for k, v in over.items())
    return ("import dataclasses, kernels.dplr.chunk as c; _base = c.choose_configs; "
            f"c.choose_configs = lambda *a, **k: dataclasses.replace(_base(*a, **k), {fields})")


VARIANTS = {
    "default": "",  # since the fix: grad BV 32 at V = 64 (kernels/dplr/chunk.py)
    "grad BV 64 (the fault)": _config(grad_BV=64),
    "levels always": "import kernels._gate_levels as g; g.SPREAD_BY_WORK.clear()",
    "intra 16 warps": _config(intra_warps=16),
    "grad 16 warps": _config(grad_warps=16),
    "grad BK 64": _config(grad_BK=64),
    "grad BV 32": _config(grad_BV=32),
    "grad scratch": _config(grad_siblings="scratch"),
    "intra BK 64": _config(intra_BK=64),
}
BODY = r'''
import torch
from kernels import chunk_dplr_delta_rule
torch.manual_seed(0)
B, T, H, K, V = 4, 4096, 16, %(K)d, %(V)d
dev = "cuda"
q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(torch.bfloat16)
v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
a = (-k.float()).to(torch.bfloat16)
b = (0.5 * torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)).to(torch.bfloat16)
g = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=dev)) / 8).to(torch.bfloat16)
xs = [t.requires_grad_(True) for t in (q, k, v, a, b, g)]
o, _ = chunk_dplr_delta_rule(*xs)
torch.cuda.synchronize(); print("forward ok", flush=True)
o.backward(torch.randn_like(o))
torch.cuda.synchronize(); print("backward ok", flush=True)
'''

def one(job):
    K, name, pre = job
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    try:
        r = subprocess.run([sys.executable, "-c", pre + "\n" + BODY % dict(K=K, V=K)], capture_output=True, text=True, env=env, timeout=400)
    except subprocess.TimeoutExpired:
        return f"K={K} {name}: timeout"
    tail = (r.stdout + r.stderr).strip().splitlines()
    where = [l.strip() for l in tail if "kernels/dplr" in l or "kernel[" in l or "_kernel" in l]
    return f"K={K} {name}: rc={r.returncode} {' | '.join(l for l in tail if l.endswith(' ok'))} {where[-3:] if r.returncode else ''} {tail[-1][:300] if r.returncode else ''}"


if __name__ == "__main__":
    jobs = [(K, n, p) for K in (64, 128) for n, p in VARIANTS.items()]
    with ThreadPoolExecutor(len(jobs)) as ex:
        for line in ex.map(one, jobs):
            print(line, flush=True)
