# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_backward[chunk_hgrn-fp32-state], d(initial_state) wrong (H200); probed on an H200: chunk_hgrn returns no gradient at all for an initial state that requires one
# seen-on: sm90
# expect: pass
# op: chunk_hgrn
# needs: gpu
# requires: fla-core
# found-in: 0.3.2 to 0.6.0 (this file on an H200, each release, 2026-12-04)
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's chunk_hgrn takes an initial state that requires a gradient and gives it none:
autograd's gradient for it is None (zero), where the output depends on it
(h_t = e^{g_t} h_{t-1} + x_t from h_0 = initial_state). fused_recurrent_hgrn returns it
(relative error 7e-8 in the same probe). Triton's CPU interpreter cannot run chunk_hgrn."""

import torch
import torch.nn.functional as F
from fla.ops.hgrn import chunk_hgrn

torch.manual_seed(0)
B, T, D = 1, 64, 32
x = torch.randn(B, T, D, device="cuda")
g = F.logsigmoid(torch.randn(B, T, D, device="cuda"))
h0 = torch.randn(B, D, device="cuda", requires_grad=True)
o, _ = chunk_hgrn(x, g, initial_state=h0, output_final_state=True)
do = torch.randn_like(o)
(got,) = torch.autograd.grad(o, h0, do, allow_unused=True)

h064 = h0.detach().double().requires_grad_()
h, outputs = h064, []
for t in range(T):
    h = g[:, t].double().exp() * h + x[:, t].double()
    outputs.append(h)
(want,) = torch.autograd.grad(torch.stack(outputs, 1), h064, do.double())
assert got is not None, "d(initial_state) is None: no gradient for an initial state that requires one"
error = ((got.double() - want).norm() / want.norm()).item()
assert error <= 1e-4, f"d(initial_state) relative RMS error {error:.3g}"
