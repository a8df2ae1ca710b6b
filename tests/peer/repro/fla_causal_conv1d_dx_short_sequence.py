# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_backward[causal_conv1d-fp32-width3_short], dx rel RMS 2.05 on 0.5.2
# seen-on: interpreter
# expect: pass
# op: causal_conv1d
# needs: device
# requires: fla-core
# found-in: 0.3.2 to 0.5.2 (this file on an H200, each release; 0.4.2 to 0.5.2 under the CPU interpreter too)
# fixed-in: 0.6.0
"""fla-core's causal_conv1d with a sequence shorter than its window less one (T = 1,
W = 3), an initial state and the final state asked for: the gradients that flow back
through the final state (which holds the initial state's last inputs when T < W - 1) come
out wrong in dx and d(initial_state), against autograd through a float64 depthwise conv.
Smallest case found by hand: B = T = D = 1 shows it too. On a GPU its autotuned configs
decide whether the faulty path runs (the H200 showed it on 0.5.2 in one run, not in another).
"""

import contextlib

import torch
import torch.nn.functional as F
from fla.modules.convolution import causal_conv1d

from pytest_fla.repro_helpers import session_device

if not hasattr(torch.cpu, "device"):  # the CPU has none; fla-core <= 0.5.0 enters one around each call
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
device = session_device()
torch.manual_seed(0)
B, T, D, W = 1, 1, 4, 3
x = torch.randn(B, T, D, device=device, requires_grad=True)
weight = torch.randn(D, W, device=device)
state = torch.randn(B, D, W - 1, device=device, requires_grad=True)  # the last W - 1 inputs
# the peer keeps the last W inputs as its state, the oldest never read: a zero column in front
y, final = causal_conv1d(x, weight, initial_state=F.pad(state, (1, 0)), output_final_state=True)
dy, dfinal = torch.randn_like(y), torch.randn_like(final)
dx, dstate = torch.autograd.grad((y, final), (x, state), (dy, dfinal))

x64 = x.detach().double().cpu().requires_grad_()
state64 = state.detach().double().cpu().requires_grad_()
window = torch.cat([state64, x64.transpose(1, 2)], -1)  # [B, D, W - 1 + T]
y64 = F.conv1d(window, weight.double().cpu().unsqueeze(1), groups=D).transpose(1, 2)
final64 = F.pad(window, (1, 0))[..., -W:]
dx64, dstate64 = torch.autograd.grad((y64, final64), (x64, state64), (dy.double().cpu(), dfinal.double().cpu()))


def rel(a, b):
    return ((a.double().cpu() - b).norm() / b.norm()).item()


assert rel(y, y64) <= 1e-4 and rel(final, final64) <= 1e-4, "the forward is off"
assert rel(dx, dx64) <= 1e-4, f"dx relative RMS error {rel(dx, dx64):.3g} for T = {T} < W - 1 = {W - 1}"
assert rel(dstate, dstate64) <= 1e-4, f"d(initial_state) relative RMS error {rel(dstate, dstate64):.3g}"
