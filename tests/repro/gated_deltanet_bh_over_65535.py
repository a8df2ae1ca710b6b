# source: user report against flash-linear-attention: GatedDeltaNet (hidden 128, 6 heads of 16) at batch 10923 fails with "invalid argument" (docs/ops.md, Layers)
# seen-on: sm90
# expect: pass
# expect-sm75: raises NotImplementedError: sm80
# op: gated_delta_net
# needs: compiler
# plain-under-sanitizer: the layer's forward and backward launch over 65535 programs several times, for minutes under each tool (all four did not finish in 545 s on an H100); its plain run checks the grid
"""The layer at B = 10923 with 6 heads: B * H = 65538 went onto grid axis 1, which CUDA
caps at 65535, and the bf16 forward and backward failed with "invalid argument".

On a GPU the report's code runs for real, and the last batch row (whose programs sit past
65535) is checked against a batch of one. Where no GPU runs the target (compile-only),
every launch of the same forward and backward (training: chunked kernels; inference:
the fused-recurrent one) is captured, its grid checked against CUDA's limits, and each
kernel compiled for the session's arch. The interpreter could not run this batch in
reasonable time, so that session skips it."""

import torch

from kernels.layers import GatedDeltaNet
from pytest_fla.repro_helpers import session_device, target_arch

B, T = 10923, 32
device = session_device()
torch.manual_seed(0)
layer = GatedDeltaNet(hidden_size=128, head_dim=16, num_heads=6).to(device, torch.bfloat16)
assert B * layer.num_heads > 65535
x = torch.randn(B, T, 128, device=device, dtype=torch.bfloat16, requires_grad=True)


def forward_backward(inputs):
    y = layer.train()(inputs)
    y.backward(torch.ones_like(y))
    return y


if device == "cuda":
    y = forward_backward(x)
    with torch.no_grad():
        y_eval = layer.eval()(x)
    torch.cuda.synchronize()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(y_eval).all()
    # the last row, whose programs lie past 65535, against a batch of one
    last = x[-1:].detach().clone().requires_grad_(True)
    grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad()
    y_last = forward_backward(last)
    assert torch.allclose(y[-1:].float(), y_last.float(), atol=2e-2, rtol=2e-2), "last row's output differs"
    assert torch.allclose(x.grad[-1:].float(), last.grad.float(), atol=2e-2, rtol=2e-2), "last row's dx differs"
    with torch.no_grad():
        assert torch.allclose(y_eval[-1:].float(), layer.eval()(last).float(), atol=2e-2, rtol=2e-2)
    assert all(torch.isfinite(g).all() for g in grads.values()), "a parameter gradient is not finite"
else:
    from pytest_fla.checks.capture import MAX_GRID, assert_compiles, capture_launches

    arch = target_arch()
    with capture_launches(arch) as recorder:
        forward_backward(x)
        with torch.no_grad():
            layer.eval()(x)
    names = {launch.name for launch in recorder.launches}
    assert any("chunk" in n or "state" in n for n in names) and any("fused_recurrent" in n for n in names), names
    for launch in recorder.launches:
        assert launch.grid[1] <= MAX_GRID[1] and launch.grid[2] <= MAX_GRID[2], f"{launch.name}: grid {launch.grid}"
    print(assert_compiles(recorder.launches, arch).summary())
