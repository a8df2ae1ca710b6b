# source: found by the suite: the sanitizer mode's small shapes (FLA_SMALL_SHAPES) ran chunk_delta_rule's wide_values case natively on an H100 and an H200
# seen-on: sm90
# expect: pass
# op: chunk_delta_rule
# needs: gpu
"""bf16 at narrow key heads (K = 16, a 32-wide key block half masked) and a value dim of
392 (the last 64-wide value block 8 wide): on sm90 (H100 and H200, Triton 3.6) dk and
dbeta came out wrong, relative RMS 0.69 and 0.73 against the float64 recurrence, while dq,
dv, the output and the same call in fp32 were right; K = 32 at the same V ended in an
illegal memory access. The GPU-sized cases (K = 256) were right, so only runs at the
small shapes saw it. Every output and gradient must match the float64 recurrence within
the bf16 budget (docs/tolerances.md)."""

import torch

from kernels import chunk_delta_rule
from pytest_fla.checks.tolerance import assert_close
from pytest_fla.repro_helpers import session_device
from reference.delta import delta_rule

device = session_device()
gen = torch.Generator().manual_seed(0)


def draw(*shape):
    return torch.randn(shape, generator=gen, dtype=torch.float64)


for K in (16, 32):
    B, T, H, V = 1, 80, 1, 392
    q, v = draw(B, T, H, K), draw(B, T, H, V)
    k = torch.nn.functional.normalize(draw(B, T, H, K), dim=-1)
    beta = torch.sigmoid(draw(B, T, H))
    h0 = draw(B, H, K, V)
    do, dht = draw(B, T, H, V), draw(B, H, K, V)
    exact = [x.to(torch.bfloat16).double().requires_grad_(True) for x in (q, k, v, beta)] + [h0.clone().requires_grad_(True)]
    o_ref, ht_ref = delta_rule(*exact[:4], initial_state=exact[4], output_final_state=True)
    ref_grads = torch.autograd.grad((o_ref, ht_ref), exact, (do, dht))
    ours = [x.to(device, torch.bfloat16).requires_grad_(True) for x in (q, k, v, beta)] + [h0.to(device, torch.float32).requires_grad_(True)]
    o, ht = chunk_delta_rule(*ours[:4], initial_state=ours[4], output_final_state=True)
    grads = torch.autograd.grad((o, ht), ours, (do.to(device, o.dtype), dht.to(device, ht.dtype)))
    assert_close(f"K={K}: o", o.cpu(), o_ref, "bf16")
    for name, g, g_ref in zip(("q", "k", "v", "beta", "initial_state"), grads, ref_grads):
        assert_close(f"K={K}: d{name}", g.cpu(), g_ref, "bf16", "backward")
