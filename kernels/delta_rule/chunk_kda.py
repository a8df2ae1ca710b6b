r"""Chunked Kimi delta attention: ``chunk_kda``, forward and backward in Triton.

Recurrence (per value head; docs/ops.md), state ``S`` [K, V], per-channel log decay ``g_t``::

    S' = diag(e^{g_t}) S_{t-1},   S_t = (I - b_t k_t k_t^T) S' + b_t k_t v_t^T,   o_t = S_t^T (scale q_t)

with ``b = beta``; under ``use_qk_l2norm_in_kernel`` q and k are ``x / sqrt(|x|^2 + eps)``
first (the kernels keep raw q, k and scale rows by the inverse norms ``rq``, ``rk``).
Below q, k are the normalised ones.

Forward: the WY form with per-channel gates
===========================================

Chunks of BT = 64 tokens; rows i, j of a chunk; ``h`` the state entering it;
``G_i = g_0 + ... + g_i`` the in-chunk cumulative gate, now a [K] vector per row, and
``Gamma^c_ij = e^{G_ic - G_jc}``.

* Pseudo-values. With ``u_t = b_t (v_t - S'^T k_t) = b_t (v_t - S_{t-1}^T (k_t ⊙ e^{g_t}))``
  the update is ``S_t = diag(e^{g_t}) S_{t-1} + k_t u_t^T``, so within the chunk
  ``S_t = diag(e^{G_t}) h + sum_{j<=t} diag(e^{G_t - G_j}) k_j u_j^T``. Substituting
  ``S_{i-1}`` into ``u_i``::

      u_i + b_i sum_{j<i} (sum_c k_ic k_jc Gamma^c_ij) u_j = b_i v_i - b_i h^T (k_i ⊙ e^{G_i})

  i.e. ``(I + A) U = diag(b) V - diag(b) (K ⊙ e^G) h`` with
  ``A_ij = b_i sum_c k_ic k_jc Gamma^c_ij`` (j < i). With ``L = (I + A)^{-1}`` (unit lower
  triangular: ``kernels._triangular.unit_lower_inverse``) and ``T = L diag(b)``::

      U = U~ - W h,   U~ = T V,   W = T (K ⊙ e^G)

* Output: ``O = scale (Q ⊙ e^G) h + P U`` with ``P_ij = scale sum_c q_ic k_jc Gamma^c_ij``
  (j <= i), read as ``q_in = scale Q ⊙ e^G``.
* Next state: ``h' = diag(e^{G_C}) h + k_out^T U`` with ``k_out = K ⊙ e^{G_C - G}``.

These are the delta rule's equations (``chunk.py``) with the scalar gate's row factors
turned into per-channel ones; what changes is the in-chunk matrices. ``A`` and ``P`` are
GLA's intra-chunk scores (``kernels/gla/chunk.py``), and the factorisation
``(K ⊙ e^G)(K ⊙ e^{-G})^T`` overflows under strong decay, so both come from the
gate-level recursion (``kernels/_gate_levels.py``): six levels, each a tensor-core
product of ``x ⊙ e^{L}`` (right rows) and ``k ⊙ e^{R}`` (left rows), ``L, R <= 0`` sums of
same-sign gates. The recursion also yields ``L = G`` and ``R = G_C - G`` for ``q_in`` and
``k_out``; ``e^{G_C}``, ``e^G`` are exponents ``<= 0`` too. No exponent is ever positive
on that path. Where every ``|G|`` is within the one-product limit
(``kernels/_gate_levels.py``: the factorisation is safe there), one product of
``x ⊙ e^{G}`` and ``k ⊙ e^{-G}`` replaces the six, forward (per program, over all its key
blocks) and backward (per program and key block).

Launches: ``kda_intra_kernel`` twice (chunk-parallel: rq, rk, P, A, L, q_in, k_out, e^{G_C},
W, U~; first in one-product form, marking the programs it cannot take, then in the levels
form for those), the delta rule's ``state_pass_kernel`` with ``CHANNEL_DECAY`` (sequential over
chunks: h per chunk and U), its ``output_kernel`` with ``GIVEN_P``.

Backward
========

Per chunk, with ``dh`` the gradient of the state leaving it. Reverse state pass (the
delta rule's ``state_grad_kernel`` with ``CHANNEL_DECAY``), chunks last to first::

    dU    = P^T dO + k_out dh
    dh_in = diag(e^{G_C}) dh + q_in^T dO - W^T dU

Chunk gradients (``kda_grad_matrices_kernel`` per chunk and head: dv, dbeta, dP, dA;
``kda_grad_keys_kernel`` per chunk, head and key block: dq, dk, dg), with ``Vt = V - (K ⊙ e^G) h`` (so ``U = T Vt``):

* ``dv = T^T dU``; ``dT = dU Vt^T``; ``db_j += sum_i dT_ij L_ij``; ``dA = -L^T (dT diag(b)) L^T``
  (strictly lower; ``D'`` below; ``db_i += sum_j D'_ij A_ij / b_i``, from the kept
  ``KK = A / b``); ``d(K ⊙ e^G) = -T^T dU h^T``.
* ``dP = scale (dO U^T)`` (causal): GLA's intra backward, level by level:
  ``dq_ic += sum_j dP_ij k_jc Gamma^c_ij``, ``dk_jc += sum_i dP_ij q_ic Gamma^c_ij``,
  diagonal ``dP_ii`` (no gate) added separately.
* ``A``: ``dk_ic += b_i sum_j D'_ij k_jc Gamma^c_ij`` (row side ``R^A``),
  ``dk_jc += sum_i D'_ij b_i k_ic Gamma^c_ij`` (column side).
* Inter-chunk: ``dq += scale e^G ⊙ (dO h^T)``, ``dk += e^{G_C - G} ⊙ (U dh^T)`` and
  ``e^G ⊙ d(K ⊙ e^G)``.
* Gates (the cumulative-gate identity of ``kernels/gla/chunk.py``): the loss sees ``g``
  through ``G`` only, each term ``x ⊙ e^{±G}`` contributing ``±x ⊙ dx`` at its row::

      dG = q ⊙ (dq^inter + dq^P) - k ⊙ dk^P + k ⊙ (b R^A - dk^{A,col}) + k ⊙ dk^{in}
      dg_s = sum_{t >= s} dG_t + sum_{t < s} k_t ⊙ dk^{out}_t + e^{G_C} ⊙ sum_v (h ⊙ dh)

  (``dk^{out}`` the ``e^{G_C - G}`` term: its ``-k ⊙ dk^{out}`` at rows ``>= s`` cancels
  against its share of ``G_C``, leaving the strict prefix; the last term is ``e^{G_C}``'s.)
* GVA and the l2 norm: dq, dk are formed per value head, then the delta rule's
  ``qk_grad_finalize_kernel`` sums them over each key head's value heads and applies
  ``dx = r (dy - y (y . dy))``.

The backward reads what the forward kept (L, KK, P, q_in, k_out, W, e^{G_C}, h, U, the
inverse norms) and recomputes the gate factors from ``g``. Intermediates are kept in the input
dtype, except for fp16 inputs, whose range (6e-8) would flush the gate-scaled operands to
zero under strong decay: those run in fp32. Grids put (chunk, head) or (sequence, head,
value block) on axis 0; offsets are 64-bit; configs come from the target arch.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import triton

from .. import _arch
from .._arch import COMPILE_OPTIONS, launch_options
from .. import _library as library
from .._gate_levels import LEVELS, one_product_spread
from .._sequence import state_slots
from .._utils import contiguous, empty
from ._chunk_common import CHUNK, Configs, choose_configs
from .chunk import chunk_table
from .chunk_bwd import qk_grad_finalize_kernel, state_grad_kernel
from .chunk_fwd import output_kernel, state_pass_kernel
from .chunk_kda_kernels import kda_grad_keys_kernel, kda_grad_matrices_kernel, kda_intra_kernel
from .fused_recurrent import GATE_CHANNEL, _validate_inputs

OP = "chunk_kda"


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the intermediates: the input's, fp32 for fp16 (range, module docstring)."""
    return torch.float32 if dtype == torch.float16 else dtype


