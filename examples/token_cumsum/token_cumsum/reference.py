"""The float64 reference: the running sum, one token at a time, per sequence."""

import torch


def token_cumsum(x, initial_state=None, output_final_state=False, cu_seqlens=None):
    """``y_t = h_0 + x_0 + ... + x_t`` within each sequence; ``h_0`` is ``initial_state[n]``
    (or zero); the final state is the last ``y`` of each sequence (``h_0`` if it is empty)."""
    x = x.double()
    B, T, D = x.shape
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        offsets = cu_seqlens.tolist()
        spans = [(0, start, end) for start, end in zip(offsets[:-1], offsets[1:])]
    y = torch.zeros_like(x)
    finals = []
    for n, (b, start, end) in enumerate(spans):
        h = x.new_zeros(D) if initial_state is None else initial_state[n].double()
        for t in range(start, end):
            h = h + x[b, t]
            y[b, t] = h
        finals.append(h)
    return y, (torch.stack(finals) if output_final_state else None)
