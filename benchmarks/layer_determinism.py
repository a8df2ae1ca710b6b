"""Which stage of the GatedDeltaNet layer differs between two identical bf16 runs.

    python benchmarks/layer_determinism.py

Runs the layer's steps (``kernels/layers/gated_deltanet.py``) twice on the same inputs,
at the layer spec's GPU sizes, and prints for each intermediate whether the two runs
agree bit for bit.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import causal_conv1d, chunk_gated_delta_rule, rms_norm_gated  # noqa: E402
from pytest_fla.specs.layers import GATED_DELTA_NET  # noqa: E402


def stages(kw):
    x, H, HV = kw["x"], kw["num_heads"], kw["num_v_heads"]
    B, T, _ = x.shape
    out = {}
    for name in ("q", "k", "v"):
        out[f"{name}_proj"] = F.linear(x, kw[f"{name}_weight"])
        out[f"{name}_conv"] = causal_conv1d(out[f"{name}_proj"], kw[f"{name}_conv_weight"], activation="silu")[0]
    q, k = out["q_conv"].view(B, T, H, -1), out["k_conv"].view(B, T, H, -1)
    v = out["v_conv"].view(B, T, HV, -1)
    out["beta"] = torch.sigmoid(F.linear(x, kw["b_weight"]))
    out["g"] = -kw["A_log"].float().exp() * F.softplus(F.linear(x, kw["a_weight"]).float() + kw["dt_bias"].float())
    out["o"] = chunk_gated_delta_rule(q, k, v, out["g"], out["beta"], use_qk_l2norm_in_kernel=True)[0]
    out["norm"] = rms_norm_gated(out["o"], F.linear(x, kw["g_weight"]).view(out["o"].shape), kw["norm_weight"], eps=1e-5)
    out["y"] = F.linear(out["norm"].reshape(B, T, -1), kw["o_weight"])
    return out


kw = GATED_DELTA_NET.sample(GATED_DELTA_NET.cases[0], "bf16", "cuda", seed=1).kwargs
first, second = stages(kw), stages(kw)
for name in first:
    same = torch.equal(first[name], second[name])
    print(f"{name:10s} {'same' if same else 'DIFFERS'}")