def kda_configs(K: int, V: int, work: torch.dtype) -> Configs:
    """The delta rule's configs (``choose_configs``), with the two gate-level kernels of
    this op given more registers a row: their six levels keep [BT, BK] gate sums, factors
    and operands live beside the [BT, BT] accumulators. On the H100 (B=4 T=4096 H=16
    K=V=128 bf16, ``benchmarks/config_sweep.py``): ``kda_intra_kernel`` with the levels at 4
    warps used 255 registers and spilled 2.4 KB a thread, forward 3.18 ms; at 8 warps 1.60
    ms, so its levels launch takes 8 warps. Its one-product launch, compiled alone, is
    fastest at 4 warps (forward 0.874 ms against 0.972 at 8, 1.107 at 16; 1.226 for the one
    launch holding both forms; H100, 2026-11-26). ``kda_grad_keys_kernel``
    at 32-wide key blocks (twice the programs, half the tiles): forward+backward 7.17 ->
    6.82 ms. The level sums' sibling totals come from tl.gather: through a scratch tile
    (``kernels/_gate_levels.py``) the forward was 1.50 against 1.60 ms while every program
    took the levels, but beside the one-product branch Triton 3.6 compiled the intra kernel
    wrong on sm90 at K = 32 in fp32 without L stored (finite, wrong outputs, no sanitizer
    report; not with the gather, 4 or 16 warps, or the levels alone; H100, 2026-11-26).
    Its state pass keeps 8 warps and one stage at K = 256: the delta rule's two-stage,
    4-warp pass there was timed and checked on the GPU without kda's per-channel decay
    loads."""
    base = choose_configs(K, V, work)
    if base.big_state:
        base = dataclasses.replace(base, state_warps=8, state_stages=1)
    return dataclasses.replace(base, prepare_warps=4, prepare_levels_warps=8, grad_BK=32)


