# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_forward[parallel_attn-fp32-causal_gqa] and [parallel_attn-bf16-d256], OutOfResources on 0.6.0 (H200)
# seen-on: sm90
# expect: pass
# op: parallel_attn
# needs: gpu
# requires: fla-core
# found-in: 0.3.2 to 0.6.0, on an H200: this file on 0.3.2 and 0.6.0, its calls on every release
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's parallel_attn asks for more shared memory than an H200 has (232448 bytes an
SM) at head dims it accepts: fp32 at K = 128 (262144 bytes) and bf16 / fp16 at K = 256
(262144; the op's own check allows up to 256: "The key dimension can not be larger than
256"), so a valid call fails with triton's OutOfResources instead of running. fp32 at K = 64
and bf16 at K = 128 run."""

import torch
from fla.ops.attn import parallel_attn

torch.manual_seed(0)
failed = []
for dtype, K in ((torch.float32, 128), (torch.bfloat16, 256)):
    q = torch.randn(1, 256, 4, K, device="cuda", dtype=dtype)
    k, v = (torch.randn(1, 256, 2, K, device="cuda", dtype=dtype) for _ in range(2))
    try:
        parallel_attn(q, k, v)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - triton's OutOfResources has no common base but Exception
        failed.append(f"{dtype} K = {K}: {type(error).__name__}: {str(error).splitlines()[0]}")
assert not failed, "\n".join(failed)
