r"""Chunked DPLR delta rule and RWKV-7: ``chunk_dplr_delta_rule``, ``chunk_rwkv7``.

Recurrence (per head; docs/ops.md), state ``S`` [K, V], ``d_t = e^{gk_t}`` per key channel::

    S_t = (diag(d_t) + b_t a_t^T) S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

The rank-one term reads the *undecayed* ``S_{t-1}``. ``chunk_rwkv7(r, w, k, v, a, b)`` is
the same with q = r, gk = w and a default scale of 1. Below ``q`` stands for ``scale q``.

Forward: a WY (UT) form for a diagonal-plus-rank-one transition
===============================================================

Chunks of BT = 64 tokens; inside one (rows i, j), with ``h`` the state entering it:

* ``G_i = gk_0 + ... + gk_i`` (chunk-local cumulative gate, per channel), ``G^-_i =
  G_{i-1}`` (``G^-_0 = 0``: the gate before row i's own step), ``G_C`` the chunk's total.
* Pseudo-values ``u_t = S_{t-1}^T a_t`` (what the rank-one term reads). Then
  ``S_t = diag(d_t) S_{t-1} + b_t u_t^T + k_t v_t^T``, a gated linear recurrence with two
  writes, so ``S_t = e^{G_t} h + sum_{j <= t} e^{G_t - G_j} (b_j u_j^T + k_j v_j^T)``
  (``e^{x} h``: rows scaled per channel). Substituting ``S_{i-1}`` into ``u_i``::

      u_i = (a_i e^{G^-_i})^T h + sum_{j < i} [A_ab]_ij u_j + [A_ak]_ij v_j
      [A_xy]_ij = sum_c x_ic y_jc e^{G^-_ic - G_jc}           (j < i)

  i.e. ``(I - A_ab) U = A_ak V + Ag h`` with ``Ag = a * e^{G^-}``. With the unit lower
  triangular inverse ``L = (I - A_ab)^{-1}`` (``kernels._triangular``)::

      U = U~ + W h,    W = L Ag,    U~ = M V,    M = L A_ak.

* Output and next state, with ``[A_qy]_ij = sum_c q_ic y_jc e^{G_ic - G_jc}`` (j <= i)::

      O  = Qg h + A_qb U + A_qk V,                       Qg = q * e^{G}
      h' = e^{G_C} h + Bg^T U + Kg^T V,                  Bg = b * e^{G_C - G}, Kg = k * e^{G_C - G}

The four score matrices carry a per-channel gate, so they are built by levels
(``kernels._gate_levels``): at each level a reference row ``e`` between the pair splits
``e^{G_i - G_j}`` (or ``e^{G^-_i - G_j}``, with ``e <= i - 1``) into two factors ``<= 1``.
Every exponent the kernels evaluate is a sum of gates (``<= 0``): ``G``, ``G^-``,
``G_C - G`` and the in-block sums of the levels, each built without a subtraction, so
gates of any strength stay finite (``w = -e^{-1/2} sigmoid(x)`` and 800 times that).
Where a program's key block has every ``|G|`` within the one-product limit
(``kernels/_gate_levels.py``), each matrix is instead one product of the rows scaled by
``e^{G}`` (``e^{G^-}``) and the columns by ``e^{-G}``, forward and backward.

Launches (``chunk_fwd.py``): chunk-parallel prepare (scores, L, M, W, U~, the gated
operands), the sequential state pass (h per chunk, U), the chunk-parallel output.

Backward
========

Given dO and dh' (the gradient of the state leaving a chunk; the final state's for the
last chunk), per chunk:

Reverse state pass, chunks last to first::

    dU = A_qb^T dO + Bg dh',     dh = e^{G_C} dh' + Qg^T dO + W^T dU

(``U`` enters the output, the next state and nothing else; ``h`` enters the output, the
next state and ``U``). ``dh`` of the first chunk is d initial_state.

Chunk gradients. The solve ``(I - A_ab) U = A_ak V + Ag h`` has the adjoint
``dY = L^T dU``, and then::

    dA_ab = dY U^T,  dA_ak = dY V^T,  dAg = dY h^T,  dV = A_qk^T dO + M^T dU + Kg dh'
    dA_qb = dO U^T,  dA_qk = dO V^T,  dQg = dO h^T,  dBg = U dh'^T,  dKg = V dh'^T

(strictly lower / lower parts). Through the scores, level by level as in the forward,
``dq_i += sum_j [dA_qk]_ij k_j e^{G_i - G_j} + [dA_qb]_ij b_j e^{..}``, likewise ``da``
(with ``G^-_i``), ``dk_j``, ``db_j`` (sums over i). Through the gated operands:
``dq += dQg e^{G}``, ``da += dAg e^{G^-}``, ``dk += dKg e^{G_C - G}``, ``db += dBg e^{G_C - G}``.

Gates. The loss depends on gk through the sequence-wide cumulative gate ``Γ``: ``Γ_t``
multiplies q_t (``e^{+Γ_t}``), a_{t+1} (which reads ``S_t``), and divides k_t, b_t
(``e^{-Γ_t}``); so ``∂L/∂Γ_t = q_t dq_t - k_t dk_t - b_t db_t + a_{t+1} da_{t+1}``
(elementwise, total vector gradients) plus ``sum_v S_T dS_T`` at the end, and
``dgk_s = sum_{t >= s} ∂L/∂Γ_t``. What the chunks after this one contribute is
``sum_v h' dh'`` (scaling ``h'`` scales every later read of it, the next chunk's ``a``
included), and ``h' = e^{G_C} h + Bg^T U + Kg^T V`` makes it local. Cancelling the
``k dk^inter``, ``b db^inter`` terms (inter: through Kg, Bg) between the chunk's own sum
and that carry leaves, per chunk::

    dgk_s = sum_{t >= s} (q dq - k dk^intra - b db^intra)_t + sum_{t > s} (a da)_t
            + sum_{t < s} (k dk^inter + b db^inter)_t + e^{G_C} sum_v h dh'

Pairs whose gate factor is exactly 1 (the diagonal of A_qk, A_qb: ``e^{G_i - G_i}``; the
sub-diagonal of A_ak, A_ab: ``e^{G^-_i - G_{i-1}}``) give O(1) terms that cancel exactly
in that sum (``q_i [dA]_ii k_i`` in both ``q dq`` and ``k dk``; ``a_i [dA]_{i,i-1}
k_{i-1}`` lands on ``Γ_{i-1}`` twice, with opposite signs). They are left out of it and
added to dq, dk, da, db afterwards, so under strong decay, where the true dgk is tiny next
to them, no rounding residue of theirs remains. The three partial sums are triangular
products in fp32 (three-pass tf32).

Launches (``chunk_bwd.py``): the reverse state pass (dh per chunk, dU), the
chunk-parallel score gradients (dY, dv, the four dA), and the chunk-parallel dq, dk, da,
db, dgk per key block. Everything the backward reads (the scores, L, M, W, the gated
operands, h, U) is kept from the forward: no state pass is recomputed.

Intermediates are kept in q's dtype, fp16 excepted (fp32: gate-scaled operands under
strong decay leave fp16's range), and ``dA_qk`` in fp32: where the one product serves, the
gradient kernel multiplies it as two 16-bit parts (hi + lo, two more products), since its
single rounding was the largest error term of dq and dk (the q-k pairs carry most of both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import _arch
from .. import _library as library
from .._utils import block_size, chunk_map, contiguous
from ._inputs import check_dplr_inputs
from .chunk_bwd import chunk_bwd
from .chunk_fwd import chunk_fwd

CHUNK = 64


@dataclass(frozen=True)
class Configs:
    """Block sizes, warps and stages of every kernel, for one (K, V, dtype, target arch)."""

    BT: int
    work: torch.dtype  # dtype of the kept intermediates and of the tensor-core operands
    BKS: int  # the state passes hold [K, BV] as NKS pieces of [BKS, BV]
    NKS: int
    intra_BK: int
    intra_BV: int
    intra_warps: int
    state_BV: int
    state_warps: int
    state_stages: int
    out_BK: int
    out_BV: int
    out_warps: int
    out_stages: int
    score_BK: int
    score_BV: int
    score_warps: int
    grad_BK: int
    grad_BV: int
    grad_warps: int
    # registers per thread (None: ptxas's choice) of the chunk-parallel level kernels
    intra_maxnreg: Optional[int] = None
    score_maxnreg: Optional[int] = None
    grad_maxnreg: Optional[int] = None
    # how the level kernels get the level sums' sibling totals: "gather" (tl.gather) or
    # "scratch" (through each program's own global tile, kernels/_gate_levels.py)
    intra_siblings: str = "gather"
    grad_siblings: str = "gather"


def choose_configs(K: int, V: int, dtype: torch.dtype, arch: int | None = None) -> Configs:
    """Configs from the *target* arch's shared memory (kernels/README.md).

    The chunk-parallel kernels hold several [64, 64] fp32 score tiles and [64, BK] level
    operands in registers, so their key blocks are 32 wide. The state passes are
    sequential over chunks, one program per (sequence, head, value block): a 32-wide value
    block doubles their parallelism (B = 4, H = 16, V = 128: 256 programs), and their
    pipelining stages are what the 100 KB parts (sm86, sm89, sm120) cannot afford. The
    specs' compile cases compile every kernel offline for each target against its limit.
    """
    arch = _arch.target_arch() if arch is None else arch
    smem = _arch.shared_memory_limit(arch)
    work = torch.float32 if dtype in (torch.float16, torch.float32) else dtype
    BK_full = max(32, block_size(K))
    BV_full = max(32, block_size(V))
    BKS = min(64, BK_full)
    wide = work == torch.float32
    big = BK_full > 128 or wide
    return Configs(
        BT=CHUNK, work=work, BKS=BKS, NKS=BK_full // BKS,
        intra_BK=32, intra_BV=min(64, BV_full), intra_warps=8,
        state_BV=min(32, BV_full), state_warps=4,
        state_stages=1 if (smem < 150_000 or big) else 2,
        out_BK=min(64, BK_full), out_BV=min(64, BV_full), out_warps=4, out_stages=1 if smem < 150_000 else 2,
        # fp32 operands stage twice the bytes of bf16 ones in shared memory (200 KB at 64-wide
        # blocks, 112 KB at 32: over the 100 KB parts)
        score_BK=32 if wide else min(64, BK_full), score_BV=16 if wide else min(64, BV_full), score_warps=8,
        # V = 64 in one 64-wide value block: Triton 3.6's qkabg_grad_kernel with the
        # one-product branch faults (illegal address) on sm90; two 32-wide blocks, or the
        # levels alone, do not (each config in a process of its own, H100)
        grad_BK=32, grad_BV=32 if BV_full == 64 else min(64, BV_full), grad_warps=8,
    )


# what the backward reads, in the order the custom op passes it on
SAVED = ("A_qb", "A_qk", "L", "M", "bg", "decay", "h", "kg", "qg", "u", "w")


def _launch_plan(q, v, cu_seqlens, offsets):
    """(configs, varlen chunk table or None, number of sequences) of one call."""
    table = chunk_map(offsets, CHUNK, q.device) if offsets is not None else None
    N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    return choose_configs(q.shape[-1], v.shape[-1], q.dtype), table, N


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             gk: torch.Tensor, initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, *, keep, offsets):
    """The forward launches; returns ``((o, final state or None), what the backward reads)``."""
    q, k, v, a, b, gk, initial_state = contiguous(q, k, v, a, b, gk, initial_state)
    cfg, table, N = _launch_plan(q, v, cu_seqlens, offsets)
    o, final_state, saved = chunk_fwd(q, k, v, a, b, gk, scale, initial_state, output_final_state, cu_seqlens,
                                      table, N, keep, cfg)
    return (o, final_state), tuple(saved[n] for n in SAVED) if keep else ()


def _backward(grads, saved, q, k, v, a, b, gk, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, *, offsets):
    q, k, v, a, b, gk, initial_state, do, dht = contiguous(q, k, v, a, b, gk, initial_state, *grads)
    cfg, table, N = _launch_plan(q, v, cu_seqlens, offsets)
    dq, dk, dv, da, db, dg, dh0 = chunk_bwd(q, k, v, a, b, gk, scale, initial_state, do, dht, cu_seqlens, table, N,
                                           dict(zip(SAVED, saved)), cfg)
    return dict(q=dq, k=dk, v=dv, a=da, b=db, gk=dg, initial_state=dh0)


OPS = {name: library.register(name, _forward, _backward) for name in ("chunk_dplr_delta_rule", "chunk_rwkv7")}


def _run(op, names, q, k, v, a, b, gk, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):
    p = check_dplr_inputs(op, names, q, k, v, a, b, gk, scale, initial_state, output_final_state, cu_seqlens,
                          cu_seqlens_cpu)
    _arch.require_arch(op, 80, _arch.SM75_TILES)
    return OPS[op](q, k, v, a, b, gk, initial_state, cu_seqlens, cu_seqlens_cpu, p.scale, output_final_state,
                   offsets=p.offsets_host)


def chunk_dplr_delta_rule(q, k, v, a, b, gk, scale=None, initial_state=None, output_final_state=False,
                          cu_seqlens=None, cu_seqlens_cpu=None):
    """DPLR delta rule, chunked: ``S_t = (diag(e^{gk_t}) + b_t a_t^T) S_{t-1} + k_t v_t^T``.

    q, k, a, b, gk [B, T, H, K]; v [B, T, H, V]; ``o_t = S_t^T (scale q_t)``, scale
    defaulting to K^-0.5. initial_state [N, H, K, V] float32; returns (o [B, T, H, V],
    final state or None). ``cu_seqlens`` (with ``cu_seqlens_cpu`` to skip the host sync)
    packs N sequences into B = 1. K and V up to 128.
    """
    return _run("chunk_dplr_delta_rule", {}, q, k, v, a, b, gk, scale, initial_state, output_final_state,
                cu_seqlens, cu_seqlens_cpu)


def chunk_rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
                cu_seqlens_cpu=None):
    """RWKV-7, chunked: the DPLR delta rule with q = r, gk = w (log decay), scale 1."""
    return _run("chunk_rwkv7", {"q": "r", "gk": "w"}, r, k, v, a, b, w, scale, initial_state, output_final_state,
                cu_seqlens, cu_seqlens_cpu)
