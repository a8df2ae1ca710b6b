"""Pieces shared by the chunked delta-rule kernels: chunk coordinates, gate decay, configs.

Every chunk-parallel kernel is launched over (chunk, value head[, value block]) flattened
onto grid axis 0. A chunk is found either directly (equal-length sequences: sequence
``n = chunk // NT``) or through the varlen table of ``kernels._utils.chunk_map``.

Per-chunk states ``h`` live in a buffer of "slots", one slot per chunk. For equal-length
sequences the slot is the flat chunk index. For packed sequences it is
``bos // BT + n + c`` (first token, sequence index, chunk within the sequence): that is
one-to-one over the chunks of all sequences and stays below ``T // BT + N``, so neither the
state pass nor the chunk kernels need a host-built table of per-sequence chunk offsets.
(Proof: the last slot of sequence ``n`` is ``bos_n // BT + n + ceil(len_n / BT) - 1``, and
``bos_n // BT + ceil(len_n / BT) <= (bos_n + len_n) // BT + 1 = bos_{n+1} // BT + 1``, so it is
below the first slot ``bos_{n+1} // BT + n + 1`` of sequence ``n + 1``.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _arch
from .._utils import block_size

CHUNK = 64  # BT: tokens per chunk
L2NORM_EPS = tl.constexpr(1e-6)  # use_qk_l2norm_in_kernel: y = x / sqrt(sum(x^2) + eps)


# Triton 3.6's interpreter multiplies the raw bit patterns of bf16 dot operands; under it,
# `mm` upcasts them first. Compiled code never takes that branch.
_INTERPRETING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def mm(a, b):
    """``a @ b`` accumulated in fp32; fp32 operands take three-pass tf32 (near-fp32 products)."""
    if _INTERPRETING:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b, input_precision="tf32x3")


def state_slots(T: int, num_sequences: int, varlen: bool) -> int:
    """Number of per-chunk state slots (see the module docstring)."""
    if varlen:
        return T // CHUNK + num_sequences
    return num_sequences * triton.cdiv(T, CHUNK)


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
def sequence_span(i_n, cu_seqlens, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
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
    """``exp(diff)`` where ``mask``, else 0, for a float64 difference of cumulative gates.

    The difference is replaced under the mask before ``exp``: the masked-out entries are
    the ones whose log-decay difference is positive (a later minus an earlier cumulative
    gate), which overflow for strong decay.
    """
    return tl.where(mask, tl.exp(tl.where(mask, diff, 0.0).to(tl.float32)), 0.0)


@triton.jit
def load_gate_chunk(G, t0, n_valid, i_hv, HV: tl.constexpr, BT: tl.constexpr):
    """Chunk-local cumulative gates G [BT] (0 past the sequence end) and G at the chunk's last token.

    G is kept in float64: under strong decay it reaches -1e4 within a chunk, where a
    float32 ulp (1e-3) would make every ``exp(G_i - G_j)`` off by that much, relatively.
    """
    rows = tl.arange(0, BT)
    b_G = tl.load(G + (t0 + rows) * HV + i_hv, mask=rows < n_valid, other=0.0)
    b_G_last = tl.load(G + (t0 + n_valid - 1) * HV + i_hv)
    return b_G, b_G_last


@triton.jit
def rows_tile(base, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0, BR: tl.constexpr, BC: tl.constexpr):
    """[BR, BC] tile of a row-major [n_rows, n_cols] matrix (rows ``row_stride`` apart), zero-padded."""
    p = tl.make_block_ptr(base, (n_rows, n_cols), (row_stride, 1), (0, col0), (BR, BC), (1, 0))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero")


@triton.jit
def rows_tile_t(base, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0, BR: tl.constexpr, BC: tl.constexpr):
    """The same tile transposed: [BC, BR]."""
    p = tl.make_block_ptr(base, (n_cols, n_rows), (1, row_stride), (col0, 0), (BC, BR), (0, 1))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero")


@triton.jit
def rows_tile_store(base, value, n_rows, row_stride: tl.constexpr, n_cols: tl.constexpr, col0,
                    BR: tl.constexpr, BC: tl.constexpr):
    """Store a [BR, BC] tile into a row-major [n_rows, n_cols] matrix, in the matrix's dtype."""
    p = tl.make_block_ptr(base, (n_rows, n_cols), (row_stride, 1), (0, col0), (BR, BC), (1, 0))
    tl.store(p, value.to(p.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def state_piece_load(base, i_p, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    """Key rows [i_p BKS, (i_p + 1) BKS) of the value block ``i_v`` of a [K, V] state."""
    p = tl.make_block_ptr(base, (K, V), (V, 1), (i_p * BKS, i_v * BV), (BKS, BV), (1, 0))
    return tl.load(p, boundary_check=(0, 1), padding_option="zero")


@triton.jit
def state_piece_store(base, b, i_p, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, BV: tl.constexpr):
    p = tl.make_block_ptr(base, (K, V), (V, 1), (i_p * BKS, i_v * BV), (BKS, BV), (1, 0))
    tl.store(p, b.to(p.dtype.element_ty), boundary_check=(0, 1))


@triton.jit
def state_program(cu_seqlens, T, H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                  BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A state pass's program: (value block, sequence * HV + value head, value head, key head,
    first token, end token, state slot of the first chunk, number of chunks)."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_nh = pid // NV
    i_hv = i_nh % HV
    bos, eos, slot0 = sequence_span(i_nh // HV, cu_seqlens, T, BT, IS_VARLEN)
    return (pid % NV).to(tl.int32), i_nh, i_hv, i_hv // (HV // H), bos, eos, slot0, tl.cdiv(eos - bos, BT)


@triton.jit
def load_state_pieces(states, i_nh, i_v, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr, NKS: tl.constexpr,
                      BV: tl.constexpr, LOAD: tl.constexpr):
    """The value block of the [K, V] fp32 state ``i_nh`` of ``states`` as four [BKS, BV]
    pieces (those past NKS zero); all zero without LOAD (``states`` then None)."""
    b1 = tl.zeros([BKS, BV], dtype=tl.float32)
    b2 = tl.zeros([BKS, BV], dtype=tl.float32)
    b3 = tl.zeros([BKS, BV], dtype=tl.float32)
    b4 = tl.zeros([BKS, BV], dtype=tl.float32)
    if LOAD:
        base = states + i_nh * K * V
        b1 += state_piece_load(base, 0, i_v, K, V, BKS, BV)
        if NKS > 1:
            b2 += state_piece_load(base, 1, i_v, K, V, BKS, BV)
        if NKS > 2:
            b3 += state_piece_load(base, 2, i_v, K, V, BKS, BV)
            b4 += state_piece_load(base, 3, i_v, K, V, BKS, BV)
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


@dataclass(frozen=True)
class Configs:
    """Block sizes, warps and pipeline stages of every kernel, for one (K, V, dtype, arch)."""

    BK_full: int  # the key dim padded to a power of two
    BKS: int  # the state passes hold the [K, BV] state as BK_full / BKS pieces of [BKS, BV]
    prepare_BK: int
    prepare_BV: int
    prepare_warps: int
    prepare_stages: int
    state_BV: int
    state_warps: int
    state_stages: int
    output_BK: int
    output_BV: int
    output_warps: int
    output_stages: int
    state_grad_BV: int
    state_grad_warps: int
    state_grad_stages: int
    grad_BK: int
    grad_BV: int
    grad_warps: int
    grad_stages: int


def choose_configs(K: int, V: int, dtype: torch.dtype, arch: int | None = None) -> Configs:
    """Configs from the *target* arch's shared-memory budget (kernels/README.md).

    The state passes are sequential over chunks, one program per (sequence, value head,
    value block): their value block sets the parallelism (B = 4, H = 16, V = 128 gives 128
    programs at BV = 64), and their pipelining stages and key pieces set the shared memory,
    which must leave room for two programs per multiprocessor so that all of them run in
    one wave. The specs' compile cases (pytest_fla/specs/delta_rule.py) compile every
    kernel offline for each target arch against its limit.
    """
    arch = _arch.target_arch() if arch is None else arch
    small_smem = _arch.shared_memory_limit(arch) < 150_000
    wide = dtype == torch.float32
    # 16-wide blocks gave wrong bf16 results on sm90 (K = V = 16, Triton 3.6; fp32 and
    # K >= 32 right): blocks are at least 32 wide, the masks cover the rest
    BK_full = max(32, block_size(K))
    BV_full = max(32, block_size(V))
    BK = min(64, BK_full)
    BV = min(64, BV_full)
    big_state = BK_full > 128
    pipelined = 1 if small_smem else 2
    # the reverse state pass stages q, k, w, P and dO each chunk: two stages of fp32 tiles
    # need the 228 KB parts (measured 173 KB at K = 128 against sm80's 163 KB)
    grad_pipelined = 1 if (small_smem or (wide and _arch.shared_memory_limit(arch) < 200_000)) else 2
    return Configs(
        BK_full=BK_full,
        BKS=min(64, BK_full),
        prepare_BK=BK, prepare_BV=BV, prepare_warps=4, prepare_stages=2,
        # three stages of the state pass's loads where 228 KB allow them (sm80 overflows):
        # 0.45 ms against 0.50 at two for the gated forward (config_sweep.py, H200, K = V = 128)
        state_BV=min(64, BV_full), state_warps=8 if big_state else 4,
        state_stages=1 if big_state else 3 if _arch.shared_memory_limit(arch) >= 200_000 else pipelined,
        output_BK=BK, output_BV=min(128, BV_full), output_warps=4, output_stages=1 if (small_smem and wide) else 2,
        state_grad_BV=min(32, BV_full), state_grad_warps=4, state_grad_stages=1 if big_state else grad_pipelined,
        grad_BK=BK, grad_BV=BV, grad_warps=8, grad_stages=1,
    )
