"""Softmax attention, flash style: ``parallel_attn`` forward and backward.

Per head (docs/ops.md, "Softmax attention")::

    o_i = sum_j softmax_j(scale q_i . k_j) v_j

over the keys j of query i's own sequence, with ``j <= i`` when causal and
``i - j < window_size`` under a sliding window (a non-causal window still sees every later
key). GQA: k, v have ``HKV`` heads, query head h reads kv head ``h // (H // HKV)``.

Forward (``attn_fwd_kernel``). One program per (query block of BM rows, query head). It
walks the key blocks the block can see in three segments: blocks cut by the window's left
edge (masked), blocks every row sees whole (no mask at all: no compare, no select), blocks
cut by the diagonal, the window's edge or the sequence's end (masked). Blocks outside the
causal triangle or the window are never visited. The softmax is online: the running row
maximum ``m``, the running sum ``l``, and the unnormalised output are rescaled as each
block raises the maximum. Scores are kept in log2 units (``log2(e)`` is folded into the
scale, so the exponentials are ``exp2``); in the blocks without a mask the scale enters
each exponent through one multiply-add (``s c - m``, the block's maximum being the raw
maximum times ``c = |scale| log2(e)``; a negative scale's sign is carried by q, exactly).
Products accumulate in fp32, and ``p`` goes to the second product in the input dtype
(tensor cores). Where a kernel's config asks (``Blocks.descriptors``) it reads the tiles it
walks over (forward and dq: k and v; dk/dv: q and do) through tensor descriptors (TMA on
sm90 and newer), for fixed-length batches with power-of-two head dims; pointer loads
otherwise. The program stores ``o`` and the
row's logsumexp ``lse = m + log2(l)`` (log2 units, float32) for the backward.

Backward, with ``delta_i = do_i . o_i``::

    p_ij = exp2(scale log2(e) q_i . k_j - lse_i)
    dv_j = sum_i p_ij do_i                    dp_ij = do_i . v_j
    ds_ij = p_ij (dp_ij - delta_i)
    dk_j = scale sum_i ds_ij q_i              dq_i = scale sum_j ds_ij k_j

``attn_bwd_dkdv_kernel``: one program per (key block, kv head); it loops over the query
heads of the kv head's group and, per head, over the query blocks that see the key block
(the same three segments, seen from the key side; or, where q and do come through tensor
descriptors, one loop that masks every tile: three inlined loop bodies kept three sets of
tiles live and spilled, 828 bytes a thread on sm90 against 32), and accumulates dk and dv in fp32
registers: the group's sum is formed in one program in a fixed order, deterministic,
without atomics. ``attn_bwd_dq_kernel``: one program per (query block, query head),
walking key blocks like the forward. It runs first: it forms its rows' ``delta`` from the
``do`` tile it holds anyway and one tile of ``o``, and stores it for the dk/dv kernel (a
separate pass over ``o`` and ``do`` took 34 us of the H200's 2.6 ms forward+backward at
B=4 T=4096 H=16 D=128).

Launches put the blocks of every sequence on grid axis 0 and the heads on axis 1 (H
itself, never B*H or N*H). Fixed-length batches index blocks directly; packed sequences
(``cu_seqlens``) go through the (sequence, block) table of ``kernels._utils.chunk_map``, in
which zero-length sequences own no block: 80,000 sequences of 16 tokens are 80,000 rows on
axis 0. Under a causal mask the blocks that do the most work come first (fixed length:
``REVERSE``; packed: the table's order, late query blocks or early key blocks of every
sequence first), so that the short ones fill the launch's tail. Token offsets are int64
(program ids are cast before any product), so packed inputs over 2**31 elements index
correctly.

Configs (block sizes, warps, stages) come from the target arch's shared memory
(``kernels._arch``), see ``CONFIGS``: head dims up to 256 on sm80 and newer; older targets
get a ``NotImplementedError`` before any launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch
from .._arch import COMPILE_OPTIONS
from .. import _library as library
from .._chunk import mm, mm_acc
from .._sequence import sequence_bounds
from .._utils import EARLY_FIRST, IN_ORDER, LATE_FIRST, block_size, cdiv, chunk_map, contiguous, empty
from .inputs import check_attention_inputs

LOG2E = math.log2(math.e)


@triton.jit
def _tile_load(ptrs, row_ok, col_ok, ROW_MASK: tl.constexpr, COL_MASK: tl.constexpr):
    """A tile load masked only along the axes that need it (full blocks: no mask at all)."""
    if ROW_MASK and COL_MASK:
        return tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    elif ROW_MASK:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    elif COL_MASK:
        return tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _tile_ptrs(base, token0, head, HEADS: tl.constexpr, DIM: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Pointers to a [BR, BC] tile of a ``[tokens, HEADS, DIM]`` tensor: tokens ``token0``
    (int64) on, head ``head``, columns from 0."""
    return (base + (token0 * HEADS + head) * DIM + tl.arange(0, BR)[:, None] * (HEADS * DIM)
            + tl.arange(0, BC)[None, :])


