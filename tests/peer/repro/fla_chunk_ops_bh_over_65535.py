# source: the conformance suite over fla-core's releases (benchmarks/peer_history.py): test_huge_grid[<op>], "invalid argument" in nine chunked ops and parallel_attn on 0.6.0 (H200)
# seen-on: sm90
# expect: pass
# op: chunk_gla
# needs: gpu
# requires: fla-core
# found-in: 0.3.2 to 0.6.0, every op here (chunk_kda from 0.4.0, its first release), on an H200: this file on 0.3.2 and 0.6.0, its calls one op a process on every release
# fixed-in: none (0.6.0, the newest release, has it)
"""fla-core's chunked ops and parallel_attn with B * H = 10923 * 6 = 65538: each puts the
batch and heads on a grid axis that CUDA caps at 65535, and the launch fails ("Triton Error
[CUDA]: invalid argument") on a valid input. Each op's last batch row is checked against a
batch of one; every op is tried, the ones that fail named at the end. (fused_recurrent_gla
had the same fault up to 0.5.2: fla_fused_recurrent_gla_bh_over_65535.py.)"""

import importlib

import torch
import torch.nn.functional as F

torch.manual_seed(0)
B, T, H, K = 10923, 32, 6, 16  # B * H = 65538


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def log_gate(*shape):
    return F.logsigmoid(torch.randn(*shape, device="cuda")).to(torch.bfloat16)


q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, K)
unit_k = F.normalize(k.float(), dim=-1).to(torch.bfloat16)
beta = torch.rand(B, T, H, device="cuda", dtype=torch.bfloat16)
CALLS = {
    "chunk_gla": ("fla.ops.gla", dict(q=q, k=k, v=v, g=log_gate(B, T, H, K))),
    "chunk_simple_gla": ("fla.ops.simple_gla", dict(q=q, k=k, v=v, g=log_gate(B, T, H))),
    "chunk_retention": ("fla.ops.retention", dict(q=q, k=k, v=v)),
    "chunk_linear_attn": ("fla.ops.linear_attn", dict(q=q, k=k, v=v, normalize=False)),
    "chunk_delta_rule": ("fla.ops.delta_rule", dict(q=q, k=unit_k, v=v, beta=beta)),
    "chunk_gated_delta_rule": ("fla.ops.gated_delta_rule", dict(q=q, k=unit_k, v=v, g=log_gate(B, T, H), beta=beta)),
    "chunk_kda": ("fla.ops.kda", dict(q=q, k=unit_k, v=v, g=log_gate(B, T, H, K), beta=beta)),
    "chunk_rwkv6": ("fla.ops.rwkv6", dict(r=q, k=k, v=v, w=log_gate(B, T, H, K), u=randn(H, K))),
    "chunk_rwkv7": ("fla.ops.rwkv7", dict(r=q, w=log_gate(B, T, H, K), k=k, v=v, a=-unit_k, b=unit_k * 0.5,
                                          output_final_state=False)),
    "chunk_dplr_delta_rule": ("fla.ops.generalized_delta_rule", dict(q=q, k=k, v=v, a=-unit_k, b=unit_k * 0.5,
                                                                     gk=log_gate(B, T, H, K))),
    "parallel_attn": ("fla.ops.attn", dict(q=q, k=k, v=v)),
}


def output(result):
    return result[0] if isinstance(result, tuple) else result


failed = {}
for name, (module, kwargs) in CALLS.items():
    try:
        op = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        continue  # a release without the op (chunk_kda before 0.4.0)
    try:
        o = output(op(**kwargs))
        torch.cuda.synchronize()
    except RuntimeError as error:
        failed[name] = str(error).splitlines()[0]
        continue
    last = output(op(**{n: t[-1:] if t.dim() == 4 and t.shape[0] == B else t for n, t in kwargs.items()}))
    error = ((o[-1:].float() - last.float()).norm() / last.float().norm()).item()
    if error > 1e-2:
        failed[name] = f"the last batch row differs from a batch of one (relative error {error:.3g})"
assert not failed, "at B * H = 65538:\n" + "\n".join(f"  {name}: {why}" for name, why in failed.items())
