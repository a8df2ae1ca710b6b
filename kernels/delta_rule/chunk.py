r"""Chunked delta rule and gated delta rule: ``chunk_delta_rule``, ``chunk_gated_delta_rule``.

Recurrence (per value head; docs/ops.md), state ``S`` of shape [K, V]::

    S_t = e^{g_t} (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = S_t^T (scale q_t)

with ``b = beta``, and ``g = 0`` for the plain delta rule. Under
``use_qk_l2norm_in_kernel`` the recurrence sees ``q / sqrt(|q|^2 + eps)`` and likewise
for ``k`` (eps = 1e-6); the kernels keep the raw q, k and scale rows by the inverse norms
``rq``, ``rk`` (rows of a product, so ``rq_i rk_j (q_i . k_j)`` etc.). Below, q and k are
the normalised ones.

Forward: the WY (UT-transform) form over chunks
==============================================

Split time into chunks of BT = 64 tokens. Inside one chunk (rows i, j = 0..BT-1), with
``h`` the state entering the chunk:

* ``G_i = g_0 + ... + g_i`` (chunk-local cumulative gate), ``Gamma_ij = e^{G_i - G_j}``.
* Pseudo-values. ``S_t = e^{g_t} S_{t-1} + k_t u_t^T`` with
  ``u_t = b_t (v_t - e^{g_t} S_{t-1}^T k_t)``, so
  ``S_t = e^{G_t} h + sum_{j<=t} Gamma_tj k_j u_j^T``. Substituting ``S_{t-1}`` in ``u_t``:
  ``u_i + b_i sum_{j<i} Gamma_ij (k_i . k_j) u_j = b_i v_i - b_i e^{G_i} h^T k_i``, i.e.

      (I + A) U = diag(b) V - diag(b e^G) K h,
      A = strictly-lower(diag(b) (K K^T) * Gamma).

  With ``L = (I + A)^{-1}`` and ``T = L diag(b)``:

      U = T V - T (K * e^G) h = U~ - W h,   W = L diag(b e^G) K,   U~ = L diag(b) V.

  ``I + A`` is unit lower triangular. ``unit_lower_inverse`` inverts its 16 x 16 diagonal
  blocks by forward substitution and merges them: with ``D`` the block-diagonal inverse and
  ``A_o`` the part below the diagonal blocks, ``I + A = (I + A_d)(I + D A_o)`` and
  ``N = D A_o`` is nilpotent (``N^4 = 0`` for four blocks), so
  ``L = (I - N)(I + N^2) D``: four tensor-core products (in the input dtype, three-pass
  tf32 for fp32 inputs: L is rounded to that dtype for W and U~ anyway).
* Output, ``P = scale (Q K^T) * Gamma`` on ``j <= i``:

      O = scale (Q * e^G) h + P U.

* Next state: ``h' = e^{G_C} h + (K * e^{G_C - G})^T U`` (``G_C`` the last cumulative gate).

Numerics. Only ``exp`` of differences ``G_i - G_j`` with ``j <= i``, ``G_C - G_i``,
``G_i - G_0`` and ``G_i`` itself appear, each ``<= 0`` for ``g <= 0``; entries outside the
masks are zeroed before ``exp``. G is kept in float64: under strong decay it reaches -1e4
within a chunk, where float32 would leave every ``G_i - G_j`` off by about 1e-3. W is
stored as ``e^{-G_0} W`` (``G_0 = g_0``, the chunk's first cumulative gate) and ``e^{G_0}``
multiplies the fp32 result of ``W h``: under strong decay ``e^{G}`` is far below fp16's
range while ``e^{G - G_0}`` reaches 1.

Launches (``chunk_fwd.py``): the chunk-parallel WY prepare (G, A, L, W, U~), the
sequential state pass (h per chunk, U), the chunk-parallel output (which also keeps P for
the backward).

Backward
========

Given dO and the gradient of the final state, per chunk (``h`` entering, ``dh`` the
gradient of the state leaving it):

Reverse state pass (``state_grad_kernel``), chunks last to first::

    dU    = P^T dO + (K * e^{G_C - G}) dh
    dh_in = e^{G_C} dh + scale (Q * e^G)^T dO - W^T dU

(``U`` enters the output, the next state, and nothing else; ``h`` enters the output, the
next state and ``U = U~ - W h``.) ``dh_in`` of the first chunk is d initial_state.

Chunk gradients (``chunk_grad_kernel``), chunk-parallel, with ``dP = dO U^T``:

* Output: ``dq_i = scale e^{G_i} (dO h^T)_i + sum_j dP_ij scale Gamma_ij k_j`` and
  ``dk_j += sum_i dP_ij scale Gamma_ij q_i``.
* Next state: ``dk_i += e^{G_C - G_i} (U dh^T)_i``.
* Pseudo-values. ``U = T (V - (K * e^G) h) = T Vt``, so ``dV = T^T dU``,
  ``dT = dU Vt^T``, and from ``W = T (K * e^G)``: ``dk += -(T^T dU h^T) * e^G``.
* Triangular solve. ``T = L diag(b)``: ``db_j += sum_i dT_ij L_ij``, ``dL = dT diag(b)``;
  ``L = (I + A)^{-1}``: ``dA = -L^T dL L^T``, kept strictly lower.
* ``A_ij = b_i (k_i . k_j) Gamma_ij``: with ``D'_ij = dA_ij Gamma_ij`` and
  ``D = diag(b) D'``: ``dk += D K + D^T K`` and ``db_i += k_i . (D' K)_i``.
* Gates. ``G`` appears as ``e^{G_i}`` on query rows and as ``Gamma_ij`` (``+G_i``, ``-G_j``)
  and ``e^{G_C - G_i}``. Differentiating each product in turn, every term is a row dot
  of an operand with its own gradient term (q . dq covers both the inter-chunk read and
  the row side of P):

      dG_i = q_i . dq_i - k_i . dk^P_i - k_i . dk^S_i + k_i . dk^W_i
             + b_i k_i . (D' K)_i - k_i . (D^T K)_i
      dG_C += sum_i k_i . dk^S_i + e^{G_C} <dh, h>

  (``dk^P``, ``dk^S``, ``dk^W``: the dk terms from P, the next state and W.)
  ``G`` is a chunk-local cumsum, so ``dg_t = sum_{s >= t in the chunk} dG_s``.
  Two terms are formed so that no O(1) pieces cancel in float32: the P terms as
  ``rowsum(M) - colsum(M)`` with ``M_ij = dP_ij P_ij`` over ``j < i`` only (the diagonal has
  no gate and would cancel between ``q . dq`` and ``k . dk^P``), and the next-state terms
  directly as their effect on ``g_t``, ``sum_{i < t} k_i . dk^S_i`` (``e^{G_C - G_i}``
  depends on ``g_t`` for ``i < t <= C``), rather than as ``-k . dk^S`` plus a ``dG_C``.
* l2 norm (``qk_grad_finalize_kernel``): ``y = x r``, ``r = (|x|^2 + eps)^{-1/2}``,
  ``dx = r (dy - y (y . dy))``, after summing dq, dk over the value heads of a key head.

Everything the backward reads (G, L, P, W, the per-chunk states h, the pseudo-values U
and the inverse norms) is kept from the forward, so the backward recomputes nothing: that
costs memory (h is ``T/64 * K * V`` per value head, in the input dtype) and saves a
second state pass and the ``Q K^T`` products.

The state passes hold the state as up to four [64, BV] pieces of key rows, so that each
product stages a [64, 64] operand tile rather than a [64, K] one (shared memory at K = 256
on the 100 KB parts).

The value dim is walked in blocks with masked edges: the state's value columns evolve
independently, so each state-pass program owns one [K, BV] block of h (forward) or dh
(backward), the output kernel one [BT, BV] block of o, and the chunk-gradient kernel
loops over the value blocks, summing over them inside one program what sums over V (dq,
dk, dbeta, dg, and the [BT, BT] matrices dT and dP). A wider V adds programs or loop
steps, never a wider tile: V = 512 runs the blocks of V = 256.

Grouped value heads (GVA): q, k have H heads, v, g, beta HV (``HV % H == 0``); value
head j reads key head ``j // (HV // H)``. The state is [N, HV, K, V] and o [B, T, HV, V].
"""

