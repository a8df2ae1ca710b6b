"""Depthwise causal 1-d convolution with a carried input history."""
import torch

from ._sequences import num_sequences, per_sequence


def causal_conv1d(x, weight, bias=None, activation=None, initial_state=None,
                  output_final_state=False, cu_seqlens=None):
    """y_t = act(bias + Σ_{i<W} weight[:, i] ⊙ x_{t-W+1+i})

    x [B, T, D], weight [D, W], bias [D] optional, act None or silu ('silu' / 'swish').
    Inputs before a sequence's start come from initial_state [N, D, W-1] (oldest first) or
    are zero. The final state [N, D, W-1] is the sequence's last W-1 inputs, its history
    filling in on the left when the sequence is shorter than W-1.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    x, weight = x.double(), weight.double()
    B, T, D = x.shape
    W = weight.shape[1]
    assert weight.shape == (D, W)
    if initial_state is not None:
        initial_state = initial_state.double()
        assert initial_state.shape == (num_sequences(B, cu_seqlens), D, W - 1)

    def convolve(n, x_seq):
        L = x_seq.shape[0]
        if initial_state is None:
            history = torch.zeros((W - 1, D), dtype=torch.float64, device=x.device)
        else:
            history = initial_state[n].T
        # padded[t + i] is x_{t-W+1+i}
        padded = torch.cat((history, x_seq))
        y = sum(weight[:, i] * padded[i:i + L] for i in range(W))
        if bias is not None:
            y = y + bias.double()
        if activation is not None:
            y = y * torch.sigmoid(y)
        return y, padded[L:].T

    y, final_states = per_sequence(convolve, (x,), cu_seqlens)
    return y, (final_states if output_final_state else None)
