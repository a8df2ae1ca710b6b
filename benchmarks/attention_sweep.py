"""parallel_attn's time per kernel config, beside SDPA's flash backend, on one GPU.

    python benchmarks/attention_sweep.py [--only fwd|dkdv|dq] [--dtype bf16] [--d 128] [--out FILE]

Each variant replaces one kernel's blocks ``(BM, BN, num_warps, num_stages)`` and keeps the
others at the config the op picks today (``kernels.attention.parallel.CONFIGS`` for this
GPU's arch); ``default`` is that config. Dense causal, B=4 T=4096 H=16 (HKV=16, as SDPA's
flash backend sees it) at the given head dim. Prints the forward and forward+backward
medians (``triton.testing.do_bench``) and TFLOP/s (forward ``2 * 2 * B * H * T^2 * D / 2``,
forward+backward 3.5 times that). A variant that fails to compile or run is reported
with its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels.attention.parallel as attn  # noqa: E402

B, T, H = 4, 4096, 16
VARIANTS = {
    "fwd": [(128, 128, 8, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4)],
    "dkdv": [(64, 128, 8, 2), (32, 128, 4, 3), (16, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2), (32, 128, 8, 2)],
    "dq": [(128, 64, 8, 2), (128, 32, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2), (128, 16, 8, 3), (64, 16, 4, 4)],
}


def time_config(q, k, v, do, cfg):
    from triton.testing import do_bench

    attn.attention_configs = lambda D, DV, dtype: cfg
    with torch.no_grad():
        attn.parallel_attn(q, k, v)
        fwd = do_bench(lambda: attn.parallel_attn(q, k, v), warmup=25, rep=200, return_mode="median")
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def fwd_bwd():
        attn.parallel_attn(*leaves).backward(do)

    fwd_bwd()
    both = do_bench(fwd_bwd, warmup=25, rep=200, grad_to_none=leaves, return_mode="median")
    return fwd, both


def time_sdpa(q, k, v, do):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def call(*args):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(*args, is_causal=True)

    with torch.no_grad():
        fwd = do_bench(lambda: call(qt, kt, vt), warmup=25, rep=200, return_mode="median")
    leaves = [t.detach().requires_grad_(True) for t in (qt, kt, vt)]
    dot = do.transpose(1, 2)
    both = do_bench(lambda: call(*leaves).backward(dot), warmup=25, rep=200, grad_to_none=leaves, return_mode="median")
    return fwd, both


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(VARIANTS), help="sweep one kernel's blocks only")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--d", type=int, default=128, help="head dim")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, args.d, device="cuda", dtype=dtype) for _ in range(4))
    flops = 2 * 2 * B * H * T * T * args.d / 2
    default = attn.attention_configs(args.d, args.d, dtype)
    variants = [("default", default)]
    for kernel, blocks in VARIANTS.items():
        if args.only and kernel != args.only:
            continue
        for b in blocks:
            variants.append((f"{kernel} {b}", dataclasses.replace(default, **{kernel: attn.Blocks(*b)})))
    rows = []
    sdpa = time_sdpa(q, k, v, do)
    print(f"{'variant':28s} {'fwd ms':>8s} {'TFLOP/s':>8s} {'fwd+bwd ms':>11s} {'TFLOP/s':>8s}")
    print(f"{'sdpa flash':28s} {sdpa[0]:8.3f} {flops / sdpa[0] / 1e9:8.0f} {sdpa[1]:11.3f} {3.5 * flops / sdpa[1] / 1e9:8.0f}",
          flush=True)
    rows.append({"variant": "sdpa flash", "fwd_ms": sdpa[0], "fwd_bwd_ms": sdpa[1]})
    for name, cfg in variants:
        try:
            fwd, both = time_config(q, k, v, do, cfg)
        except Exception as e:  # noqa: BLE001 - reported per variant
            print(f"{name:28s} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200], flush=True)
            rows.append({"variant": name, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        print(f"{name:28s} {fwd:8.3f} {flops / fwd / 1e9:8.0f} {both:11.3f} {3.5 * flops / both / 1e9:8.0f}", flush=True)
        rows.append({"variant": name, "fwd_ms": fwd, "fwd_bwd_ms": both, "config": dataclasses.asdict(cfg)})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "D": args.d, "dtype": args.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