@triton.jit
def _block_origin(i_block, block_map, cu_seqlens, T, BLOCK: tl.constexpr, IS_VARLEN: tl.constexpr,
                  REVERSE: tl.constexpr):
    """For launch row ``i_block`` (int64): the first token of its sequence (int64), the
    sequence's length, and the block's first row within the sequence. ``REVERSE`` hands out
    a sequence's blocks last first (under a causal mask the last query blocks do the most
    work; starting them first evens out the tail of the launch)."""
    if IS_VARLEN:
        i_n = tl.load(block_map + i_block * 2).to(tl.int64)
        i_b = tl.load(block_map + i_block * 2 + 1)
    else:
        n_blocks = tl.cdiv(T, BLOCK)
        i_n = i_block // n_blocks
        i_b = (i_block % n_blocks).to(tl.int32)
        if REVERSE:
            i_b = n_blocks - 1 - i_b
    bos, L = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    return bos, L, i_b * BLOCK


@triton.jit
def _key_segments(m0, L, window, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_WINDOW: tl.constexpr):
    """Key blocks seen by query rows ``[m0, m0 + BM)`` of a sequence of length ``L``:
    ``[lo, a)`` masked (the window's left edge), ``[a, b)`` whole (every row sees every key,
    all inside the sequence), ``[b, hi)`` masked (diagonal, sequence end). Block starts are
    multiples of BN (BM is a multiple of BN)."""
    if CAUSAL:
        hi = tl.minimum(m0 + BM, L)
        b = m0
    else:
        hi = L
        b = (L // BN) * BN
    if HAS_WINDOW:
        lo = (tl.maximum(m0 - window + 1, 0) // BN) * BN
        # the first block whose first key is within the window of the block's last row
        a = tl.cdiv(tl.maximum(m0 + BM - window, 0), BN) * BN
        a = tl.minimum(tl.maximum(a, lo), hi)
    else:
        lo = m0 * 0
        a = lo
    b = tl.maximum(tl.minimum(b, hi), a)
    return lo, a, b, hi


@triton.jit
def _query_segments(n0, L, window, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                    HAS_WINDOW: tl.constexpr):
    """Query blocks (of BM rows) that see keys ``[n0, n0 + BN)``: ``[lo, a)`` masked
    (diagonal), ``[a, b)`` whole, ``[b, hi)`` masked (the window's far edge, the sequence's
    end). A key block cut by the sequence's end is masked throughout. BN is a multiple of BM."""
    if HAS_WINDOW:
        hi = tl.minimum(L, n0 + BN + window - 1)
        b = tl.minimum(((n0 + window) // BM) * BM, (L // BM) * BM)
    else:
        hi = L
        b = (L // BM) * BM
    if CAUSAL:
        lo = (n0 // BM) * BM
        a = tl.cdiv(n0 + BN - 1, BM) * BM
    else:
        lo = n0 * 0
        a = lo
    a = tl.minimum(tl.maximum(a, lo), hi)
    b = tl.maximum(tl.minimum(b, hi), a)
    b = tl.where(n0 + BN <= L, b, a)  # keys past the end: no whole blocks
    return lo, a, b, hi


@triton.jit
def _allowed(rows, keys, L, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """[rows, keys] pairs inside the sequence, the causal triangle and the window."""
    ok = (rows[:, None] < L) & (keys[None, :] < L)
    if CAUSAL:
        ok = ok & (keys[None, :] <= rows[:, None])
    if HAS_WINDOW:
        ok = ok & (rows[:, None] - keys[None, :] < window)
    return ok


@triton.jit
def _block_rows(blk, desc, desc_row, r0, L, ROW: tl.constexpr, DIM: tl.constexpr, BR: tl.constexpr,
                BDIM: tl.constexpr, MASKED: tl.constexpr, USE_DESC: tl.constexpr):
    """Rows ``[r0, r0 + BR)`` of one head of a sequence's ``[L, DIM]`` tensor: through the
    tensor descriptor with ``USE_DESC`` (over ``[B, T, heads * DIM]``, TMA on sm90: rows
    past the sequence's end read as zero; ``desc_row`` = (sequence, head)), else from
    ``blk``, the tile at the sequence's first row, with its masks."""
    if USE_DESC:
        return desc.load([desc_row[0], r0, desc_row[1] * DIM]).reshape(BR, BDIM)
    else:
        rows = r0 + tl.arange(0, BR)
        return _tile_load(blk + tl.cast(r0, tl.int64) * ROW, rows < L, tl.arange(0, BDIM) < DIM, MASKED, BDIM != DIM)


@triton.jit
def _key_tiles(k_blk, v_blk, k_desc, v_desc, desc_row, n0, L, K_ROW: tl.constexpr, V_ROW: tl.constexpr,
               D: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
               MASKED: tl.constexpr, USE_DESC: tl.constexpr):
    """Key block ``n0``'s k and v tiles (``_block_rows``)."""
    kb = _block_rows(k_blk, k_desc, desc_row, n0, L, K_ROW, D, BN, BD, MASKED, USE_DESC)
    vb = _block_rows(v_blk, v_desc, desc_row, n0, L, V_ROW, DV, BN, BDV, MASKED, USE_DESC)
    return kb, vb


@triton.jit
def _desc_row(bos, T, head, USE_DESC: tl.constexpr):
    """(sequence, head) of a tile in a descriptor over ``[B, T, heads * dim]``; fixed
    length only, where ``bos`` is a multiple of T."""
    if USE_DESC:
        return (bos // T).to(tl.int32), head.to(tl.int32)
    else:
        return 0, 0


@triton.jit
def _log2_scores(s, rows, keys, L, window, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_WINDOW: tl.constexpr):
    """Scores ``s`` in log2 units, ``-inf`` where masked."""
    s = s * qk_scale
    if MASKED:
        s = tl.where(_allowed(rows, keys, L, window, CAUSAL, HAS_WINDOW), s, float("-inf"))
    return s


@triton.jit
def _fwd_keys(acc, m_i, l_i, qb, k_blk, v_blk, k_desc, v_desc, desc_row, rows, n_lo, n_hi, L, window, qk_scale,
              K_ROW: tl.constexpr, V_ROW: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr,
              BD: tl.constexpr, BDV: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_WINDOW: tl.constexpr, USE_DESC: tl.constexpr):
    """Online softmax over key blocks ``[n_lo, n_hi)``. ``qk_scale >= 0`` (the sign of the
    scale is in ``qb``): a whole block's maximum is the raw scores' maximum times it, and
    each exponent one multiply-add (``s qk_scale - m``), not a scaled tile and a subtract."""
    for n0 in range(n_lo, n_hi, BN):
        kb, vb = _key_tiles(k_blk, v_blk, k_desc, v_desc, desc_row, n0, L, K_ROW, V_ROW, D, DV, BN, BD, BDV, MASKED,
                            USE_DESC)
        s = mm(qb, tl.trans(kb))
        if MASKED:
            s = _log2_scores(s, rows, n0 + tl.arange(0, BN), L, window, qk_scale, MASKED, CAUSAL, HAS_WINDOW)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row that has seen no key yet keeps m = -inf; subtract 0 instead (-inf - -inf is NaN)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_new_safe[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_new_safe = m_new
            p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = mm_acc(p.to(vb.dtype), vb, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def attn_fwd_kernel(
    q, k, v, o, lse, k_desc, v_desc, block_map, cu_seqlens, scale, window, T, TOTAL,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_VARLEN: tl.constexpr,
    NEGATIVE_SCALE: tl.constexpr, USE_DESC: tl.constexpr,
):
    i_block = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_hkv = i_h // (H // HKV)
    bos, L, m0 = _block_origin(i_block, block_map, cu_seqlens, T, BM, IS_VARLEN, CAUSAL and not IS_VARLEN)
    # log2(e): scores in log2 units, exponentials as exp2; the scale's sign goes into q (exact)
    qk_scale = tl.abs(scale) * 1.4426950408889634

    rows = m0 + tl.arange(0, BM)
    c_d = tl.arange(0, BD) < D
    c_dv = tl.arange(0, BDV) < DV
    row_ok = rows < L
    q_tile = _tile_ptrs(q, bos + m0, i_h, H, D, BM, BD)
    qb = _tile_load(q_tile, row_ok, c_d, True, BD != D)
    if NEGATIVE_SCALE:
        qb = -qb
    k_blk = _tile_ptrs(k, bos, i_hkv, HKV, D, BN, BD)
    v_blk = _tile_ptrs(v, bos, i_hkv, HKV, DV, BN, BDV)
    desc_row = _desc_row(bos, T, i_hkv, USE_DESC)

    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    lo, a, b, hi = _key_segments(m0, L, window, BM, BN, CAUSAL, HAS_WINDOW)
    if HAS_WINDOW:
        acc, m_i, l_i = _fwd_keys(acc, m_i, l_i, qb, k_blk, v_blk, k_desc, v_desc, desc_row, rows, lo, a, L, window,
                                  qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)
    acc, m_i, l_i = _fwd_keys(acc, m_i, l_i, qb, k_blk, v_blk, k_desc, v_desc, desc_row, rows, a, b, L, window,
                              qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, False, CAUSAL, HAS_WINDOW, USE_DESC)
    acc, m_i, l_i = _fwd_keys(acc, m_i, l_i, qb, k_blk, v_blk, k_desc, v_desc, desc_row, rows, b, hi, L, window,
                              qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)

    # rows past the sequence's end (never stored) may have seen nothing: keep them finite
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_tile = _tile_ptrs(o, bos + m0, i_h, H, DV, BM, BDV)
    tl.store(o_tile, out.to(o.dtype.element_ty), mask=row_ok[:, None] & c_dv[None, :])
    tl.store(lse + i_h * TOTAL + bos + rows, m_i + tl.log2(l_safe), mask=row_ok)


@triton.jit
def _dkdv_queries(dk, dv, kb, vb, q_blk, do_blk, q_desc, do_desc, desc_row, lse_row, delta_row, keys, m_lo, m_hi, L,
                  window, qk_scale, Q_ROW: tl.constexpr, DO_ROW: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                  BM: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, USE_DESC: tl.constexpr):
    """dk, dv of one key block from query blocks ``[m_lo, m_hi)`` of one query head, in the
    transposed form (scores ``[BN, BM]``), so no tile is transposed in registers. With
    ``USE_DESC`` the q and do tiles come through tensor descriptors (rows past the
    sequence's end read as zero), as the forward's k and v do."""
    o_m = tl.arange(0, BM)
    for m0 in range(m_lo, m_hi, BM):
        rows = m0 + o_m
        row_ok = rows < L
        qb = _block_rows(q_blk, q_desc, desc_row, m0, L, Q_ROW, D, BM, BD, MASKED, USE_DESC)
        if MASKED:
            lse_m = tl.load(lse_row + rows, mask=row_ok, other=0.0)
        else:
            lse_m = tl.load(lse_row + rows)
        sT = mm(kb, tl.trans(qb)) * qk_scale
        if MASKED:
            sT = tl.where(tl.trans(_allowed(rows, keys, L, window, CAUSAL, HAS_WINDOW)), sT, float("-inf"))
        pT = tl.exp2(sT - lse_m[None, :])
        dob = _block_rows(do_blk, do_desc, desc_row, m0, L, DO_ROW, DV, BM, BDV, MASKED, USE_DESC)
        dv = mm_acc(pT.to(dob.dtype), dob, dv)
        if MASKED:
            delta_m = tl.load(delta_row + rows, mask=row_ok, other=0.0)
        else:
            delta_m = tl.load(delta_row + rows)
        dpT = mm(vb, tl.trans(dob))
        dsT = pT * (dpT - delta_m[None, :])
        dk = mm_acc(dsT.to(qb.dtype), qb, dk)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    q, k, v, do, lse, delta, dk, dv, q_desc, do_desc, block_map, cu_seqlens, scale, window, T, TOTAL,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_VARLEN: tl.constexpr, USE_DESC: tl.constexpr,
    SEGMENTS: tl.constexpr,
):
    i_block = tl.program_id(0).to(tl.int64)
    i_hkv = tl.program_id(1).to(tl.int64)
    G: tl.constexpr = H // HKV
    bos, L, n0 = _block_origin(i_block, block_map, cu_seqlens, T, BN, IS_VARLEN, False)
    qk_scale = scale * 1.4426950408889634

    keys = n0 + tl.arange(0, BN)
    c_d = tl.arange(0, BD) < D
    c_dv = tl.arange(0, BDV) < DV
    key_ok = keys < L
    k_tile = _tile_ptrs(k, bos + n0, i_hkv, HKV, D, BN, BD)
    v_tile = _tile_ptrs(v, bos + n0, i_hkv, HKV, DV, BN, BDV)
    kb = _tile_load(k_tile, key_ok, c_d, True, BD != D)
    vb = _tile_load(v_tile, key_ok, c_dv, True, BDV != DV)

    dk_acc = tl.zeros([BN, BD], dtype=tl.float32)
    dv_acc = tl.zeros([BN, BDV], dtype=tl.float32)
    lo, a, b, hi = _query_segments(n0, L, window, BM, BN, CAUSAL, HAS_WINDOW)
    for g in range(G):
        i_h = i_hkv * G + g
        q_blk = _tile_ptrs(q, bos, i_h, H, D, BM, BD)
        do_blk = _tile_ptrs(do, bos, i_h, H, DV, BM, BDV)
        lse_row = lse + i_h * TOTAL + bos
        delta_row = delta + i_h * TOTAL + bos
        desc_row = _desc_row(bos, T, i_h, USE_DESC)
        if SEGMENTS:
            if CAUSAL:  # (without it lo == a)
                dk_acc, dv_acc = _dkdv_queries(dk_acc, dv_acc, kb, vb, q_blk, do_blk, q_desc, do_desc, desc_row,
                                               lse_row, delta_row, keys, lo, a, L, window, qk_scale, H * D, H * DV, D,
                                               DV, BM, BD, BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)
            dk_acc, dv_acc = _dkdv_queries(dk_acc, dv_acc, kb, vb, q_blk, do_blk, q_desc, do_desc, desc_row, lse_row,
                                           delta_row, keys, a, b, L, window, qk_scale, H * D, H * DV, D, DV, BM, BD,
                                           BDV, False, CAUSAL, HAS_WINDOW, USE_DESC)
            dk_acc, dv_acc = _dkdv_queries(dk_acc, dv_acc, kb, vb, q_blk, do_blk, q_desc, do_desc, desc_row, lse_row,
                                           delta_row, keys, b, hi, L, window, qk_scale, H * D, H * DV, D, DV, BM, BD,
                                           BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)
        else:
            # one loop that masks every tile: the three inlined loop bodies hold three sets of
            # live tiles, and the dk/dv kernel spills (sm90 bf16 D=128: 828 bytes a thread by
            # offline ptxas, 164 as one loop, 32 as one loop over descriptor loads)
            dk_acc, dv_acc = _dkdv_queries(dk_acc, dv_acc, kb, vb, q_blk, do_blk, q_desc, do_desc, desc_row, lse_row,
                                           delta_row, keys, lo, hi, L, window, qk_scale, H * D, H * DV, D, DV, BM, BD,
                                           BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)

    dk_tile = _tile_ptrs(dk, bos + n0, i_hkv, HKV, D, BN, BD)
    dv_tile = _tile_ptrs(dv, bos + n0, i_hkv, HKV, DV, BN, BDV)
    tl.store(dk_tile, (dk_acc * scale).to(dk.dtype.element_ty), mask=key_ok[:, None] & c_d[None, :])
    tl.store(dv_tile, dv_acc.to(dv.dtype.element_ty), mask=key_ok[:, None] & c_dv[None, :])


@triton.jit
def _dq_keys(dq, qb, dob, lse_m, delta_m, k_blk, v_blk, k_desc, v_desc, desc_row, rows, n_lo, n_hi, L, window,
             qk_scale, K_ROW: tl.constexpr, V_ROW: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr,
             BD: tl.constexpr, BDV: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_WINDOW: tl.constexpr, USE_DESC: tl.constexpr):
    for n0 in range(n_lo, n_hi, BN):
        kb, vb = _key_tiles(k_blk, v_blk, k_desc, v_desc, desc_row, n0, L, K_ROW, V_ROW, D, DV, BN, BD, BDV, MASKED,
                            USE_DESC)
        s = _log2_scores(mm(qb, tl.trans(kb)), rows, n0 + tl.arange(0, BN), L, window, qk_scale, MASKED, CAUSAL,
                         HAS_WINDOW)
        p = tl.exp2(s - lse_m[:, None])
        dp = mm(dob, tl.trans(vb))
        ds = p * (dp - delta_m[:, None])
        dq = mm_acc(ds.to(kb.dtype), kb, dq)
    return dq


@triton.jit
def attn_bwd_dq_kernel(
    q, k, v, o, do, lse, delta, dq, k_desc, v_desc, block_map, cu_seqlens, scale, window, T, TOTAL,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_VARLEN: tl.constexpr, USE_DESC: tl.constexpr,
):
    i_block = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    i_hkv = i_h // (H // HKV)
    bos, L, m0 = _block_origin(i_block, block_map, cu_seqlens, T, BM, IS_VARLEN, CAUSAL and not IS_VARLEN)
    qk_scale = scale * 1.4426950408889634

    rows = m0 + tl.arange(0, BM)
    c_d = tl.arange(0, BD) < D
    c_dv = tl.arange(0, BDV) < DV
    row_ok = rows < L
    qb = _tile_load(_tile_ptrs(q, bos + m0, i_h, H, D, BM, BD), row_ok, c_d, True, BD != D)
    dob = _tile_load(_tile_ptrs(do, bos + m0, i_h, H, DV, BM, BDV), row_ok, c_dv, True,
                     BDV != DV)
    ob = _tile_load(_tile_ptrs(o, bos + m0, i_h, H, DV, BM, BDV), row_ok, c_dv, True, BDV != DV)
    lse_m = tl.load(lse + i_h * TOTAL + bos + rows, mask=row_ok, other=0.0)
    # every row of every sequence is in one dq block: these rows' delta, for dk/dv after
    delta_m = tl.sum(ob.to(tl.float32) * dob.to(tl.float32), 1)
    tl.store(delta + i_h * TOTAL + bos + rows, delta_m, mask=row_ok)
    k_blk = _tile_ptrs(k, bos, i_hkv, HKV, D, BN, BD)
    v_blk = _tile_ptrs(v, bos, i_hkv, HKV, DV, BN, BDV)
    desc_row = _desc_row(bos, T, i_hkv, USE_DESC)

    dq_acc = tl.zeros([BM, BD], dtype=tl.float32)
    lo, a, b, hi = _key_segments(m0, L, window, BM, BN, CAUSAL, HAS_WINDOW)
    if HAS_WINDOW:
        dq_acc = _dq_keys(dq_acc, qb, dob, lse_m, delta_m, k_blk, v_blk, k_desc, v_desc, desc_row, rows, lo, a, L,
                          window, qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)
    dq_acc = _dq_keys(dq_acc, qb, dob, lse_m, delta_m, k_blk, v_blk, k_desc, v_desc, desc_row, rows, a, b, L,
                      window, qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, False, CAUSAL, HAS_WINDOW, USE_DESC)
    dq_acc = _dq_keys(dq_acc, qb, dob, lse_m, delta_m, k_blk, v_blk, k_desc, v_desc, desc_row, rows, b, hi, L,
                      window, qk_scale, HKV * D, HKV * DV, D, DV, BN, BD, BDV, True, CAUSAL, HAS_WINDOW, USE_DESC)
    dq_tile = _tile_ptrs(dq, bos + m0, i_h, H, D, BM, BD)
    tl.store(dq_tile, (dq_acc * scale).to(dq.dtype.element_ty), mask=row_ok[:, None] & c_d[None, :])


@dataclass(frozen=True)
class Blocks:
    BM: int  # query rows per block
    BN: int  # key rows per block
    num_warps: int
    num_stages: int
    # the tiles the kernel walks over (forward and dq: k and v; dk/dv: q and do) through
    # tensor descriptors (TMA on sm90 and newer), where ``_descriptors`` allows them;
    # pointer loads otherwise
    descriptors: bool = False
    # dk/dv only: its query loop in three segments (masked, whole, masked) where True, one
    # loop masking every tile where False and q and do come through descriptors
    segments: bool = True


@dataclass(frozen=True)
class AttentionConfigs:
    fwd: Blocks
    dkdv: Blocks
    dq: Blocks


def attention_configs(D: int, DV: int, dtype) -> AttentionConfigs:
    """Per-kernel blocks for head dims ``D``, ``DV`` and the input dtype, from the target
    arch's shared memory (``CONFIGS``). Raises ``NotImplementedError`` on targets older than
    sm80 (64 KB of shared memory and no bf16 tensor cores: float32 tiles at D = 256 do not
    fit even at 16 x 16, and the other families stop there too)."""
    _arch.require_arch("parallel_attn", 80, "sm75's 64 KB of shared memory does not hold the attention tiles at "
                       "every head dim, and it has no bf16 tensor cores")
    smem = _arch.shared_memory_limit()
    width = 64 if max(D, DV) <= 64 else 128 if max(D, DV) <= 128 else 256
    for least, fwd, dkdv, dq in CONFIGS[(4 if dtype == torch.float32 else 2, width)]:
        if smem >= least:
            return AttentionConfigs(Blocks(*fwd), Blocks(*dkdv), Blocks(*dq))
    raise NotImplementedError(f"parallel_attn: no config for head dims D = {D}, DV = {DV} within "
                              f"sm{_arch.target_arch()}'s {smem} bytes of shared memory")


KB = 1024
# (bytes per element, head dim up to) -> [(least shared memory, forward, dk/dv, dq)], the
# largest budget first; blocks are (BM, BN, num_warps, num_stages[, descriptors]). BN divides BM in the
# forward and dq, BM divides BN in dk/dv (the segment arithmetic relies on it). Budgets:
# sm90/sm100 227 KB, sm80 163 KB, sm86/89/120 99 KB; every entry compiles within its
# arch's limit (tests/test_compile.py --fla-arch=all; the largest, by offline compile:
# sm90 bf16 D=128 forward ~160 KB, fp32 D=256 forward 196608 bytes, sm86 fp32 D=256 dk/dv
# 98304 bytes).
CONFIGS = {
    (2, 64): [
        (160 * KB, (128, 64, 4, 3), (32, 128, 4, 3), (128, 32, 4, 3)),
        (0, (128, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2)),
    ],
    (2, 128): [
        # measured bf16 B=4 T=4096 H=16 causal, one kernel varied at a time
        # (benchmarks/attention_sweep.py): on an H100 the forward with k and v through
        # tensor descriptors takes 0.594 ms against 0.774 for pointer loads (and 0.608 for
        # (128, 128, 8, 3, True)); on an H200 dk/dv 64 x 64 saves 0.57 ms of 3.66 against
        # (32, 128, 8, 3); dq 128 x 64 on two warpgroups with k and v through descriptors
        # takes forward+backward from 2.896 ms (64 x 64, pointer loads) to 2.584
        # (benchmarks/results/sweeps/attention_descriptors_h200.json); dk/dv as one masked
        # loop with q and do through descriptors: 2.446 against 2.511
        # (sweeps/attention_descriptors_h200.json). Triton 3.6's Hopper warp specialization
        # (tl.range warp_specialize) on the forward's unmasked key loop: the pass fails at 4
        # warps, and at 8 warps took 0.624 ms (128 x 64) and 0.710 (128 x 128) against 0.607
        # (H200, 2026-11-29, benchmarks/results/README.md, "Speed against the peer")
        (200 * KB, (64, 64, 4, 3, True), (64, 64, 4, 2, True, False), (128, 64, 8, 3, True)),
        (160 * KB, (128, 64, 8, 2), (32, 128, 8, 2), (64, 32, 4, 2)),
        (0, (128, 64, 4, 2), (32, 128, 4, 2), (128, 32, 4, 2)),
    ],
    (2, 256): [
        (200 * KB, (128, 64, 8, 2), (32, 64, 8, 2), (64, 32, 8, 2)),
        (160 * KB, (64, 64, 8, 2), (32, 64, 8, 1), (64, 32, 8, 1)),
        (0, (64, 32, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)),
    ],
    (4, 64): [
        (160 * KB, (64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2)),
        (0, (64, 32, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)),
    ],
    (4, 128): [
        (200 * KB, (64, 64, 8, 2), (32, 64, 8, 2), (64, 32, 8, 2)),
        # Triton 3.8 stages the two-stage forward in 196608 bytes, over sm80's 163 KB
        (160 * KB, (64, 64, 8, 1), (32, 64, 8, 2), (64, 32, 8, 2)),
        (0, (64, 32, 4, 1), (16, 32, 4, 1), (32, 16, 4, 1)),
    ],
    (4, 256): [
        (160 * KB, (64, 32, 8, 1), (16, 32, 8, 1), (32, 16, 8, 1)),
        (0, (32, 16, 4, 1), (16, 16, 4, 1), (16, 16, 4, 1)),
    ],
}


def _blocks_grid(B: int, T: int, offsets_host, block: int, device, order: str = IN_ORDER):
    """(number of launch rows, (sequence, block) table or None) for blocks of ``block``
    tokens; a packed table's rows in ``order`` (heaviest first under a causal mask, as
    ``REVERSE`` does for fixed-length batches)."""
    if offsets_host is None:
        return B * cdiv(T, block), None
    table = chunk_map(offsets_host, block, device, order)
    return table.shape[0], table


def _descriptors(tensors, rows: int, c: Blocks, varlen: bool):
    """Tensor descriptors of each ``[B, T, heads, dim]`` tensor as ``[B, T, heads * dim]``
    with ``[1, rows, dim]`` boxes, or Nones where the config does not ask for them or they
    cannot be used: packed sequences (a box would run into the next sequence, where the
    pointer loads mask), head dims that are not powers of two (a box would read the next
    head's columns), targets before sm90 (no TMA; the interpreter emulates them), rows not
    16-byte aligned."""
    none = (None,) * len(tensors)
    if not c.descriptors or varlen:
        return none
    if not (_arch.is_interpreter() or _arch.target_arch() >= 90):
        return none
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return none
    if any(t.shape[3] != block_size(t.shape[3]) or t.data_ptr() % 16 or (t.shape[2] * t.shape[3] * t.element_size()) % 16
           for t in tensors):
        return none

    def descriptor(t):
        B, T, heads, dim = t.shape
        return TensorDescriptor(t.view(B, T, heads * dim), [B, T, heads * dim], [T * heads * dim, heads * dim, 1],
                                [1, rows, dim])
    return tuple(descriptor(t) for t in tensors)


def _window_arg(window_size, T: int):
    """The window as the kernels take it: None where it cannot cut anything (``i - j < T``
    always holds), which drops the masked window segments."""
    if window_size is None or window_size >= T:
        return None
    return int(window_size)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, causal: bool, window: Optional[int],
             *, keep, offsets):
    """The forward launch; returns ``((o,), (lse,) if a backward follows)``."""
    q, k, v = contiguous(q, k, v)
    B, T, H, D = q.shape
    HKV, DV = v.shape[2], v.shape[3]
    cfg = attention_configs(D, DV, q.dtype)
    o = empty((B, T, H, DV), v.dtype, q.device)
    lse = empty((H, B * T), torch.float32, q.device)
    c = cfg.fwd
    rows, table = _blocks_grid(B, T, offsets, c.BM, q.device, LATE_FIRST if causal else IN_ORDER)
    if rows > 0:
        k_desc, v_desc = _descriptors((k, v), c.BN, c, cu_seqlens is not None)
        attn_fwd_kernel[(rows, H)](
            q, k, v, o, lse, k_desc, v_desc, table, cu_seqlens, scale, window or 0, T, B * T,
            H=H, HKV=HKV, D=D, DV=DV, BM=c.BM, BN=c.BN, BD=block_size(D), BDV=block_size(DV),
            CAUSAL=causal, HAS_WINDOW=window is not None, IS_VARLEN=cu_seqlens is not None,
            NEGATIVE_SCALE=scale < 0, USE_DESC=k_desc is not None,
            num_warps=c.num_warps, num_stages=c.num_stages, **COMPILE_OPTIONS,
        )
    return (o,), (lse,) if keep else ()


def _backward(grads, saved, q, k, v, cu_seqlens, cu_seqlens_cpu, scale, causal, window, *, outputs, offsets):
    q, k, v, do = contiguous(q, k, v, *grads)
    (o,), (lse,) = outputs, saved
    B, T, H, D = q.shape
    cfg = attention_configs(D, v.shape[3], q.dtype)
    HKV, DV = v.shape[2], v.shape[3]
    BD, BDV = block_size(D), block_size(DV)
    dq, dk, dv = empty(q.shape, q.dtype, q.device), empty(k.shape, k.dtype, k.device), empty(v.shape, v.dtype, v.device)
    if B * T == 0:
        return dict(q=dq, k=dk, v=dv)
    delta = empty((H, B * T), torch.float32, q.device)  # written by the dq kernel, read by dk/dv's
    common = dict(H=H, HKV=HKV, D=D, DV=DV, BD=BD, BDV=BDV, CAUSAL=causal, HAS_WINDOW=window is not None,
                  IS_VARLEN=cu_seqlens is not None)
    c = cfg.dq
    rows, table = _blocks_grid(B, T, offsets, c.BM, q.device, LATE_FIRST if causal else IN_ORDER)
    if rows > 0:
        k_desc, v_desc = _descriptors((k, v), c.BN, c, cu_seqlens is not None)
        attn_bwd_dq_kernel[(rows, H)](
            q, k, v, o, do, lse, delta, dq, k_desc, v_desc, table, cu_seqlens, scale, window or 0, T, B * T,
            BM=c.BM, BN=c.BN, **common, USE_DESC=k_desc is not None, num_warps=c.num_warps,
            num_stages=c.num_stages, **COMPILE_OPTIONS,
        )
    c = cfg.dkdv
    rows, table = _blocks_grid(B, T, offsets, c.BN, q.device, EARLY_FIRST if causal else IN_ORDER)
    if rows > 0:
        q_desc, do_desc = _descriptors((q, do), c.BM, c, cu_seqlens is not None)
        attn_bwd_dkdv_kernel[(rows, HKV)](
            q, k, v, do, lse, delta, dk, dv, q_desc, do_desc, table, cu_seqlens, scale, window or 0, T, B * T,
            BM=c.BM, BN=c.BN, **common, USE_DESC=q_desc is not None,
            # one masked loop only over descriptor loads: with pointer loads (packed
            # sequences) the whole blocks' unmasked loads win (varlen forward+backward 3.013
            # ms in segments against 3.158 as one loop, sweeps/attention_descriptors_h200.json)
            SEGMENTS=c.segments or q_desc is None, num_warps=c.num_warps,
            num_stages=c.num_stages, **COMPILE_OPTIONS,
        )
    return dict(q=dq, k=dk, v=dv)


PARALLEL_ATTN = library.register("parallel_attn", _forward, _backward, outputs=1)


def parallel_attn(q, k, v, scale=None, causal=True, window_size=None, cu_seqlens=None, cu_seqlens_cpu=None):
    """Softmax attention ``o_i = sum_j softmax_j(scale q_i . k_j) v_j`` (see the module docstring).

    q ``[B, T, H, D]``; k ``[B, T, HKV, D]`` and v ``[B, T, HKV, DV]`` with ``H % HKV == 0``;
    ``scale`` defaults to ``D ** -0.5``; ``causal`` keeps ``j <= i``; ``window_size`` keeps
    ``i - j < window_size``; ``cu_seqlens`` packs sequences along T (``B == 1``; pass
    ``cu_seqlens_cpu`` to validate without a device-to-host copy). Returns o ``[B, T, H, DV]``
    in v's dtype.
    """
    inputs = check_attention_inputs("parallel_attn", q, k, v, scale, causal, window_size, cu_seqlens, cu_seqlens_cpu)
    attention_configs(inputs.D, inputs.DV, q.dtype)  # raises before any launch where nothing fits
    window = _window_arg(window_size, inputs.T)
    return PARALLEL_ATTN(q, k, v, cu_seqlens, cu_seqlens_cpu, inputs.scale, bool(causal), window,
                         offsets=inputs.offsets_host)[0]