from __future__ import annotations

from typing import Optional

import torch

from .. import _arch
from .. import _library as library
from .. import _validate as V_
from .._utils import chunk_map as build_chunk_map
from .._utils import contiguous
from ._chunk_common import CHUNK, choose_configs
from .chunk_bwd import chunk_bwd
from .chunk_fwd import chunk_fwd

# every kernel walks the value dim in blocks (the state passes one block per program), so
# V is bounded by memory, not by tiles; the key dim is held whole by the state passes
MAX_KEY_HEAD_DIM = 256
MAX_VALUE_HEAD_DIM = 512


# what the forward keeps for the backward, in the order the ops pass it
SAVED = ("G", "L", "P", "h", "rk", "rq", "vn", "w")


def chunk_table(q, cu_seqlens, offsets):
    """(varlen chunk table or None, number of sequences) of one call."""
    table = build_chunk_map(offsets, CHUNK, q.device) if offsets is not None else None
    return table, q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1


def _launch_plan(q, v, cu_seqlens, offsets):
    """(configs, varlen chunk table or None, number of sequences) of one call."""
    return (choose_configs(q.shape[-1], v.shape[-1], q.dtype), *chunk_table(q, cu_seqlens, offsets))


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], beta: torch.Tensor,
             initial_state: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],
             cu_seqlens_cpu: Optional[torch.Tensor], scale: float, output_final_state: bool, l2norm: bool,
             *, keep, offsets):
    """The forward launches; returns ``((o, final state or None), what the backward reads)``."""
    q, k, v, g, beta, initial_state = contiguous(q, k, v, g, beta, initial_state)
    cfg, table, N = _launch_plan(q, v, cu_seqlens, offsets)
    o, final_state, saved = chunk_fwd(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, table, N, l2norm, keep, cfg,
    )
    return (o, final_state), tuple(saved[n] for n in SAVED) if keep else ()


