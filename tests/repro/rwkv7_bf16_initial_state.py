# source: user report: chunk_rwkv7 refused a bf16 initial state (TypeError: initial_state must have dtype float32), the state cache a model keeps in its activations' dtype
# seen-on: sm90 and the CPU interpreter
# expect: pass
# op: chunk_rwkv7
# needs: device
"""The report's call, with its bf16 zero state, then a random bf16 state: each must give
what the same values as a float32 state give. The kernels read the state as float32, so
the outputs, the final state and every input gradient are bitwise those of the float32
call, and the state's gradient is that call's rounded to bf16 (by the device's rounding)."""

import torch
import torch.nn.functional as F

from kernels import chunk_rwkv7
from pytest_fla.repro_helpers import session_device

device = session_device()
B, T, H, DH = (2, 1024, 4, 64) if device == "cuda" else (2, 40, 2, 16)
gen = torch.Generator().manual_seed(0)


def draw(*shape):
    return torch.randn(shape, generator=gen)


r, k, v = (draw(B * T, H, DH).view(1, B * T, H, DH).to(device, torch.bfloat16) for _ in range(3))
kk = F.normalize(draw(1, B * T, H, DH), dim=-1)
w = (-torch.exp(torch.tensor(-0.5)) * torch.sigmoid(draw(1, B * T, H, DH))).to(device, torch.bfloat16)
a, b = (-kk).to(device, torch.bfloat16), (kk * torch.sigmoid(draw(1, B * T, H, DH))).to(device, torch.bfloat16)
cu_seqlens = torch.tensor([0, T, 2 * T], dtype=torch.int64, device=device)

# the report's code
s0 = torch.zeros(B, H, DH, DH, device=device, dtype=torch.bfloat16)
o, ht = chunk_rwkv7(r=r, w=w, k=k, v=v, a=a, b=b, scale=1.0, cu_seqlens=cu_seqlens,
                    initial_state=s0, output_final_state=True)
o32, ht32 = chunk_rwkv7(r=r, w=w, k=k, v=v, a=a, b=b, scale=1.0, cu_seqlens=cu_seqlens,
                        initial_state=s0.float(), output_final_state=True)
assert ht.dtype == torch.float32, ht.dtype
assert torch.equal(o, o32) and torch.equal(ht, ht32), "a bf16 zero state differs from a float32 one"


def forward_backward(state):
    inputs = [t.detach().requires_grad_(True) for t in (r, w, k, v, a, b, state)]
    out = chunk_rwkv7(*inputs[:6], scale=1.0, cu_seqlens=cu_seqlens, initial_state=inputs[6], output_final_state=True)
    upstream = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(x.shape, generator=upstream).to(device, x.dtype) for x in out]
    return out, torch.autograd.grad(out, inputs, cotangents)


state = draw(B, H, DH, DH).to(device, torch.bfloat16)
(o, ht), grads = forward_backward(state)
(o32, ht32), grads32 = forward_backward(state.float())
assert torch.equal(o, o32) and torch.equal(ht, ht32), "a bf16 state gives other outputs than its float32 values"
for name, g, g32 in zip(("r", "w", "k", "v", "a", "b"), grads, grads32):
    assert torch.equal(g, g32), f"d{name} differs between a bf16 state and its float32 values"
ds0, ds0_32 = grads[-1], grads32[-1]
assert ds0.dtype == torch.bfloat16, f"the state's gradient is {ds0.dtype}, not the state's bf16"
# a GPU rounds float32 to bf16 to nearest even, as torch does; Triton's interpreter rounds toward zero
rounded = ds0_32.to(torch.bfloat16) if device == "cuda" else (ds0_32.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
assert torch.equal(ds0, rounded), "the bf16 state's gradient is not the float32 one rounded"
print(f"bf16 state == float32 state on {device}: o {tuple(o.shape)}, final state {ht.dtype}, d state {ds0.dtype}")
