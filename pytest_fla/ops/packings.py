"""Variable-length packings: the sequence lengths that ``cu_seqlens`` checks run over.

Lengths sit where chunked kernels break: a sequence of 1, of one chunk less one, of
exactly one chunk, of one chunk plus one, zero-length sequences between others, many
short ones, and one-token sequences at a chunk's first, middle and last token. Each packing names the index dtype its offsets use, so both int32 and int64
are covered without doubling the test count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packing:
    name: str
    lengths: tuple[int, ...]
    index_dtype: torch.dtype


def packings(chunk_size: int) -> tuple[Packing, ...]:
    """The packings for a kernel whose chunk length is ``chunk_size``."""
    c = chunk_size
    return (
        Packing("one_sequence", (2 * c + 3,), torch.int64),
        Packing("equal", (c, c, c), torch.int32),
        Packing("chunk_edges", (1, c - 1, c, c + 1), torch.int32),
        Packing("zero_length", (0, 5, 0, c + 2, 0), torch.int64),
        Packing("many_short", (1, 2, 3, 1, 4, 2, 1, 3), torch.int64),
        Packing("length_one_at_chunk_offsets", length_one_at_chunk_offsets(c), torch.int32),
    )


def length_one_at_chunk_offsets(c: int) -> tuple[int, ...]:
    """Lengths that put a sequence of one token at every kind of chunk offset: a chunk's
    first token, its last, its middle, the first token after a chunk boundary, and alone
    in the last, partial chunk (starts 0, c-1, c, c + c/2, 2c - 1, 2c)."""
    half = c // 2
    return (1, c - 2, 1, 1, half - 1, 1, c - half - 2, 1, 1)
