"""Whether chunk_gated_delta_rule's forward time depends on its inputs' values: the
bench's gates (``logsigmoid(x) / 8``) against the GatedDeltaNet layer's
(``-e^{A_log} softplus(x + dt_bias)``, ``A`` up to 16: strong decay), with and without
the l2 norm in the kernel. The GatedDeltaNet layer's ``prepare_wy_kernel`` took 0.53 ms where
the bench's took 0.21 at the same sizes (``side_profile.py``).

    python benchmarks/gate_strength_probe.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402

B, T, H, K = 4, 4096, 16, 128


def inputs(layer_gates: bool, unit_k: bool):
    dev = "cuda"
    bf = torch.bfloat16
    q, k, v = (torch.randn(B, T, H, K, device=dev).to(bf) for _ in range(3))
    if unit_k:
        k = F.normalize(k.float(), dim=-1).to(bf)
    x = torch.randn(B, T, H, device=dev)
    if layer_gates:
        A = torch.empty(H, device=dev).uniform_(1, 16)
        g = -A * F.softplus(x + torch.rand(H, device=dev) * 0.1)
    else:
        g = F.logsigmoid(x) / 8
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(bf)
    return q, k, v, g, beta


def main():
    print("gates, l2norm in kernel: forward ms (do_bench median); prepare_wy_kernel ms (profiler)")
    for layer_gates in (False, True):
        for l2 in (False, True):
            q, k, v, g, beta = inputs(layer_gates, unit_k=not l2)
            fn = lambda: kernels.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=l2)  # noqa: E731
            with torch.no_grad():
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                from torch.profiler import ProfilerActivity, profile
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
            kern = {e.key[:40]: round((getattr(e, "device_time_total", 0) or e.cuda_time_total) / 5e3, 3)
                    for e in prof.key_averages() if "kernel" in e.key}
            print(f"{'layer' if layer_gates else 'bench'} gates, l2norm {l2}: {ms:.3f} ms; {kern}")


if __name__ == "__main__":
    main()
