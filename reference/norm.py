"""Normalisations over the last dimension: l2norm, rms_norm, rms_norm_gated."""
import torch


def l2norm(x, eps=1e-6):
    """y = x / sqrt(Σ x² + eps) over the last dim."""
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def rms_norm(x, weight=None, bias=None, eps=1e-6):
    """y = x / sqrt(mean(x²) + eps) * weight + bias over the last dim.

    weight, bias [D] are optional (skipped when None)."""
    x = x.double()
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def rms_norm_gated(x, g, weight=None, eps=1e-6, activation="swish"):
    """y = x / sqrt(mean(x²) + eps) * weight * act(g) over the last dim.

    act: swish (alias silu) g σ(g), or sigmoid σ(g); weight [D] optional."""
    g = g.double()
    if activation in ("swish", "silu"):
        gate = g * torch.sigmoid(g)
    elif activation == "sigmoid":
        gate = torch.sigmoid(g)
    else:
        raise ValueError(f"activation must be 'swish', 'silu' or 'sigmoid', got {activation!r}")
    return rms_norm(x, weight, eps=eps) * gate
