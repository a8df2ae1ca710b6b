"""The token-by-token state loop shared by every recurrent op, and the per-head state algebra.

A state S holds one [K, V] matrix per head ([H, K, V]); keys, queries and gates of one step
are [H, K], values [H, V]. Without cu_seqlens every batch row is scanned at once, with a
leading batch dim on all of them (the step functions index from the right).
"""
import math

import torch
from torch.utils.checkpoint import checkpoint

from ._sequences import num_sequences, per_sequence

# Under autograd a scan this long keeps only the state at each segment's start and
# recomputes the steps inside a segment during backward: memory grows with sqrt(T), not T.
# (Saved per step, a float64 backward over 2048 steps of [2, 8, 256, 256] states needs
# tens of GB; checks running side by side on one 80 GB GPU ran it out of memory.)
CHECKPOINT_MIN_STEPS = 256


def outer(k, v):
    """k v^T per head: [..., H, K], [..., H, V] -> [..., H, K, V]."""
    return k[..., :, None] * v[..., None, :]


def read(S, q):
    """S^T q per head: [..., H, K, V], [..., H, K] -> [..., H, V]."""
    # A broadcast product and a sum: torch.einsum on small float64 CPU tensors costs
    # milliseconds per call, which dominated every reference run.
    return (S * q[..., :, None]).sum(-2)


def run_recurrence(step, tokens, state_shape, output_shape,
                   initial_state=None, output_final_state=False, cu_seqlens=None):
    """Scan every sequence: S_t, o_t = step(S_{t-1}, *tokens_t).

    tokens: float64 tensors [B, T, ...], handed to step one time step at a time.
    Sequence n starts from initial_state[n] ([N, *state_shape]) or from zeros.
    Returns (o [B, T, *output_shape], final states [N, *state_shape] or None unless
    output_final_state). A zero-length sequence's final state is its initial state.
    """
    batch_size = tokens[0].shape[0]
    if initial_state is not None:
        expected = (num_sequences(batch_size, cu_seqlens), *state_shape)
        assert tuple(initial_state.shape) == expected, (tuple(initial_state.shape), expected)
        initial_state = initial_state.double()
    device = tokens[0].device

    def scan(n, *sequence_tokens):
        if initial_state is None:
            S = torch.zeros(state_shape, dtype=torch.float64, device=device)
        else:
            S = initial_state[n]
        if sequence_tokens[0].shape[0] == 0:
            return S.new_zeros((0, *output_shape)), S
        return scan_steps(step, S, sequence_tokens, time_dim=0)

    if cu_seqlens is None:
        # Batch rows are independent sequences of equal length: one scan over all of them
        # (a leading batch dim), which keeps the reference fast at realistic batch sizes.
        if initial_state is None:
            S = torch.zeros((batch_size, *state_shape), dtype=torch.float64, device=device)
        else:
            S = initial_state
        if tokens[0].shape[1] == 0:
            return tokens[0].new_zeros((batch_size, 0, *output_shape)), (S if output_final_state else None)
        o, S = scan_steps(step, S, tokens, time_dim=1)
        return o, (S if output_final_state else None)
    o, final_states = per_sequence(scan, tokens, cu_seqlens)
    return o, (final_states if output_final_state else None)


def scan_steps(step, S, tokens, time_dim):
    """S_t, o_t = step(S_{t-1}, *tokens_t) over the tokens' ``time_dim`` (at least one step);
    returns (outputs stacked on ``time_dim``, last S). Checkpointed in segments of about
    sqrt(T) steps when autograd records a long scan."""
    steps = tokens[0].shape[time_dim]

    def run(S, *segment):
        outputs = []
        for t in range(segment[0].shape[time_dim]):
            S, o = step(S, *(x.select(time_dim, t) for x in segment))
            outputs.append(o)
        return torch.stack(outputs, time_dim), S

    recorded = torch.is_grad_enabled() and any(t.requires_grad for t in (S, *tokens))
    if not recorded or steps < CHECKPOINT_MIN_STEPS:
        return run(S, *tokens)
    length = math.isqrt(steps - 1) + 1
    pieces = []
    for start in range(0, steps, length):
        segment = [x.narrow(time_dim, start, min(length, steps - start)) for x in tokens]
        o, S = checkpoint(run, S, *segment, use_reentrant=False)
        pieces.append(o)
    return torch.cat(pieces, time_dim), S
