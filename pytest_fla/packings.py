"""Variable-length packings: lists of sequence lengths that stress ``cu_seqlens`` handling.

Each packing is a list of lengths (tokens per sequence) for sequences packed along T.
The lengths are chosen around the kernels' chunk size, where off-by-one errors in
chunked kernels live: a sequence of one token, one a token short of a chunk, exactly a
chunk, a token past it, empty sequences between others.
"""

from __future__ import annotations

DEFAULT_CHUNK_SIZE = 64


def packings(chunk_size: int = DEFAULT_CHUNK_SIZE) -> dict[str, list[int]]:
    """Packing name -> sequence lengths, for kernels that work in chunks of ``chunk_size``."""
    c = chunk_size
    return {
        "one_sequence": [2 * c + 3],
        "equal": [c, c, c, c],
        "mixed_with_chunk_edges": [1, c - 1, c, c + 1, 2 * c + 5, 3],
        "zero_length": [0, c + 1, 0, 5, 0],
        "many_short": [1, 2, 3, 1, 5, 2, 7, 1, 3, 4, 1, 2],
        "one_long_among_short": [3, 4 * c + 7, 2, 1],
    }


PACKINGS: dict[str, list[int]] = packings()


def offsets(lengths: list[int]) -> list[int]:
    """Lengths -> cumulative offsets ``[0, l0, l0 + l1, ..., T]``."""
    out = [0]
    for length in lengths:
        out.append(out[-1] + length)
    return out
