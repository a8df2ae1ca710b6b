"""The GatedDeltaNet layer: projections, short convolutions, gates, the gated delta rule,
a gated RMS norm and the output projection (docs/ops.md, "Layers").

For an input ``x [B, T, hidden_size]``, with ``H`` query/key heads of dim ``K`` and ``HV``
value heads of dim ``V`` (``HV % H == 0``)::

    q = silu(conv(x W_q^T)),  k = silu(conv(x W_k^T))        [B, T, H, K]
    v = silu(conv(x W_v^T))                                  [B, T, HV, V]
    g    = -exp(A_log) * softplus(x W_a^T + dt_bias)          [B, T, HV], log decay <= 0
    beta = sigmoid(x W_b^T)   (times 2 with allow_neg_eigval) [B, T, HV]
    o    = gated_delta_rule(l2norm(q), l2norm(k), v, g, beta)
    y    = rms_norm_gated(o, x W_g^T, norm_weight) W_o^T      (rms_norm without the output gate)

``conv`` is the depthwise causal convolution of ``kernels.causal_conv1d``; the l2 norms
run inside the delta-rule kernels (``use_qk_l2norm_in_kernel``). Projections are
``torch.nn.functional.linear`` (cuBLAS); everything else is this repo's Triton kernels, so
every launch puts the batch on grid axis 0 and any batch size that fits in memory runs.

``mode="chunk"`` runs ``chunk_gated_delta_rule``; ``"fused_recurrent"`` the one-pass
kernel, which the module picks for short inputs at inference (as decoding does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import _validate as V_
from ..conv import MAX_WIDTH, MIN_WIDTH, causal_conv1d
from ..delta_rule.chunk import MAX_KEY_HEAD_DIM, MAX_VALUE_HEAD_DIM, chunk_gated_delta_rule
from ..delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule
from ..norm import rms_norm, rms_norm_gated

OP = "gated_delta_net"
MODES = ("chunk", "fused_recurrent")
# the module switches to the fused-recurrent kernel at inference for inputs this short
SHORT_INPUT = 64


def _check_weight(name, t, expected, dims):
    V_.check_tensor(OP, name, t)
    V_.check_shape(OP, name, t, expected, dims)


def _validate(x, q_weight, k_weight, v_weight, a_weight, b_weight, A_log, dt_bias, q_conv_weight,
              k_conv_weight, v_conv_weight, g_weight, norm_weight, o_weight, num_heads, num_v_heads, mode,
              cu_seqlens, cu_seqlens_cpu):
    """Every argument against the others, before any launch; returns (H, HV, K, V, host offsets)."""
    V_.check_tensor(OP, "x", x)
    tensors = dict(x=x, q_weight=q_weight, k_weight=k_weight, v_weight=v_weight, a_weight=a_weight,
                   b_weight=b_weight, A_log=A_log, dt_bias=dt_bias, q_conv_weight=q_conv_weight,
                   k_conv_weight=k_conv_weight, v_conv_weight=v_conv_weight, g_weight=g_weight,
                   norm_weight=norm_weight, o_weight=o_weight)
    for name, t in tensors.items():
        if t is None and name not in ("g_weight", "norm_weight"):
            raise TypeError(f"{OP}: `{name}` must be a torch.Tensor, got None")
        if t is not None:
            V_.check_tensor(OP, name, t)
    V_.check_same_dtype(OP, x=x, q_weight=q_weight, k_weight=k_weight, v_weight=v_weight, a_weight=a_weight,
                        b_weight=b_weight, g_weight=g_weight, o_weight=o_weight)
    if mode not in MODES:
        raise ValueError(f"{OP}: `mode` must be one of {', '.join(MODES)}, got {mode!r}")
    device = V_.check_devices(OP, **tensors)
    V_.check_ndim(OP, "x", x, 3, "[B, T, hidden_size]")
    B, T, C = x.shape
    for name in ("num_heads", "num_v_heads"):
        n = num_heads if name == "num_heads" else num_v_heads
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{OP}: `{name}` must be a positive int, got {n!r}")
    H, HV = num_heads, num_v_heads
    if HV % H:
        raise ValueError(f"{OP}: `num_v_heads` = {HV} must be a multiple of `num_heads` = {H}")
    V_.check_ndim(OP, "q_weight", q_weight, 2, "[num_heads * head_dim, hidden_size]")
    if q_weight.shape[0] % H:
        raise ValueError(f"{OP}: `q_weight` has {q_weight.shape[0]} rows, not a multiple of num_heads = {H}")
    V_.check_ndim(OP, "v_weight", v_weight, 2, "[num_v_heads * head_v_dim, hidden_size]")
    if v_weight.shape[0] % HV:
        raise ValueError(f"{OP}: `v_weight` has {v_weight.shape[0]} rows, not a multiple of num_v_heads = {HV}")
    HK, HVV = q_weight.shape[0], v_weight.shape[0]
    # the layer's own sizes, before the first launch (its conv's) would meet them
    V_.check_range(OP, "the hidden size (x.shape[-1])", C, 1)
    V_.check_range(OP, "the key head dim K (q_weight.shape[0] / num_heads)", HK // H, 1, MAX_KEY_HEAD_DIM)
    V_.check_range(OP, "the value head dim V (v_weight.shape[0] / num_v_heads)", HVV // HV, 1, MAX_VALUE_HEAD_DIM)
    _check_weight("q_weight", q_weight, (HK, C), "[num_heads * head_dim, hidden_size]")
    _check_weight("k_weight", k_weight, (HK, C), "[num_heads * head_dim, hidden_size]")
    _check_weight("v_weight", v_weight, (HVV, C), "[num_v_heads * head_v_dim, hidden_size]")
    _check_weight("a_weight", a_weight, (HV, C), "[num_v_heads, hidden_size]")
    _check_weight("b_weight", b_weight, (HV, C), "[num_v_heads, hidden_size]")
    _check_weight("A_log", A_log, (HV,), "[num_v_heads]")
    _check_weight("dt_bias", dt_bias, (HV,), "[num_v_heads]")
    V_.check_ndim(OP, "q_conv_weight", q_conv_weight, 2, "[num_heads * head_dim, conv_size]")
    W = q_conv_weight.shape[1]
    V_.check_range(OP, "the conv width W (q_conv_weight.shape[1])", W, MIN_WIDTH, MAX_WIDTH)
    _check_weight("q_conv_weight", q_conv_weight, (HK, W), "[num_heads * head_dim, conv_size]")
    _check_weight("k_conv_weight", k_conv_weight, (HK, W), "[num_heads * head_dim, conv_size]")
    _check_weight("v_conv_weight", v_conv_weight, (HVV, W), "[num_v_heads * head_v_dim, conv_size]")
    if g_weight is not None:
        _check_weight("g_weight", g_weight, (HVV, C), "[num_v_heads * head_v_dim, hidden_size]")
    if norm_weight is not None:
        _check_weight("norm_weight", norm_weight, (HVV // HV,), "[head_v_dim]")
    _check_weight("o_weight", o_weight, (C, HVV), "[hidden_size, num_v_heads * head_v_dim]")
    offsets = V_.check_cu_seqlens(OP, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    return H, HV, HK // H, HVV // HV, offsets


def gated_delta_net(x, q_weight, k_weight, v_weight, a_weight, b_weight, A_log, dt_bias,
                    q_conv_weight, k_conv_weight, v_conv_weight, o_weight, g_weight=None, norm_weight=None,
                    num_heads=1, num_v_heads=None, norm_eps=1e-5, allow_neg_eigval=False, mode="chunk",
                    cu_seqlens=None, cu_seqlens_cpu=None):
    """The GatedDeltaNet layer as a function of its parameters (module docstring).

    x ``[B, T, hidden_size]``; projection weights ``[out, hidden_size]`` as in
    ``nn.Linear``; conv weights ``[channels, conv_size]``; ``A_log``, ``dt_bias``
    ``[num_v_heads]``; ``g_weight`` None for no output gate; ``norm_weight [head_v_dim]``.
    With ``cu_seqlens`` (``B == 1``) the packed sequences run independently (pass
    ``cu_seqlens_cpu`` to skip the host copy). Returns ``[B, T, hidden_size]``.
    """
    num_v_heads = num_heads if num_v_heads is None else num_v_heads
    H, HV, K, V, offsets = _validate(x, q_weight, k_weight, v_weight, a_weight, b_weight, A_log, dt_bias,
                                     q_conv_weight, k_conv_weight, v_conv_weight, g_weight, norm_weight,
                                     o_weight, num_heads, num_v_heads, mode, cu_seqlens, cu_seqlens_cpu)
    B, T, _ = x.shape
    varlen = dict(cu_seqlens=cu_seqlens, cu_seqlens_cpu=offsets)

    def short_conv(weight, conv_weight):
        return causal_conv1d(F.linear(x, weight), conv_weight, activation="silu", **varlen)[0]

    q = short_conv(q_weight, q_conv_weight).view(B, T, H, K)
    k = short_conv(k_weight, k_conv_weight).view(B, T, H, K)
    v = short_conv(v_weight, v_conv_weight).view(B, T, HV, V)
    beta = torch.sigmoid(F.linear(x, b_weight))
    if allow_neg_eigval:
        beta = beta * 2.0
    g = -A_log.float().exp() * F.softplus(F.linear(x, a_weight).float() + dt_bias.float())
    rule = chunk_gated_delta_rule if mode == "chunk" else fused_recurrent_gated_delta_rule
    o, _ = rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, **varlen)
    if g_weight is not None:
        o = rms_norm_gated(o, F.linear(x, g_weight).view(B, T, HV, V), norm_weight, eps=norm_eps)
    else:
        o = rms_norm(o, norm_weight, eps=norm_eps)
    return F.linear(o.reshape(B, T, HV * V), o_weight)


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet attention layer: ``forward(x [B, T, hidden_size]) -> [B, T, hidden_size]``.

    ``num_heads`` query/key heads of ``head_dim``; ``num_v_heads`` (default ``num_heads``)
    value heads of ``head_v_dim = head_dim * expand_v``. ``use_gate``: the output goes
    through a swish-gated RMS norm (else a plain one). ``mode``: the kernel for training
    and long inputs; short inputs (T <= 64) at inference take the fused-recurrent one.
    """

    def __init__(self, hidden_size: int = 2048, head_dim: int = 256, num_heads: int = 6,
                 num_v_heads: int | None = None, expand_v: float = 2.0, conv_size: int = 4,
                 use_gate: bool = True, allow_neg_eigval: bool = False, norm_eps: float = 1e-5,
                 mode: str = "chunk", device=None, dtype=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"GatedDeltaNet: `mode` must be one of {', '.join(MODES)}, got {mode!r}")
        num_v_heads = num_heads if num_v_heads is None else num_v_heads
        head_v_dim = int(head_dim * expand_v)
        if head_v_dim != head_dim * expand_v:
            raise ValueError(f"GatedDeltaNet: head_dim * expand_v = {head_dim * expand_v} must be an integer")
        self.hidden_size, self.head_dim, self.head_v_dim = hidden_size, head_dim, head_v_dim
        self.num_heads, self.num_v_heads = num_heads, num_v_heads
        self.mode, self.allow_neg_eigval, self.norm_eps = mode, allow_neg_eigval, norm_eps
        key_dim, value_dim = num_heads * head_dim, num_v_heads * head_v_dim
        factory = dict(device=device, dtype=dtype)

        def linear(out_features, in_features):
            return nn.Linear(in_features, out_features, bias=False, **factory)

        self.q_proj, self.k_proj = linear(key_dim, hidden_size), linear(key_dim, hidden_size)
        self.v_proj = linear(value_dim, hidden_size)
        self.a_proj, self.b_proj = linear(num_v_heads, hidden_size), linear(num_v_heads, hidden_size)
        self.g_proj = linear(value_dim, hidden_size) if use_gate else None
        self.o_proj = linear(hidden_size, value_dim)
        # depthwise conv weights [channels, conv_size], initialised as nn.Conv1d's
        bound = 1.0 / math.sqrt(conv_size)
        self.q_conv_weight, self.k_conv_weight, self.v_conv_weight = (
            nn.Parameter(torch.empty(n, conv_size, **factory).uniform_(-bound, bound))
            for n in (key_dim, key_dim, value_dim)
        )
        # decay rates A in [1, 16] and time steps dt in [1e-3, 0.1] (log-uniform), stored as
        # log A and softplus^{-1}(dt): g = -A softplus(a + dt_bias) starts near -A dt
        self.A_log = nn.Parameter(torch.empty(num_v_heads, device=device, dtype=torch.float32).uniform_(1, 16).log())
        dt = torch.exp(torch.rand(num_v_heads, device=device) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.norm_weight = nn.Parameter(torch.ones(head_v_dim, **factory))

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                cu_seqlens_cpu: torch.Tensor | None = None) -> torch.Tensor:
        short = x.dim() == 3 and x.shape[1] <= SHORT_INPUT
        mode = "fused_recurrent" if (short and not self.training) else self.mode
        return gated_delta_net(
            x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.a_proj.weight,
            self.b_proj.weight, self.A_log, self.dt_bias, self.q_conv_weight, self.k_conv_weight,
            self.v_conv_weight, self.o_proj.weight,
            g_weight=self.g_proj.weight if self.g_proj is not None else None, norm_weight=self.norm_weight,
            num_heads=self.num_heads, num_v_heads=self.num_v_heads, norm_eps=self.norm_eps,
            allow_neg_eigval=self.allow_neg_eigval, mode=mode, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
        )
