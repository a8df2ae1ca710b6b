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
