"""Narrow down GPU-only failures, each probe in its own process (a device fault stays there).

    python benchmarks/gpu_diagnose.py            # every probe
    python benchmarks/gpu_diagnose.py delta      # probes whose name contains 'delta'

Probes: chunk_gla and chunk_rwkv6 in fp32 at the ``no_state`` case's small size, plainly,
with config variants and under compute-sanitizer memcheck (which names the kernel and the
access). Earlier probes (chunk_gated_delta_rule in bf16 under strong decay; chunk_gla in
fp32 at head dim 256, plainly and under memcheck) are in this file's git history.
FLA_PROBE_JOBS (default 6) probes run at once.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SMALL_FP32 = r"""
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels, reference
import kernels.gla.chunk as gla
from pytest_fla.tolerance import errors
DEV = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)
op, over, state_prec, backward = {args!r}
base = gla._configs
gla._configs = lambda *a: {{name: (cfg if cfg is None else {{**cfg, **over.get(name, {{}})}}) for name, cfg in base(*a).items()}}
if state_prec:
    init = gla._Layout.__init__
    def patched(self, *a, **k):
        init(self, *a, **k)
        self.state_prec = state_prec
    gla._Layout.__init__ = patched
torch.manual_seed(0)
B, T, H, K, V = 2, 70, 2, 8, 8
q, k = (torch.randn(B, T, H, K, device=DEV, requires_grad=True) for _ in range(2))
v = torch.randn(B, T, H, V, device=DEV, requires_grad=True)
g = F.logsigmoid(torch.randn(B, T, H, K, device=DEV)).requires_grad_()
u = torch.randn(H, K, device=DEV, requires_grad=True)
if op == "chunk_rwkv6":
    kw = dict(r=q, k=k, v=v, w=g, u=u)
else:
    kw = dict(q=q, k=k, v=v, g=g)
o, _ = getattr(kernels, op)(**kw)
sync(); print("forward done", flush=True)
ro, _ = getattr(reference, op.replace("chunk_", ""))(**{{n: t.detach().double() for n, t in kw.items()}})
print(f"o rel {{errors(o, ro)[0]:.2e}}", flush=True)
if backward:
    o.backward(torch.ones_like(o))
    sync(); print("backward done", flush=True)
"""


def small_fp32(op, over=None, state_prec=None, backward=True):
    """``op`` (chunk_gla or chunk_rwkv6) in fp32 at the conformance ``no_state`` size."""
    return [sys.executable, "-c", SMALL_FP32.format(root=ROOT, args=(op, over or {}, state_prec, backward))]


def probes():
    # chunk_rwkv6 fp32 at the no_state case's CPU size (K = V = 8: the one small case whose
    # state passes take a 16-wide value block, so plain fp32 products on the 228 KB parts)
    # faulted with an illegal address on the H100; chunk_gla shares those kernels.
    for op in ("chunk_gla", "chunk_rwkv6"):
        yield f"{op} fp32 K=8 forward", small_fp32(op, backward=False)
        yield f"{op} fp32 K=8 default", small_fp32(op)
        yield f"{op} fp32 K=8 memcheck", ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "4", *small_fp32(op)]
        yield f"{op} fp32 K=8 state tf32x3", small_fp32(op, state_prec="tf32x3")
        yield f"{op} fp32 K=8 state 1 stage", small_fp32(op, {"state": {"num_stages": 1}})
        yield f"{op} fp32 K=8 qkg 4 warps", small_fp32(op, {"qkg": {"num_warps": 4}})
        yield f"{op} fp32 K=8 intra 4 warps", small_fp32(op, {"intra": {"num_warps": 4}})


def run_probe(label, cmd):
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280)
        code, out = r.returncode, (r.stdout + r.stderr)
    except subprocess.TimeoutExpired as e:
        code, out = "timeout", (e.stdout or b"").decode() + (e.stderr or b"").decode()
    lines = [line for line in out.strip().splitlines() if not line.startswith("  warnings.warn")]
    sanitizer = [line for line in lines if line.startswith("=========")][:12]  # the kernel, access, line
    return f"== {label}: exit {code}\n" + "\n".join(sanitizer + lines[-8:])


def main(pattern=""):
    # probes are independent processes: several at once (each is mostly compile time)
    chosen = [(label, cmd) for label, cmd in probes() if pattern in label]
    with ThreadPoolExecutor(int(os.environ.get("FLA_PROBE_JOBS", 6))) as pool:
        for report in pool.map(lambda p: run_probe(*p), chosen):
            print(report, flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
