"""Layers as compositions of the references: GatedDeltaNet.

The float64 ground truth for ``kernels.layers``: the same steps, each the reference of the
kernel the layer uses, with the projections in float64 too.

``activation_dtype`` (bf16 or fp16) rounds the composition where the layer hands a tensor
of that dtype from one op to the next, the values going forward and their gradients coming
back (``round_to``), and nowhere else: every step is still computed in float64. Against
that reference each op of the layer is held to its own error budget; against the plain one
the budget of a single kernel would have to cover the rounding of every activation the layer
stores as well, which at small sizes it does not (docs/tolerances.md, "Layers").
"""
import torch
import torch.nn.functional as F


class _RoundTo(torch.autograd.Function):
    """x rounded to ``dtype`` and back; its gradient likewise."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(grad.dtype), None


def round_to(x, dtype):
    """``x`` as a layer holding it in ``dtype`` sees it (identity for None)."""
    return x if dtype is None else _RoundTo.apply(x, dtype)

from .conv import causal_conv1d
from .delta import gated_delta_rule
from .norm import l2norm, rms_norm, rms_norm_gated


def gated_delta_net(x, q_weight, k_weight, v_weight, a_weight, b_weight, A_log, dt_bias,
                    q_conv_weight, k_conv_weight, v_conv_weight, o_weight, g_weight=None, norm_weight=None,
                    num_heads=1, num_v_heads=None, norm_eps=1e-5, allow_neg_eigval=False, mode="chunk",
                    cu_seqlens=None, cu_seqlens_cpu=None, activation_dtype=None):
    """GatedDeltaNet (``kernels.layers.gated_delta_net``): ``mode`` and ``cu_seqlens_cpu``
    choose kernels there and change nothing here; ``activation_dtype``: the module docstring.

        q = l2norm(silu(conv(x W_q^T))), k likewise, v = silu(conv(x W_v^T))
        g = -exp(A_log) softplus(x W_a^T + dt_bias), beta = sigmoid(x W_b^T) (x2 if allow_neg_eigval)
        y = rms_norm_gated(gated_delta_rule(q, k, v, g, beta), x W_g^T, norm_weight) W_o^T
    """
    del mode, cu_seqlens_cpu
    x = x.double()
    B, T, _ = x.shape
    H = num_heads
    HV = H if num_v_heads is None else num_v_heads

    def rounded(t):
        return round_to(t, activation_dtype)

    def linear(inp, weight):
        return inp @ weight.double().T

    def short_conv(weight, conv_weight):
        conv = causal_conv1d(rounded(linear(x, weight)), conv_weight, activation="silu", cu_seqlens=cu_seqlens)[0]
        return rounded(conv)

    # the l2 norms of q and k run inside the delta-rule kernel: no rounding after them
    q = l2norm(short_conv(q_weight, q_conv_weight).view(B, T, H, -1))
    k = l2norm(short_conv(k_weight, k_conv_weight).view(B, T, H, -1))
    v = short_conv(v_weight, v_conv_weight).view(B, T, HV, -1)
    beta = rounded(torch.sigmoid(rounded(linear(x, b_weight)))) * (2.0 if allow_neg_eigval else 1.0)
    # the layer computes the gate in float32 from the rounded projection
    g = -A_log.double().exp() * F.softplus(rounded(linear(x, a_weight)) + dt_bias.double())
    o, _ = gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens)
    o = rounded(o)
    if g_weight is not None:
        o = rms_norm_gated(o, rounded(linear(x, g_weight)).view(o.shape), norm_weight, eps=norm_eps)
    else:
        o = rms_norm(o, norm_weight, eps=norm_eps)
    return linear(rounded(o).reshape(B, T, -1), o_weight)
