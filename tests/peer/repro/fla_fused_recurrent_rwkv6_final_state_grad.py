# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_backward[fused_recurrent_rwkv6-fp32-state], dk / dv rel RMS 0.21 on 0.6.0 (H200), worst at the last tokens
# seen-on: sm90
# expect: pass
# op: fused_recurrent_rwkv6
# needs: device
# requires: fla-core
# found-in: 0.3.2 to 0.6.0 (this file on an H200, each release; 0.4.2 to 0.6.0 under the CPU interpreter too)
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's fused_recurrent_rwkv6 drops the gradient that flows back through the final
state: with the output's gradient zero and the final state's not, every input gradient
comes out zero (dk, dv, dw, d(initial_state)), against autograd through a float64 loop of
the same recurrence. The forward and the output's own gradients are right. Smallest case:
one sequence of three tokens, one head, K = V = 4."""

import contextlib

import torch
from fla.ops.rwkv6 import fused_recurrent_rwkv6

from pytest_fla.repro_helpers import session_device

if not hasattr(torch.cpu, "device"):  # the CPU has none; fla-core <= 0.5.0 enters one around each call
    torch.cpu.device = lambda index=None: contextlib.nullcontext()
device = session_device()
torch.manual_seed(0)
B, T, H, K, V = 1, 3, 1, 4, 4
r, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
w = -torch.exp(torch.randn(B, T, H, K))  # log decay
v, u, h0 = torch.randn(B, T, H, V), torch.randn(H, K), torch.randn(B, H, K, V)
leaves = [t.to(device).requires_grad_() for t in (r, k, v, w, u, h0)]
o, ht = fused_recurrent_rwkv6(*leaves[:5], scale=1.0, initial_state=leaves[5], output_final_state=True)
dht = torch.randn_like(ht)
grads = torch.autograd.grad((o, ht), leaves, (torch.zeros_like(o), dht))

# o_t = (S_{t-1} + diag(u) k_t v_t^T)^T r_t,  S_t = diag(e^{w_t}) S_{t-1} + k_t v_t^T
ref = [t.double().requires_grad_() for t in (r, k, v, w, u, h0)]
r64, k64, v64, w64, u64, S = ref
S = S[0, 0]
outs = []
for t in range(T):
    kt, vt = k64[0, t, 0], v64[0, t, 0]
    outs.append((S + (u64[0] * kt)[:, None] * vt[None, :]).T @ r64[0, t, 0])
    S = w64[0, t, 0].exp()[:, None] * S + kt[:, None] * vt[None, :]
grads64 = torch.autograd.grad((torch.stack(outs)[None, :, None], S[None, None]), ref,
                              (torch.zeros(B, T, H, V, dtype=torch.float64), dht.double().cpu()), allow_unused=True)

for name, got, want in zip(("dk", "dv", "dw", "d(initial_state)"), grads[1:4] + grads[5:], grads64[1:4] + grads64[5:]):
    error = ((got.double().cpu() - want).norm() / want.norm()).item()
    assert error <= 1e-4, f"{name} relative RMS error {error:.3g} with the final state's gradient alone"