def _backward(grads, saved, q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale,
              output_final_state, l2norm, *, offsets):
    q, k, v, g, beta, initial_state, do, dht = contiguous(q, k, v, g, beta, initial_state, *grads)
    cfg, table, N = _launch_plan(q, v, cu_seqlens, offsets)
    dq, dk, dv, dg, dbeta, dh0 = chunk_bwd(
        q, k, v, g, beta, scale, initial_state, do, dht, cu_seqlens, table, N, l2norm, dict(zip(SAVED, saved)), cfg,
    )
    return dict(q=dq, k=dk, v=dv, g=dg, beta=dbeta, initial_state=dh0)


OPS = {name: library.register(name, _forward, _backward) for name in ("chunk_delta_rule", "chunk_gated_delta_rule")}


def _validate(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, gated):
    """Checks in the order of kernels/README.md; returns (offsets on the host or None, N)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if name != "g" or gated:
            V_.check_tensor(op, name, t)
    V_.check_same_dtype(op, q=q, k=k, v=v)
    V_.check_scale(op, scale)
    device = V_.check_devices(op, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)

    heads = "HV" if gated else "H"
    V_.check_ndim(op, "q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    V_.check_heads(op, "q", H, "[B, T, H, K]")
    V_.check_shape(op, "k", k, q.shape, "[B, T, H, K]")
    V_.check_ndim(op, "v", v, 4, f"[B, T, {heads}, V]")
    if tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"{op}: `v` must have shape [B, T, {heads}, V] with B, T = {B}, {T} as in q, "
                         f"got [{', '.join(map(str, v.shape))}]")
    HV, Vd = v.shape[2], v.shape[3]
    V_.check_heads(op, "v", HV, f"[B, T, {heads}, V]")
    if gated:
        if H == 0 or HV % H != 0:
            raise ValueError(f"{op}: `v` has HV = {HV} heads, which must be a multiple of the "
                             f"H = {H} heads of q and k")
        V_.check_shape(op, "g", g, (B, T, HV), "[B, T, HV]")
    elif HV != H:
        raise ValueError(f"{op}: `v` must have H = {H} heads like q and k, got {HV}")
    V_.check_shape(op, "beta", beta, (B, T, HV), f"[B, T, {heads}]")
    V_.check_range(op, "key head dim K (q.shape[-1])", K, 1, MAX_KEY_HEAD_DIM)
    V_.check_range(op, "value head dim V (v.shape[-1])", Vd, 1, MAX_VALUE_HEAD_DIM)

    offsets = V_.check_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, batch=B, T=T, device=device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    V_.check_initial_state(op, initial_state, (N, HV, K, Vd), f"[N, {heads}, K, V]")
    return offsets, N


def _run(op, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu,
         use_qk_l2norm_in_kernel):
    offsets, N = _validate(op, q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                           gated=g is not None)
    _arch.require_arch(op, 80, _arch.SM75_TILES)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return OPS[op](q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu, scale, bool(output_final_state),
                   bool(use_qk_l2norm_in_kernel), offsets=offsets)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """Gated delta rule, chunked: ``S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

    q, k [B, T, H, K]; v [B, T, HV, V]; g (log decay), beta [B, T, HV]; HV % H == 0.
    initial_state [N, HV, K, V] float32. Returns (o [B, T, HV, V], final state or None).
    """
    op = "chunk_gated_delta_rule"
    if g is None:
        raise TypeError(f"{op}: `g` must be a torch.Tensor [B, T, HV], got None")
    return _run(op, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                cu_seqlens_cpu, use_qk_l2norm_in_kernel)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, cu_seqlens_cpu=None, use_qk_l2norm_in_kernel=False):
    """Delta rule, chunked: ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

    q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]. initial_state [N, H, K, V] float32.
    Returns (o [B, T, H, V], final state or None).
    """
    return _run("chunk_delta_rule", q, k, v, None, beta, scale, initial_state, output_final_state,
                cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel)
