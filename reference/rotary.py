"""Rotary position embedding."""
import torch

from ._sequences import num_sequences, per_sequence


def rotary_embedding(x, dim, base=10000.0, interleaved=False, seqlen_offset=0, cu_seqlens=None):
    """Rotate channel pairs of x [B, T, H, D] by position-dependent angles.

    Channels [0, dim) rotate, [dim, D) pass through. Pair i (i < dim/2) is
    (x_i, x_{i+dim/2}) (half split, GPT-NeoX) or, interleaved, (x_{2i}, x_{2i+1}) (GPT-J);
    it turns by angle pos * base^(-2i/dim):

        (a, b) -> (a cos - b sin, a sin + b cos)

    pos = t + seqlen_offset with t counted from 0 in every sequence (every batch row, or
    every cu_seqlens sequence). seqlen_offset is an int or a tensor [N] with one offset per
    sequence. Angles are computed in float64.
    """
    x = x.double()
    B, T, H, D = x.shape
    assert dim % 2 == 0 and 0 < dim <= D, (dim, D)
    half = dim // 2
    inv_freq = base ** (-2 * torch.arange(half, dtype=torch.float64, device=x.device) / dim)
    if isinstance(seqlen_offset, torch.Tensor) and seqlen_offset.dim() > 0:
        offsets = [int(o) for o in seqlen_offset.tolist()]
        assert len(offsets) == num_sequences(B, cu_seqlens), (len(offsets), B)
    else:
        offsets = [int(seqlen_offset)] * num_sequences(B, cu_seqlens)

    def rotate(n, x_seq):
        L = x_seq.shape[0]
        positions = torch.arange(L, dtype=torch.float64, device=x.device) + offsets[n]
        angle = positions[:, None, None] * inv_freq  # [L, 1, half], the same for every head
        cos, sin = angle.cos(), angle.sin()
        if interleaved:
            a, b = x_seq[..., 0:dim:2], x_seq[..., 1:dim:2]
        else:
            a, b = x_seq[..., :half], x_seq[..., half:dim]
        a, b = a * cos - b * sin, a * sin + b * cos
        if interleaved:
            rotated = torch.stack((a, b), dim=-1).flatten(-2)
        else:
            rotated = torch.cat((a, b), dim=-1)
        return torch.cat((rotated, x_seq[..., dim:]), dim=-1), None

    out, _ = per_sequence(rotate, (x,), cu_seqlens)
    return out
