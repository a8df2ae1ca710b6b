# source: user report against flash-linear-attention: chunk_rwkv7 called with cu_seqlens aborted the whole process inside Triton's compiler (an MMA-layout assertion), on one GPU generation only
# seen-on: one GPU generation, not named in the report
# expect: pass
# op: chunk_rwkv7
# needs: compiler
"""The report's call: B = 1, T = 4096, H = 2, D = 128, bf16, ``cu_seqlens = [0, T]``,
a zero initial state, the final state asked for. A compiler assertion takes the process
down with it, so this runs in a process of its own on every arch target: where the
session's GPU runs the target it calls the op forward and backward and checks it against
the fused-recurrent kernel; elsewhere it compiles every launch of that call for the
target offline (``capture_launches``), which is where the abort happened."""

import torch
import torch.nn.functional as F

from kernels import chunk_rwkv7, fused_recurrent_rwkv7
from pytest_fla.checks.capture import assert_compiles, capture_launches
from pytest_fla.repro_helpers import session_device, target_arch
from pytest_fla.checks.tolerance import assert_close

B, T, H, D = 1, 4096, 2, 128


def inputs(device):
    gen = torch.Generator().manual_seed(0)
    shape = (B, T, H, D)
    r, k, v = (torch.randn(shape, generator=gen) for _ in range(3))
    kk = F.normalize(torch.randn(shape, generator=gen), dim=-1)
    w = -torch.exp(torch.tensor(-0.5)) * torch.sigmoid(torch.randn(shape, generator=gen))
    a, b = -kk, kk * torch.sigmoid(torch.randn(shape, generator=gen))
    args = dict(r=r, w=w, k=k, v=v, a=a, b=b)
    args = {n: x.to(device, torch.bfloat16).requires_grad_(True) for n, x in args.items()}
    initial_state = torch.zeros(B, H, D, D, device=device, requires_grad=True)
    cu_seqlens = torch.tensor([0, T], dtype=torch.int64, device=device)
    return args, initial_state, cu_seqlens


def call(op, device):
    args, initial_state, cu_seqlens = inputs(device)
    o, ht = op(**args, initial_state=initial_state, output_final_state=True, cu_seqlens=cu_seqlens)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    grads = torch.autograd.grad([o, ht], [*args.values(), initial_state], [do.to(device, o.dtype), dht.to(device)])
    return o, ht, grads


device = session_device()
if device == "cuda":
    o, ht, grads = call(chunk_rwkv7, device)
    o2, ht2, grads2 = call(fused_recurrent_rwkv7, device)
    torch.cuda.synchronize()
    assert_close("o: chunk vs fused_recurrent", o, o2.double(), "bf16", "agreement")
    assert_close("final state: chunk vs fused_recurrent", ht, ht2.double(), "bf16", "agreement")
    for name, g, g2 in zip(("r", "w", "k", "v", "a", "b", "initial_state"), grads, grads2):
        assert_close(f"d{name}: chunk vs fused_recurrent", g, g2.double(), "bf16", "backward")
else:
    arch = target_arch()
    with capture_launches(arch) as recorder:
        if arch < 80:
            # the chunked DPLR kernels need sm80 (kernels/_arch.py): below it the op must
            # refuse by name before any launch, not reach the compiler
            try:
                call(chunk_rwkv7, "cpu")
            except NotImplementedError as refusal:
                assert "needs sm80 or newer" in str(refusal) and not recorder.launches, refusal
                print(f"sm{arch}: refused before any launch: {refusal}")
            else:
                raise AssertionError(f"chunk_rwkv7 ran on sm{arch}, below the sm80 it needs")
        else:
            call(chunk_rwkv7, "cpu")
    if arch >= 80:
        print(assert_compiles(recorder.launches, arch).summary())
