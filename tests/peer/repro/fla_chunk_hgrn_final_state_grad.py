# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_backward[chunk_hgrn-fp32-state], dx / dg rel RMS 1.6e-2 (H200), worst at the last token; probed on an H200: with the output's gradient zero and the final state's not, dx and dg come out zero
# seen-on: sm90
# expect: pass
# op: chunk_hgrn
# needs: gpu
# requires: fla-core
# found-in: 0.3.2 to 0.6.0 (this file on an H200, each release, 2026-12-04)
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's chunk_hgrn drops the gradient that flows back through the final state: with
the output's gradient zero and the final state's not, dx and dg come out zero, against
autograd through a float64 loop of the same recurrence (h_t = e^{g_t} h_{t-1} + x_t,
o_t = h_t). fused_recurrent_hgrn gets both right (relative error 5e-8 in the same probe).
Triton's CPU interpreter cannot run chunk_hgrn's kernels."""

import torch
import torch.nn.functional as F
from fla.ops.hgrn import chunk_hgrn

torch.manual_seed(0)
B, T, D = 1, 64, 32
x = torch.randn(B, T, D, device="cuda", requires_grad=True)
g = F.logsigmoid(torch.randn(B, T, D, device="cuda")).requires_grad_()
o, final = chunk_hgrn(x, g, output_final_state=True)
dfinal = torch.randn_like(final)
grads = torch.autograd.grad((o, final), (x, g), (torch.zeros_like(o), dfinal))

x64, g64 = (t.detach().double().requires_grad_() for t in (x, g))
h, outputs = torch.zeros(B, D, dtype=torch.float64, device="cuda"), []
for t in range(T):
    h = g64[:, t].exp() * h + x64[:, t]
    outputs.append(h)
grads64 = torch.autograd.grad((torch.stack(outputs, 1), h), (x64, g64), (torch.zeros_like(o).double(), dfinal.double()))
for name, got, want in zip(("dx", "dg"), grads, grads64):
    error = ((got.double() - want).norm() / want.norm()).item()
    assert error <= 1e-4, f"{name} relative RMS error {error:.3g} with the final state's gradient alone"
