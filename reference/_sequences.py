"""Splitting a batch into its sequences and packing per-sequence results back.

Without cu_seqlens every batch row is one sequence; with cu_seqlens (B == 1) the single
row holds N sequences back to back, sequence n covering tokens
cu_seqlens[n] .. cu_seqlens[n+1] - 1.
"""
import torch


def num_sequences(batch_size, cu_seqlens):
    return batch_size if cu_seqlens is None else len(cu_seqlens) - 1


def sequence_spans(batch_size, seq_len, cu_seqlens):
    """The (row, start, end) of every sequence, in order."""
    if cu_seqlens is None:
        return [(row, 0, seq_len) for row in range(batch_size)]
    assert batch_size == 1, "cu_seqlens packs the sequences into a single batch row"
    bounds = [int(b) for b in cu_seqlens.tolist()]
    assert bounds[0] == 0 and bounds[-1] == seq_len, (bounds, seq_len)
    return [(0, start, end) for start, end in zip(bounds[:-1], bounds[1:])]


def per_sequence(fn, tensors, cu_seqlens):
    """Run fn(n, *slices) on every sequence n, slices being each tensor's [L, ...] tokens of it.

    fn returns (output [L, ...], final state or None). Returns the outputs packed back into
    [B, T, ...] like the inputs, and the final states stacked into [N, ...] (None where fn
    gave none).
    """
    batch_size, seq_len = tensors[0].shape[:2]
    spans = sequence_spans(batch_size, seq_len, cu_seqlens)
    rows = [[] for _ in range(batch_size)]
    states = []
    for n, (row, start, end) in enumerate(spans):
        output, state = fn(n, *(x[row, start:end] for x in tensors))
        rows[row].append(output)
        states.append(state)
    packed = torch.stack([torch.cat(pieces) for pieces in rows])
    final_states = None if any(s is None for s in states) else torch.stack(states)
    return packed, final_states
