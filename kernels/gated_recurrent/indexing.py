"""Index helpers shared by the gated-recurrence kernels (inlined into each kernel)."""

import triton
import triton.language as tl


@triton.jit
def sequence_span(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """(first token, length) of sequence ``i_n`` (int64 first token): from ``cu_seqlens``
    when packed, else row ``i_n`` of a ``[B, T]`` batch."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T_seq = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n * T
        T_seq = T
    return bos, T_seq


@triton.jit
def first_state_slot(bos, i_n, T, CHUNK: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Slot of a sequence's first chunk in a per-chunk state buffer (see ``state_slots``)."""
    if IS_VARLEN:
        slot = bos // CHUNK + i_n
    else:
        slot = i_n * tl.cdiv(T, CHUNK)
    return slot


def state_slots(B: int, T: int, N: int, chunk: int, varlen: bool) -> int:
    """Rows of a per-chunk state buffer. Fixed length: sequence b's chunk c is row
    ``b * ceil(T / chunk) + c``. Packed: sequence n's chunk c is row
    ``cu_seqlens[n] // chunk + n + c``, which is injective (a sequence of length L starting
    at s ends before row ``(s + L) // chunk + n + 1``, where the next one starts) and below
    ``T // chunk + N``; so no host-side prefix sum over the lengths is needed."""
    return T // chunk + N if varlen else B * -(-T // chunk)