def kda_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, chunk_map, num_seqs,
            l2norm, keep):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK
    work = work_dtype(q.dtype)
    cfg = kda_configs(K, V, work)
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * triton.cdiv(T, BT)
    slots = state_slots(num_seqs, T, num_seqs, BT, varlen)
    dev = q.device
    q_in, k_out, w = (empty((B, T, HV, K), work, dev) for _ in range(3))
    u = empty((B, T, HV, V), work, dev)
    P = empty((B, T, HV, BT), work, dev)
    L = empty((B, T, HV, BT), work, dev) if keep else None
    KK = empty((B, T, HV, BT), work, dev) if keep else None
    decay = empty((slots, HV, K), torch.float32, dev)
    rq = empty((B, T, H), torch.float32, dev) if l2norm else None
    rk = empty((B, T, H), torch.float32, dev) if l2norm else None
    if n_chunks > 0:
        through = cfg.prepare_siblings == "scratch"
        n_programs = n_chunks * HV
        scratch = empty((n_programs, BT, cfg.prepare_BK), torch.float32, dev) if through else None
        spread = one_product_spread(work)
        # the one-product launch marks the programs whose gates it cannot take; the levels
        # launch runs those (all of them where the work dtype never takes one product)
        levels_needed = empty((n_programs,), torch.int8, dev) if spread >= 0 else None
        args = (q, k, v, g, beta, q_in, k_out, w, u, L, KK, P, decay, rq, rk, scratch, levels_needed,
                cu_seqlens, chunk_map, T, scale)
        meta = dict(H=H, HV=HV, K=K, V=V, BT=BT, BK=cfg.prepare_BK, BV=cfg.prepare_BV, LEVELS=LEVELS,
                    L2NORM=l2norm, IS_VARLEN=varlen, STORE_L=keep, THROUGH_SCRATCH=through, SPREAD=spread)
        if levels_needed is not None:
            kda_intra_kernel[(n_programs,)](*args, ONE_PRODUCT=True, **meta,
                                            **launch_options(cfg.prepare_warps, 1, cfg.prepare_maxnreg))
        kda_intra_kernel[(n_programs,)](*args, ONE_PRODUCT=False, **meta,
                                        **launch_options(cfg.prepare_levels_warps or cfg.prepare_warps, 1,
                                                         cfg.prepare_maxnreg))
    h = empty((slots, HV, K, V), work, dev)
    vn = empty((B, T, HV, V), work, dev)
    final_state = empty((num_seqs, HV, K, V), torch.float32, dev) if output_final_state else None
    gates = dict(USE_G=False, L2NORM=False, IS_VARLEN=varlen)  # folded into the operands
    state_pass_kernel[(num_seqs * HV * triton.cdiv(V, cfg.state_BV),)](
        k_out, w, u, None, None, initial_state, h, vn, final_state, cu_seqlens, T,
        H=HV, HV=HV, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.BK_full // cfg.BKS, BV=cfg.state_BV,
        USE_H0=initial_state is not None, STORE_HT=output_final_state, CHANNEL_DECAY=True, decay=decay,
        num_warps=cfg.state_warps, num_stages=cfg.state_stages, **gates, **COMPILE_OPTIONS,
    )
    o = empty((B, T, HV, V), v.dtype, dev)
    if n_chunks > 0:
        output_kernel[(n_chunks * HV * triton.cdiv(V, cfg.output_BV),)](
            q_in, None, vn, h, None, None, None, o, P, cu_seqlens, chunk_map, T, 1.0,
            H=HV, HV=HV, K=K, V=V, BT=BT, BK=cfg.output_BK, BV=cfg.output_BV, STORE_P=False, GIVEN_P=True,
            num_warps=cfg.output_warps, num_stages=cfg.output_stages, **gates, **COMPILE_OPTIONS,
        )
    saved = dict(q_in=q_in, k_out=k_out, w=w, P=P, L=L, KK=KK, decay=decay, h=h, vn=vn, rq=rq, rk=rk)
    return o, final_state, saved if keep else None


