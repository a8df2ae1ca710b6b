# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_backward[causal_conv1d-...-width3_short], rel RMS 1.2 on 0.5.2
# seen-on: sm90
# expect: pass
# op: causal_conv1d
# needs: gpu
# requires: fla-core
"""fla-core's causal_conv1d backward with a sequence shorter than the window less one
(T = 2, W = 4): the input gradient against autograd through a float64 depthwise conv."""

import torch
import torch.nn.functional as F
from fla.modules.convolution import causal_conv1d

torch.manual_seed(0)
B, T, D, W = 1, 2, 64, 4
x = torch.randn(B, T, D, device="cuda", requires_grad=True)
weight = torch.randn(D, W, device="cuda")
y = causal_conv1d(x, weight)
y = y[0] if isinstance(y, tuple) else y
dy = torch.randn_like(y)
(dx,) = torch.autograd.grad(y, x, dy)

x64 = x.detach().double().cpu().requires_grad_()
y64 = F.conv1d(F.pad(x64.transpose(1, 2), (W - 1, 0)), weight.double().cpu().unsqueeze(1), groups=D).transpose(1, 2)
(dx64,) = torch.autograd.grad(y64, x64, dy.double().cpu())
assert (y.double().cpu() - y64).norm() <= 1e-4 * y64.norm(), "the forward is off"
error = ((dx.double().cpu() - dx64).norm() / dx64.norm()).item()
assert error <= 1e-4, f"dx relative RMS error {error:.3g} for T = {T} < W - 1 = {W - 1}"
