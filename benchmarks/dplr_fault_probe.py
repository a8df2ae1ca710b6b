"""Which DPLR launch faults at K = V = 64, bf16, B=4 T=4096 H=16, per config variant, each
variant in a process of its own (a fault poisons its CUDA context) under
CUDA_LAUNCH_BLOCKING, so the failing launch is the one the traceback names.

    python3 benchmarks/dplr_fault_probe.py    # on the GPU machine, the repo installed
"""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import config_sweep as sweep  # noqa: E402 - the config patches of the sweep

VARIANTS = {
    "default": [],  # since the fix: grad BV 32 at V = 64 (kernels/dplr/chunk.py)
    "grad BV 64 (the fault)": sweep._dplr(grad_BV=64),
    "levels always": sweep.LEVELS_ALWAYS,
    "intra 16 warps": sweep._dplr(intra_warps=16),
    "grad 16 warps": sweep._dplr(grad_warps=16),
    "grad BK 64": sweep._dplr(grad_BK=64),
    "grad BV 32": sweep._dplr(grad_BV=32),
    "grad scratch": sweep._dplr(grad_siblings="scratch"),
    "intra BK 64": sweep._dplr(intra_BK=64),
}
# run first in each child: the variant's patches, before the op's first launch compiles
SETUP = (f"import sys; sys.path[:0] = [{HERE!r}, '.']; import config_sweep, dplr_fault_probe; "
         "config_sweep.apply_patches(dplr_fault_probe.VARIANTS[%(name)r])")
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
    K, name = job
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    source = SETUP % dict(name=name) + "\n" + BODY % dict(K=K, V=K)
    try:
        r = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=400)
    except subprocess.TimeoutExpired:
        return f"K={K} {name}: timeout"
    tail = (r.stdout + r.stderr).strip().splitlines()
    where = [l.strip() for l in tail if "kernels/dplr" in l or "kernel[" in l or "_kernel" in l]
    return f"K={K} {name}: rc={r.returncode} {' | '.join(l for l in tail if l.endswith(' ok'))} {where[-3:] if r.returncode else ''} {tail[-1][:300] if r.returncode else ''}"


if __name__ == "__main__":
    jobs = [(K, name) for K in (64, 128) for name in VARIANTS]
    with ThreadPoolExecutor(len(jobs)) as ex:
        for line in ex.map(one, jobs):
            print(line, flush=True)