def kda_bwd(q, k, v, g, beta, scale, initial_state, do, dht, cu_seqlens, chunk_map, num_seqs, l2norm, saved):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = CHUNK
    work = work_dtype(q.dtype)
    cfg = kda_configs(K, V, work)
    varlen = cu_seqlens is not None
    n_chunks = chunk_map.shape[0] if varlen else B * triton.cdiv(T, BT)
    dev = q.device
    do = do.to(work)
    h = saved["h"]
    dh = empty(h.shape, work, dev)
    dvn = empty((B, T, HV, V), work, dev)
    dh0 = empty(initial_state.shape, initial_state.dtype, dev) if initial_state is not None else None
    gates = dict(USE_G=False, L2NORM=False, IS_VARLEN=varlen)
    state_grad_kernel[(num_seqs * HV * triton.cdiv(V, cfg.state_grad_BV),)](
        saved["q_in"], saved["k_out"], saved["w"], None, saved["P"], None, None, do, dht, dh, dvn, dh0,
        cu_seqlens, T, 1.0,
        H=HV, HV=HV, K=K, V=V, BT=BT, BKS=cfg.BKS, NKS=cfg.BK_full // cfg.BKS, BV=cfg.state_grad_BV,
        USE_DHT=dht is not None, STORE_DH0=dh0 is not None, CHANNEL_DECAY=True, decay=saved["decay"],
        num_warps=cfg.state_grad_warps, num_stages=cfg.state_grad_stages, **gates, **COMPILE_OPTIONS,
    )

    direct = HV == H and not l2norm  # dq, dk need neither a head sum nor the norm's backward
    qk_dtype = q.dtype if direct else torch.float32
    dq_heads = empty((B, T, HV, K), qk_dtype, dev)
    dk_heads = empty((B, T, HV, K), qk_dtype, dev)
    dv = empty(v.shape, v.dtype, dev)
    dbeta = empty(beta.shape, beta.dtype, dev)
    dg = empty(g.shape, g.dtype, dev)
    if n_chunks > 0:
        common = dict(H=H, HV=HV, K=K, V=V, BT=BT, BV=cfg.grad_BV, L2NORM=l2norm, IS_VARLEN=varlen)
        dPs = empty((B, T, HV, BT), work, dev)
        dA = empty((B, T, HV, BT), work, dev)
        kda_grad_matrices_kernel[(n_chunks * HV,)](
            k, v, g, beta, saved["L"], saved["KK"], h, saved["vn"], dvn, do, saved["rk"], dPs, dA, dv, dbeta,
            cu_seqlens, chunk_map, T, scale, BK=cfg.grad_BK, **common, **launch_options(cfg.grad_warps, 1, cfg.grad_maxnreg),
        )
        BK = cfg.grad_BK
        n_programs = n_chunks * HV * triton.cdiv(K, BK)
        through = cfg.grad_siblings == "scratch"
        scratch = empty((n_programs, BT, BK), torch.float32, dev) if through else None
        kda_grad_keys_kernel[(n_programs,)](
            q, k, g, beta, saved["L"], h, dh, saved["vn"], dvn, do, saved["rq"], saved["rk"], dPs, dA,
            dq_heads, dk_heads, dg, scratch, cu_seqlens, chunk_map, T, scale,
            BK=BK, LEVELS=LEVELS, THROUGH_SCRATCH=through, SPREAD=one_product_spread(work),
            PAIRS=cfg.pairs if work == torch.bfloat16 else "bf16", **common,
            **launch_options(cfg.grad_warps, 1, cfg.grad_maxnreg),
        )
    if direct:
        return dq_heads, dk_heads, dv, dg, dbeta, dh0
    dq, dk = empty(q.shape, q.dtype, dev), empty(k.shape, k.dtype, dev)
    n_tokens = B * T
    BTOK = 32 if cfg.BK_full <= 128 else 16
    if n_tokens > 0:
        qk_grad_finalize_kernel[(triton.cdiv(n_tokens, BTOK) * H,)](
            q, k, saved["rq"], saved["rk"], dq_heads, dk_heads, dq, dk, n_tokens,
            H=H, HV=HV, K=K, BTOK=BTOK, BK=cfg.BK_full, L2NORM=l2norm, num_warps=4, **COMPILE_OPTIONS,
        )
    return dq, dk, dv, dg, dbeta, dh0


