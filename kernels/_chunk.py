"""Pieces every chunked kernel shares: chunk coordinates, tiles, state pieces, products.

Every chunk-parallel kernel is launched over (chunk, head[, block]) flattened onto grid
axis 0. A chunk is found either directly (equal-length sequences: sequence
``n = chunk // NT``) or through the varlen table of ``kernels._utils.chunk_map``.

Per-chunk states ``h`` live in a buffer of "slots", one slot per chunk
(``kernels._sequence.state_slots``). For equal-length sequences the slot is the flat
chunk index. For packed sequences it is ``bos // BT + n + c`` (first token, sequence
index, chunk within the sequence): that is one-to-one over the chunks of all sequences
and stays below ``T // BT + N``, so neither the state pass nor the chunk kernels need a
host-built table of per-sequence chunk offsets. (Proof: the last slot of sequence ``n``
is ``bos_n // BT + n + ceil(len_n / BT) - 1``, and ``bos_n // BT + ceil(len_n / BT) <=
(bos_n + len_n) // BT + 1 = bos_{n+1} // BT + 1``, so it is below the first slot
``bos_{n+1} // BT + n + 1`` of sequence ``n + 1``.)

Tiles are loaded with plain pointer arithmetic and boolean masks (no block pointers:
Triton 3.9 removed them), rows and columns past the edge read as zero.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton 3.6's interpreter multiplies the raw bit patterns of bf16 dot operands; under it,
# `mm` upcasts them first and asks for exact fp32 products (what three-pass tf32 comes to:
# the emulated interpreter truncates a one-pass tf32 dot's operands, as tensor cores do).
# Compiled code never takes that branch.
_INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mm(a, b):
    """``a @ b`` accumulated in fp32; fp32 operands take three-pass tf32 (near-fp32 products)."""
    if _INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="tf32x3")


@triton.jit
def mm_acc(a, b, acc):
    """``acc + a @ b`` in fp32, accumulated in place by the tensor cores (no extra add)."""
    if _INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision="tf32x3")


@triton.jit
def chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """For launch row ``i_chunk`` (int64): sequence, first token of the chunk, end of the sequence, state slot."""
    if IS_VARLEN:
        i_n = tl.load(chunk_map + i_chunk * 2).to(tl.int64)
        i_c = tl.load(chunk_map + i_chunk * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        slot = bos // BT + i_n + i_c
    else:
        NT = tl.cdiv(T, BT)
        i_n = i_chunk // NT
        i_c = i_chunk % NT
        bos = i_n * T
        eos = bos + T
        slot = i_chunk
    return i_n, bos + i_c * BT, eos, slot


@triton.jit
def chunk_span(i_n, cu_seqlens, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """For sequence ``i_n`` (int64): first token, end token, state slot of its first chunk."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        slot0 = bos // BT + i_n
    else:
        bos = i_n * T
        eos = bos + T
        slot0 = i_n * tl.cdiv(T, BT)
    return bos, eos, slot0


@triton.jit
def masked_exp(diff, mask):
    """``exp(diff)`` where ``mask``, else 0, for a difference of cumulative log gates.

    The difference is replaced under the mask before ``exp``: the masked-out entries are
    the ones whose log-decay difference is positive (a later minus an earlier cumulative
    gate), which overflow for strong decay.
    """
    return tl.where(mask, tl.exp(tl.where(mask, diff, 0.0).to(tl.float32)), 0.0)


@triton.jit
def rows_tile(base, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0, BR: tl.constexpr, BC: tl.constexpr):
    """[BR, BC] tile of a row-major [n_rows, n_cols] matrix (rows ``row_stride`` apart), zero-padded."""
    rows = tl.arange(0, BR)
    cols = col0 + tl.arange(0, BC)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return tl.load(base + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def rows_tile_t(base, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0, BR: tl.constexpr, BC: tl.constexpr):
    """The same tile transposed: [BC, BR]."""
    cols = col0 + tl.arange(0, BC)
    rows = tl.arange(0, BR)
    mask = (cols[:, None] < n_cols) & (rows[None, :] < n_rows)
    return tl.load(base + cols[:, None] + rows[None, :] * row_stride, mask=mask, other=0.0)


@triton.jit
def rows_tile_store(base, value, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0,
                    BR: tl.constexpr, BC: tl.constexpr):
    """Store a [BR, BC] tile into a row-major [n_rows, n_cols] matrix, in the matrix's dtype."""
    rows = tl.arange(0, BR)
    cols = col0 + tl.arange(0, BC)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tl.store(base + rows[:, None] * row_stride + cols[None, :], value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def state_piece_load(base, i_p, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    """Key rows [i_p BKS, (i_p + 1) BKS) of the value block ``i_v`` of a [K, V] state."""
    return rows_tile(base + i_p * BKS * V, K - i_p * BKS, V, V, i_v * BV, BKS, BV)


@triton.jit
def state_piece_store(base, b, i_p, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    rows_tile_store(base + i_p * BKS * V, b, K - i_p * BKS, V, V, i_v * BV, BKS, BV)


@triton.jit
def load_state_pieces(states, i_nh, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr,
                      BV: tl.constexpr, LOAD: tl.constexpr):
    """The value block of the [K, V] state ``i_nh`` of ``states`` (any float dtype: an
    initial state may be bf16 or fp16) as four fp32 [BKS, BV] pieces (those past NKS
    zero); all zero without LOAD (``states`` then None)."""
    b1 = tl.zeros([BKS, BV], dtype=tl.float32)
    b2 = tl.zeros([BKS, BV], dtype=tl.float32)
    b3 = tl.zeros([BKS, BV], dtype=tl.float32)
    b4 = tl.zeros([BKS, BV], dtype=tl.float32)
    if LOAD:
        base = states + i_nh * K * V
        b1 += state_piece_load(base, 0, i_v, K, V, BKS, BV).to(tl.float32)
        if NKS > 1:
            b2 += state_piece_load(base, 1, i_v, K, V, BKS, BV).to(tl.float32)
        if NKS > 2:
            b3 += state_piece_load(base, 2, i_v, K, V, BKS, BV).to(tl.float32)
            b4 += state_piece_load(base, 3, i_v, K, V, BKS, BV).to(tl.float32)
    return b1, b2, b3, b4


@triton.jit
def store_state_pieces(base, b1, b2, b3, b4, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr,
                       NKS: tl.constexpr, BV: tl.constexpr):
    state_piece_store(base, b1, 0, i_v, K, V, BKS, BV)
    if NKS > 1:
        state_piece_store(base, b2, 1, i_v, K, V, BKS, BV)
    if NKS > 2:
        state_piece_store(base, b3, 2, i_v, K, V, BKS, BV)
        state_piece_store(base, b4, 3, i_v, K, V, BKS, BV)
