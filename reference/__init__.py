"""Float64 reference implementations of every op, the ground truth for the kernels.

Plain PyTorch, step by step as in docs/ops.md. Every function upcasts its floating inputs to
float64 (staying in the autograd graph, so gradients reach the caller's tensors), computes
on the inputs' device and returns float64. Recurrent ops return (o, final_state), with
final_state None unless output_final_state=True.
"""
from .attention import attention
from .conv import causal_conv1d
from .delta import dplr_delta_rule, delta_rule, gated_delta_rule, kda, rwkv7
from .layers import gated_delta_net
from .linear import gla, hgrn, linear_attn, retention, rwkv6, simple_gla
from .norm import l2norm, rms_norm, rms_norm_gated
from .rotary import apply_rotary, rotary_embedding

__all__ = [
    "apply_rotary",
    "attention",
    "causal_conv1d",
    "delta_rule",
    "dplr_delta_rule",
    "gated_delta_net",
    "gated_delta_rule",
    "gla",
    "hgrn",
    "kda",
    "l2norm",
    "linear_attn",
    "retention",
    "rms_norm",
    "rms_norm_gated",
    "rotary_embedding",
    "rwkv6",
    "rwkv7",
    "simple_gla",
]
