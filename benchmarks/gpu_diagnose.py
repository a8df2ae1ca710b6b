"""Narrow down GPU-only failures, each probe in its own process (a device fault stays there).

    python benchmarks/gpu_diagnose.py            # every probe
    python benchmarks/gpu_diagnose.py delta      # probes whose name contains 'delta'

Probes: chunk_gla and chunk_rwkv6 in fp32 at the ``no_state`` case's small size, plainly,
with config variants and under compute-sanitizer memcheck (which names the kernel and the
access). The templates of earlier probes (chunk_gated_delta_rule in bf16 under strong
decay; chunk_gla in fp32 at head dim 256, plainly and under memcheck) stay for reuse.
FLA_PROBE_JOBS (default 6) probes run at once.
"""

import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GDR = r"""
import sys, json, dataclasses, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels, reference
import kernels.delta_rule.chunk as chunk_mod
DEV = "cuda" if torch.cuda.is_available() else "cpu"
from pytest_fla.tolerance import errors
T, K, norm, l2, override = {args!r}
base = chunk_mod.choose_configs
chunk_mod.choose_configs = lambda *a, **k: dataclasses.replace(base(*a, **k), **override)
gen = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
B, H, dt = 2, 4, torch.bfloat16
q, k, v = (r(B, T, H, K).to(dt).to(DEV) for _ in range(3))
g = (F.logsigmoid(r(B, T, H)) / norm).to(dt).to(DEV)
beta = torch.sigmoid(r(B, T, H)).to(dt).to(DEV)
h0 = r(B, H, K, K).float().to(DEV)
kw = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2)
o, s = kernels.chunk_gated_delta_rule(**kw)
fo, fs = kernels.fused_recurrent_gated_delta_rule(**kw)
ro, rs = reference.gated_delta_rule(**kw)
d = (o.double() - ro).abs()
by_row = d.reshape(B, T // 64, 64, H, K).amax(dim=(0, 1, 3, 4))
by_col = d.amax(dim=(0, 1, 2))
by_chunk = d.reshape(B, T // 64, 64, H, K).amax(dim=(0, 2, 3, 4))
print(f"T={{T}} K={{K}} norm={{norm}} l2={{l2}} {{override}}: o rel {{errors(o, ro)[0]:.2e}} max {{errors(o, ro)[1]:.2e}} "
      f"state {{errors(s, rs)[0]:.2e}} | fused o {{errors(fo, ro)[0]:.2e}}")
print("  worst rows in chunk", by_row.topk(4).indices.tolist(), "cols", by_col.topk(6).indices.tolist(),
      "chunks", by_chunk.topk(min(4, T // 64)).indices.tolist(), f"max|ref| {{ro.abs().max().item():.3g}}")
"""

GLA_FP32 = r"""
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels.gla.chunk as gla
DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, T, H, K, cfg = {args!r}
prec = cfg.pop("prec", None)
if prec:
    gla._dot_types = lambda work: (gla.tl.float32, prec)
for name, over in cfg.items():
    gla_cfg = gla._configs
    gla._configs = (lambda f, n, o: (lambda *a: {{**f(*a), n: {{**f(*a)[n], **o}}}}))(gla_cfg, name, over)
torch.manual_seed(0)
q, k, v = (torch.randn(B, T, H, K, device=DEV, requires_grad=True) for _ in range(3))
g = (F.logsigmoid(torch.randn(B, T, H, K, device=DEV)) / 0.01).requires_grad_()
o, s = gla._ChunkGLA.apply(q, k, v, g, None, K ** -0.5, True, None, None)
torch.cuda.is_available() and torch.cuda.synchronize(); print("forward done", flush=True)
(o.sum() + s.sum()).backward()
torch.cuda.is_available() and torch.cuda.synchronize(); print("backward done", flush=True)
import reference
from pytest_fla.tolerance import errors
with torch.no_grad():
    ro, rs = reference.gla(q=q[:1, :, :2], k=k[:1, :, :2], v=v[:1, :, :2], g=g[:1, :, :2], output_final_state=True)
print(f"o rel {{errors(o[:1, :, :2], ro)[0]:.2e}} state rel {{errors(s[:1, :2], rs)[0]:.2e}}")
"""

GLA_PARTS = r"""
import sys, torch, torch.nn.functional as F
sys.path.insert(0, {root!r})
import kernels.gla.chunk as gla
B, T, H, K, dtype, over, *state_prec, path = {args!r}
dt = getattr(torch, dtype)
base = gla._configs
gla._configs = lambda *a: {{name: {{**cfg, **over.get(name, {{}})}} for name, cfg in base(*a).items()}}
torch.manual_seed(0)
q, k, v = (torch.randn(B, T, H, K, device="cuda").to(dt) for _ in range(3))
g = (F.logsigmoid(torch.randn(B, T, H, K, device="cuda")) / 0.01).to(dt)
lay = gla._Layout(q, v, None, None)
if state_prec:
    lay.state_prec = state_prec[0]
o, ht, (A, q_in, k_out, decay, h) = gla._forward(q, k, v, g, K ** -0.5, None, True, lay, True)
torch.cuda.synchronize()
torch.save(dict(o=o, ht=ht, A=A, q_in=q_in, k_out=k_out, decay=decay, h=h), path)
"""

COMPARE = r"""
import torch
a, b = torch.load({a!r}), torch.load({b!r})
for name in a:
    x, y = a[name].double(), b[name].double()
    bad = ~torch.isclose(x, y, rtol=1e-6, atol=1e-30, equal_nan=True)
    where = bad.nonzero()[:3].tolist() if bad.any() else ""
    print(f"{{name}}: {{int(bad.sum())}} of {{x.numel()}} differ {{where}}")
"""


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


def plain_vs_sanitized(tag, args, tool="memcheck"):
    """Shell steps: the forward plainly, then under the tool, then the two results compared."""
    plain, checked = f"/tmp/gla_{tag}_plain.pt", f"/tmp/gla_{tag}_{tool}.pt"
    run = lambda path: [sys.executable, "-c", GLA_PARTS.format(root=ROOT, args=(*args, path))]
    steps = [run(plain), ["compute-sanitizer", "--tool", tool, "--print-limit", "3", *run(checked)],
             [sys.executable, "-c", COMPARE.format(a=plain, b=checked)]]
    return ["bash", "-c", " && ".join(" ".join(shlex.quote(a) for a in step) for step in steps)]


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
