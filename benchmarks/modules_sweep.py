"""Config sweep for the module kernels (rotary, norms, causal conv) on one GPU.

    python benchmarks/modules_sweep.py [rotary,norm,conv]

Times each op at the benchmark shapes (bf16; B=8, T=4096, H=32, D=128; conv D=4096,
W=4, silu, bias) under the default config and under the alternatives listed below (by
replacing the wrapper's config function), and prints each time next to the memory floor
(bytes moved once / 4.3 TB/s) and the per-kernel GPU time from the profiler, so a default
can be chosen in one run. The numbers only guide the configs in ``kernels/``; the
reported timings come from ``benchmarks/bench.py``.
"""

from __future__ import annotations

import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import conv, norm, rotary  # noqa: E402

BANDWIDTH = 4.3e12
B, T, H, D = 8, 4096, 32, 128
DC, W = 4096, 4


def rand(*shape):
    return torch.randn(shape, device="cuda", dtype=torch.bfloat16)


def bench(name, fn, nbytes):
    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
    floor = nbytes / BANDWIDTH * 1e3
    print(f"{name:58s} {ms:8.4f} ms   floor {floor:.4f} ms   {100 * floor / ms:5.1f}% of floor", flush=True)


def kernel_time(name, fn, iters=20):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, getattr(e, "device_time_total", 0) / iters) for e in prof.key_averages() if getattr(e, "device_time_total", 0)]
    rows.sort(key=lambda r: -r[1])
    print(f"  [{name}] " + "; ".join(f"{k[:36]} {t / 1e3:.4f} ms" for k, t in rows[:5]), flush=True)


def forward_backward(fn, inputs, dy):
    def run():
        out = fn()
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None and o.requires_grad]
        torch.autograd.grad(outs, inputs, [dy] * len(outs))
    return run


def sweep_rotary():
    q, k = rand(B, T, H, D).requires_grad_(), rand(B, T, H, D).requires_grad_()
    dy = torch.randn_like(q)
    E = q.numel() * 2
    rope = rotary.RotaryEmbedding(D)
    original = rotary._tile_config
    for elements, warps in ((8192, None), (4096, 4), (8192, 4), (16384, 8)):
        if warps is not None:
            rotary._tile_config = lambda h, width, e=elements, w=warps: (*original(h, width, e)[:2], w)
        bench(f"rotary fwd q,k elements={elements} warps={warps or 'default'}", lambda: rope(q, k), 4 * E)
        bench(f"rotary fwd+bwd q,k elements={elements} warps={warps or 'default'}",
              forward_backward(lambda: rope(q, k), [q, k], dy), 8 * E)
    rotary._tile_config = original
    kernel_time("rotary fwd+bwd", forward_backward(lambda: rope(q, k), [q, k], dy))


def sweep_norm():
    x, g = rand(B, T, H, D).requires_grad_(), rand(B, T, H, D).requires_grad_()
    w = torch.ones(D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    E = x.numel() * 2
    original = norm._tile_config
    for elements, warps in ((None, None), (1024, 4), (2048, 4), (4096, 8), (4096, 16)):
        if elements is not None:
            norm._tile_config = lambda d, _, e=elements, nw=warps: (*original(d, e)[:2], nw)
        tag = f"elements={elements or 'default'} warps={warps or 'default'}"
        bench(f"l2norm fwd {tag}", lambda: norm.l2norm(x), 2 * E)
        bench(f"l2norm fwd+bwd {tag}", forward_backward(lambda: norm.l2norm(x), [x], dy), 5 * E)
        bench(f"rms_norm(w) fwd+bwd {tag}", forward_backward(lambda: norm.rms_norm(x, w), [x, w], dy), 5 * E)
        bench(f"rms_norm_gated fwd {tag}", lambda: norm.rms_norm_gated(x, g, w), 3 * E)
        bench(f"rms_norm_gated fwd+bwd {tag}", forward_backward(lambda: norm.rms_norm_gated(x, g, w), [x, g, w], dy), 8 * E)
    norm._tile_config = original
    kernel_time("rms_norm_gated fwd+bwd", forward_backward(lambda: norm.rms_norm_gated(x, g, w), [x, g, w], dy))
    wide = rand(B * T, 4096).requires_grad_()
    ww = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bench("rms_norm(w) D=4096 fwd+bwd", forward_backward(lambda: norm.rms_norm(wide, ww), [wide, ww], torch.randn_like(wide)), 5 * wide.numel() * 2)


def sweep_conv():
    x = rand(B, T, DC).requires_grad_()
    weight, bias = (rand(DC, W) * 0.5).requires_grad_(), rand(DC).requires_grad_()
    dy = torch.randn_like(x)
    E = x.numel() * 2
    fwd, bwd = conv._fwd_config, conv._bwd_config
    # (ROWS, AHEAD, channels a thread, warps)
    for rows, ahead, per_thread, warps in ((None, None, None, None), (32, 4, 4, 4), (128, 4, 4, 4), (64, 2, 4, 4),
                                           (64, 8, 4, 4), (64, 4, 8, 4), (64, 4, 8, 2), (64, 4, 4, 8)):
        if rows is not None:
            conv._fwd_config = lambda d, c=(rows, ahead, per_thread * 32 * warps, warps): c
        bench(f"conv fwd config={conv._fwd_config(DC)}", lambda: conv.causal_conv1d(x, weight, bias, "silu"), 2 * E)
    conv._fwd_config = fwd
    y = conv.causal_conv1d(x, weight, bias, "silu")[0]
    for rows, ahead, per_thread, warps in ((None, None, None, None), (64, 4, 4, 4), (256, 4, 4, 4), (128, 2, 4, 4),
                                           (128, 8, 4, 4), (128, 4, 8, 4), (128, 4, 4, 2), (128, 4, 8, 2)):
        if rows is not None:
            conv._bwd_config = lambda d, w, c=(rows, ahead, per_thread * 32 * warps, warps): c
        bench(f"conv bwd config={conv._bwd_config(DC, W)}",
              lambda: torch.autograd.grad(y, [x, weight, bias], dy, retain_graph=True), 3 * E)
    conv._bwd_config = bwd
    kernel_time("conv fwd+bwd", forward_backward(lambda: conv.causal_conv1d(x, weight, bias, "silu"), [x, weight, bias], dy))


if __name__ == "__main__":
    which = sys.argv[1].split(",") if len(sys.argv) > 1 else ["rotary", "norm", "conv"]
    print(torch.cuda.get_device_name(), flush=True)
    for name in which:
        print(f"== {name}", flush=True)
        {"rotary": sweep_rotary, "norm": sweep_norm, "conv": sweep_conv}[name]()