# what the forward keeps for the backward, in the order the ops pass it
SAVED = ("KK", "L", "P", "decay", "h", "k_out", "q_in", "rk", "rq", "vn", "w")


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, l2norm: bool,
             *, keep, offsets):
    """The forward launches; returns ``((o, final state or None), what the backward reads)``."""
    q, k, v, g, beta, initial_state = contiguous(q, k, v, g, beta, initial_state)
    table, N = chunk_table(q, cu_seqlens, offsets)
    o, final_state, saved = kda_fwd(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                                    table, N, l2norm, keep)
    return (o, final_state), tuple(saved[n] for n in SAVED) if keep else ()


def _backward(grads, saved, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, l2norm, *, offsets):
    q, k, v, g, beta, initial_state, do, dht = contiguous(q, k, v, g, beta, initial_state, *grads)
    table, N = chunk_table(q, cu_seqlens, offsets)
    dq, dk, dv, dg, dbeta, dh0 = kda_bwd(q, k, v, g, beta, scale, initial_state, do, dht, cu_seqlens, table, N,
                                         l2norm, dict(zip(SAVED, saved)))
    return dict(q=dq, k=dk, v=dv, g=dg, beta=dbeta, initial_state=dh0)


CHUNK_KDA = library.register(OP, _forward, _backward)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """Kimi delta attention, chunked: ``S' = diag(e^{g_t}) S_{t-1}``,
    ``S_t = (I - beta_t k_t k_t^T) S' + beta_t k_t v_t^T``, ``o_t = S_t^T (scale q_t)``.

    q, k [B, T, H, K]; v [B, T, HV, V]; g (per-channel log decay) [B, T, HV, K]; beta
    [B, T, HV]; HV % H == 0, value head j reads key head j // (HV // H). initial_state
    [N, HV, K, V] float32. ``cu_seqlens`` (with ``cu_seqlens_cpu`` to skip the host copy)
    packs N sequences into B = 1. ``use_qk_l2norm_in_kernel`` L2-normalises q and k first.
    Returns (o [B, T, HV, V], final state [N, HV, K, V] float32 or None). K <= 256, V <= 512.
    """
    offsets = _validate_inputs(OP, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                               use_qk_l2norm_in_kernel, GATE_CHANNEL)
    _arch.require_arch(OP, 80, _arch.SM75_TILES)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return CHUNK_KDA(q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, bool(output_final_state),
                     use_qk_l2norm_in_kernel, offsets=offsets)
