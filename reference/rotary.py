"""Rotary position embedding: angles computed from the position (``apply_rotary``), or read
from the caller's cos/sin tables (``rotary_embedding``)."""
import torch

from ._sequences import num_sequences, per_sequence


def _rotate(x, width, interleaved, seqlen_offset, cu_seqlens, tables):
    """Turn channel pair i (i < width/2) of every token by the angle whose cos and sin
    ``tables(positions)`` gives ([L, 1, width/2] each, float64); channels [width, D) pass."""
    B, T, H, D = x.shape
    assert width % 2 == 0 and 0 < width <= D, (width, D)
    half = width // 2
    if isinstance(seqlen_offset, torch.Tensor) and seqlen_offset.dim() > 0:
        offsets = [int(o) for o in seqlen_offset.tolist()]
        assert len(offsets) == num_sequences(B, cu_seqlens), (len(offsets), B)
    else:
        offsets = [int(seqlen_offset)] * num_sequences(B, cu_seqlens)

    def rotate(n, x_seq):
        positions = torch.arange(x_seq.shape[0], device=x.device) + offsets[n]
        cos, sin = tables(positions)
        if interleaved:
            a, b = x_seq[..., 0:width:2], x_seq[..., 1:width:2]
        else:
            a, b = x_seq[..., :half], x_seq[..., half:width]
        a, b = a * cos - b * sin, a * sin + b * cos
        if interleaved:
            rotated = torch.stack((a, b), dim=-1).flatten(-2)
        else:
            rotated = torch.cat((a, b), dim=-1)
        return torch.cat((rotated, x_seq[..., width:]), dim=-1), None

    out, _ = per_sequence(rotate, (x,), cu_seqlens)
    return out


def apply_rotary(x, dim, base=10000.0, interleaved=False, seqlen_offset=0, cu_seqlens=None):
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
    inv_freq = base ** (-2 * torch.arange(dim // 2, dtype=torch.float64, device=x.device) / dim)

    def tables(positions):
        angle = positions.double()[:, None, None] * inv_freq  # [L, 1, dim/2], the same for every head
        return angle.cos(), angle.sin()

    return _rotate(x, dim, interleaved, seqlen_offset, cu_seqlens, tables)


def rotary_embedding(x, cos, sin, interleaved=False, seqlen_offsets=0, cu_seqlens=None):
    """``apply_rotary`` with the angles read from tables: pair i of the token at position
    pos turns by the angle whose cosine is cos[pos, i] and sine sin[pos, i] (cos and sin
    [max_pos, R/2], R the rotary width); channels [R, D) pass through. Every position must
    lie in [0, max_pos)."""
    x = x.double()
    cos, sin = cos.double(), sin.double()
    assert cos.shape == sin.shape and cos.dim() == 2, (cos.shape, sin.shape)

    def tables(positions):
        assert not positions.numel() or 0 <= int(positions.min()) <= int(positions.max()) < cos.shape[0], (
            positions, cos.shape)
        return cos[positions][:, None, :], sin[positions][:, None, :]

    return _rotate(x, 2 * cos.shape[1], interleaved, seqlen_offsets, cu_seqlens, tables)
