"""Pieces of the chunked delta-rule kernels alone: the chunk size, gate loads, the state
pass's program, and the configs per target arch. What every chunked family shares
(coordinates, tiles, state pieces) is in ``kernels._chunk``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import _arch
from .._chunk import chunk_coords, chunk_span
from .._utils import block_size

CHUNK = 64  # BT: tokens per chunk
L2NORM_EPS = tl.constexpr(1e-6)  # use_qk_l2norm_in_kernel: y = x / sqrt(sum(x^2) + eps)


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
def state_program(cu_seqlens, T, H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                  BV: tl.constexpr, IS_VARLEN: tl.constexpr):
    """A state pass's program: (value block, sequence * HV + value head, value head, key head,
    first token, end token, state slot of the first chunk, number of chunks)."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0).to(tl.int64)
    i_nh = pid // NV
    i_hv = i_nh % HV
    bos, eos, slot0 = chunk_span(i_nh // HV, cu_seqlens, T, BT, IS_VARLEN)
    return (pid % NV).to(tl.int32), i_nh, i_hv, i_hv // (HV // H), bos, eos, slot0, tl.cdiv(eos - bos, BT)


@triton.jit
def chunk_head_program(i_row, cu_seqlens, chunk_map, T, H: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr,
                       IS_VARLEN: tl.constexpr):
    """A chunk-parallel program's coordinates from its (chunk * HV + value head) row (int64):
    (value head, key head, first token, state slot, valid rows, row index, row mask)."""
    i_chunk = i_row // HV
    i_hv = i_row % HV
    i_n, t0, eos, slot = chunk_coords(i_chunk, cu_seqlens, chunk_map, T, BT, IS_VARLEN)
    n_valid = tl.minimum(eos - t0, BT)
    rows = tl.arange(0, BT)
    return i_hv, i_hv // (HV // H), t0, slot, n_valid, rows, rows < n_valid


# a state of more keys than this (padded): fewer pipelining stages fit beside it
BIG_STATE_KEYS = 128


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
    # registers per thread (None: ptxas's choice) of the chunk-parallel level kernels
    prepare_maxnreg: Optional[int] = None
    grad_maxnreg: Optional[int] = None
    # how a gate-level prepare / gradient kernel (chunk_kda's) gets the level sums' sibling
    # totals: "gather" (tl.gather) or "scratch" (through its own global tile,
    # kernels/_gate_levels.py)
    prepare_siblings: str = "gather"
    grad_siblings: str = "gather"
    # warps of a gate-level prepare kernel's levels launch (chunk_kda's), where they differ
    # from its one-product launch's (None: prepare_warps)
    prepare_levels_warps: Optional[int] = None
    # chunk_kda's in-chunk pair products under bf16 work: "bf16" operands, or fp16 ones scaled
    # by a power of two a tile, for the score gradient's products ("fp16 scores") or all
    # ("fp16") (kernels/delta_rule/chunk_kda_kernels.py, _in_chunk_pair_grads). On the H200
    # (bench size) "fp16 scores" takes forward+backward 2.7% over "bf16" (3.556 against 3.462 ms)
    # and brings dg from 1.23 to 1.08 times the peer's error; "fp16": the same errors, +3.8%
    pairs: str = "fp16 scores"

    @property
    def big_state(self) -> bool:
        return self.BK_full > BIG_STATE_KEYS


def choose_configs(K: int, V: int, dtype: torch.dtype, arch: int | None = None) -> Configs:
    """Configs from the *target* arch's shared-memory budget (kernels/README.md).

    The state passes are sequential over chunks, one program per (sequence, value head,
    value block): their value block sets the parallelism (B = 4, H = 16, V = 128 gives 128
    programs at BV = 64), and their pipelining stages and key pieces set the shared memory,
    which must leave room for two programs per multiprocessor so that all of them run in
    one wave. The specs' compile cases (specs/delta_rule.py) compile every
    kernel offline for each target arch against its limit.
    """
    arch = _arch.target_arch() if arch is None else arch
    smem = _arch.shared_memory_limit(arch)
    small_smem = smem < 150_000
    large_smem = smem >= 200_000  # the 228 KB parts (sm90, sm100)
    wide = dtype == torch.float32
    # 16-wide blocks gave wrong bf16 results on sm90 (K = V = 16, Triton 3.6; fp32 and
    # K >= 32 right): blocks are at least 32 wide, the masks cover the rest
    BK_full = max(32, block_size(K))
    BV_full = max(32, block_size(V))
    BK = min(64, BK_full)
    BV = min(64, BV_full)
    big_state = BK_full > BIG_STATE_KEYS
    pipelined = 1 if small_smem else 2
    # the reverse state pass stages q, k, w, P and dO each chunk: two stages of fp32 tiles
    # need the 228 KB parts (measured 173 KB at K = 128 against sm80's 163 KB)
    grad_pipelined = 1 if (small_smem or (wide and not large_smem)) else 2
    # The chunk-parallel forward kernels on the 228 KB parts in bf16 / fp16: the prepare
    # kernel's value tiles 128 wide and three stages of its loads, three of the output
    # kernel's. Forward on the H200 (config_sweep.py): chunk_gated_delta_rule 0.461 -> 0.424
    # ms, chunk_delta_rule 0.346 -> 0.330, at K = 256, V = 512 0.776 -> 0.730; chunk_kda
    # (its own prepare kernel) unchanged, 0.808 -> 0.807. fp32 was not timed: it keeps two.
    deep_forward = large_smem and not wide
    return Configs(
        BK_full=BK_full,
        BKS=min(64, BK_full),
        prepare_BK=BK, prepare_BV=min(128, BV_full) if deep_forward else BV, prepare_warps=4,
        prepare_stages=3 if deep_forward else 2,
        # three stages of the state pass's loads where 228 KB allow them (sm80 overflows):
        # 0.45 ms against 0.50 at two for the gated forward (config_sweep.py, H200, K = V = 128).
        # At K = 256 (V = 512: chunk_gated_delta_rule_v512) two stages fit the 228 KB parts
        # (three need 255 KB): the forward 0.778 ms against 1.400 at one stage and 8 warps (of
        # which the pass took 1.00), 4 warps beating 8 at either stage count (H200)
        state_BV=min(64, BV_full), state_warps=4,
        state_stages=(2 if big_state else 3) if large_smem else (1 if big_state else pipelined),
        output_BK=BK, output_BV=min(128, BV_full), output_warps=4,
        output_stages=3 if deep_forward else 1 if (small_smem and wide) else 2,
        state_grad_BV=min(32, BV_full), state_grad_warps=4, state_grad_stages=1 if big_state else grad_pipelined,
        # fp32 on the 100 KB parts: 32-wide blocks (Triton 3.8 needs 114688 bytes at 64,
        # 98304 at 32, against a limit of 101376; 3.6 needs 98304 at 64)
        # chunk_grad_kernel's bf16 key block is 64 wide on sm90 (wgmma), masked past K: at 32
        # (K <= 32) Triton 3.6 gave wrong dk and dbeta at K = 16 and an illegal address at
        # K = 32 (V = 392; H200 and H100; tests/repro/chunk_delta_rule_bf16_narrow_keys.py),
        # and 64 was right at both, whichever other kernel's blocks were 32 or 64
        grad_BK=32 if (small_smem and wide) else 64 if (arch == 90 and not wide) else BK,
        grad_BV=32 if (small_smem and wide) else BV,
        grad_warps=8, grad_stages=1,
    )
