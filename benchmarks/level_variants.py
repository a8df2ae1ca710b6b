"""Other forms of the gate levels' sibling totals (``kernels/_gate_levels.py``), for
``config_sweep.py`` to time against the kernels' own.

Nsight Compute on the H100 (``gpu_run.sh ncu``) put chunk_gla's ``_intra_fwd`` at one block
of 8 warps per SM (255 registers) with 63% of its shared-memory wavefronts excess: the
compiler lays the level operands out for ``tl.gather`` (each warp a 64-row column strip) and
stores the tensor-core operands from that layout. These forms avoid the gather:

* by reduction: each half-block's total by a masked sum over a reshaped tile (``level``
  must be a compile-time constant: chunk_gla, chunk_kda);
* by product: a 0/1 selection matrix times the sums, on the tensor cores at tf32x3 (about
  2**-21 relative on a same-sign sum; every level form);
* by scan: two ``tl.associative_scan`` along the rows that carry the last row of each left
  (right) block forwards (backwards) through its sibling: exact, no gather.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def sibling_total_by_reduction(L, right, level: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    s: tl.constexpr = 1 << level
    NB: tl.constexpr = BT // (2 * s)
    halves = tl.sum(tl.where(tl.arange(0, s)[None, None, :, None] == s - 1, tl.reshape(L, (NB, 2, s, BD)), 0.0),
                    axis=2)  # [NB, 2, BD]: each half-block's total (L at its last row)
    half = tl.arange(0, 2)[None, :, None]
    left = tl.sum(tl.where(half == 0, halves, 0.0), axis=1)
    right_total = tl.sum(tl.where(half == 1, halves, 0.0), axis=1)
    sibling = tl.where(half == 0, right_total[:, None, :], left[:, None, :])
    return tl.reshape(tl.broadcast_to(sibling[:, :, None, :], (NB, 2, s, BD)), (BT, BD))


@triton.jit
def sibling_total_by_product(L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    s = 1 << level
    rows = tl.arange(0, BT)[:, None]
    sibling_last = (rows // (2 * s)) * (2 * s) + (s - 1) + tl.where(right, 0, s)
    select = (tl.arange(0, BT)[None, :] == sibling_last).to(tl.float32)
    return tl.dot(select, L, input_precision="tf32x3")


@triton.jit
def _latest_flagged(v1, f1, v2, f2):
    """Scan operator: the value of the latest flagged element so far (in scan order)."""
    return tl.where(f2 != 0, v2, v1), f1 | f2


@triton.jit
def sibling_total_by_scan(L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    s = 1 << level
    pos = tl.arange(0, BT)[:, None] % (2 * s)
    # a right row reads the left block's last row, the nearest such row at or before it; a
    # left row the right block's last, the nearest at or after it
    left_last = tl.broadcast_to((pos == s - 1).to(tl.int32), (BT, BD))
    right_last = tl.broadcast_to((pos == 2 * s - 1).to(tl.int32), (BT, BD))
    from_left, _ = tl.associative_scan((L, left_last), 0, _latest_flagged)
    from_right, _ = tl.associative_scan((L, right_last), 0, _latest_flagged, reverse=True)
    return tl.where(right, from_left, from_right)


@triton.jit
def sibling_total_none(L, right, level, BT: tl.constexpr, BD: tl.constexpr):
    """Not a form: zero totals, so a level costs what it does without its gather (for
    config_sweep.py's cost decomposition only; the sums never merge)."""
    return tl.zeros([BT, BD], dtype=tl.float32)


def patches(form):
    """config_sweep patches that put ``form`` in place of ``sibling_total`` (every level
    kernel reaches it through ``kernels._gate_levels``)."""
    return [("kernels._gate_levels", "sibling_total", lambda base: form)]
