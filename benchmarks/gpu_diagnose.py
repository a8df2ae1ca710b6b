"""Narrow down GPU-only failures, each probe in its own process (a device fault stays there).

    python benchmarks/gpu_diagnose.py            # every probe
    python benchmarks/gpu_diagnose.py delta      # probes whose name contains 'delta'

Probes: the chunked delta rules' error against the float64 reference over shapes that
separate batch size, sequence length and head dim; chunk_gla in fp32 at head dim 256
under compute-sanitizer memcheck (which names the kernel and the access).
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DELTA = r'''
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels, reference
from pytest_fla.tolerance import errors
name, dtype, B, T, H, K = {args!r}
torch.manual_seed(0)
dt = dict(bf16=torch.bfloat16, fp32=torch.float32)[dtype]
q = torch.randn(B, T, H, K, device="cuda").to(dt)
k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dt)
v = torch.randn(B, T, H, K, device="cuda").to(dt)
beta = torch.rand(B, T, H, device="cuda").to(dt)
kw = dict(q=q, k=k, v=v, beta=beta, output_final_state=True)
if "gated" in name:
    kw["g"] = F.logsigmoid(torch.randn(B, T, H, device="cuda")).to(dt)
o, s = getattr(kernels, name)(**kw)
torch.cuda.synchronize()
n = min(B, 64)  # the reference on the first and last rows only
pick = lambda x: torch.cat([x[:n], x[-n:]]) if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == B else x
ro, rs = getattr(reference, name.replace("chunk_", ""))(**{{a: pick(b) for a, b in kw.items()}})
print(f"{{name}} {{dtype}} B={{B}} T={{T}} H={{H}} K={{K}}: o rel {{errors(pick(o), ro)[0]:.2e}}  state rel {{errors(pick(s), rs)[0]:.2e}}")
'''

GLA = r'''
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels
B, T, H, K = 1, 128, 2, 256
q, k, v = (torch.randn(B, T, H, K, device="cuda", requires_grad=True) for _ in range(3))
g = F.logsigmoid(torch.randn(B, T, H, K, device="cuda")).requires_grad_()
o, s = kernels.chunk_gla(q=q, k=k, v=v, g=g, output_final_state=True)
torch.cuda.synchronize(); print("chunk_gla fp32 K=256 forward done", flush=True)
(o.sum() + s.sum()).backward()
torch.cuda.synchronize(); print("chunk_gla fp32 K=256 backward done", flush=True)
'''


def probes():
    for name in ("chunk_delta_rule", "chunk_gated_delta_rule"):
        shapes = [("bf16", s) for s in ((1, 32, 6, 16), (1, 2048, 8, 16), (2, 32, 8, 128), (64, 64, 6, 16),
                                        (10923, 32, 6, 16), (10923, 64, 6, 16), (2, 100, 4, 64))]
        for dtype, (B, T, H, K) in shapes + [("fp32", (10923, 32, 6, 16))]:
                yield f"delta {name} {dtype} {B}x{T}x{H}x{K}", [sys.executable, "-c", DELTA.format(root=ROOT, args=(name, dtype, B, T, H, K))]
    # chunk_gla now routes float32 with K > 128 to the fused-recurrent kernels (this probe
    # at T = 128 found nothing; the fault showed at T >= 1024 in the conformance run)
    yield "gla fp32 k256 memcheck", ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "3",
                                     sys.executable, "-c", GLA.format(root=ROOT)]


def main(pattern=""):
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    for label, cmd in probes():
        if pattern not in label:
            continue
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        out = (r.stdout + r.stderr).strip().splitlines()
        keep = [line for line in out if not line.startswith("  warnings.warn")]
        print(f"== {label}: exit {r.returncode}")
        print("\n".join(keep[-14:] if r.returncode else keep[-3:]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
