"""HGRN's recurrence on one chunk of tokens, as a parallel scan; shared by the chunked
and the fused-recurrent kernels.

A step ``h -> a h + b`` composes with the next one into another such step, so a chunk
of ``BT`` steps is a scan of ``(a, b)`` pairs over a tile's rows, each channel (column) on
its own (``affine_scan``). Forward, ``a_t = e^{g_t}`` and
``b_t = x_t`` give ``h_t``. Backward, the gradient runs the other way::

    dh_t = do_t + e^{g_{t+1}} dh_{t+1}          (dh after the last token: dht)
    dx_t = dh_t,      dg_t = dh_t e^{g_t} h_{t-1}

so the backward tile is loaded last token first, with each row's decay the gate of the
token loaded just before it. The state entering a chunk (``carry``) is folded into the
first row's ``b``; the tile's rows past the chunk's end load ``a = 1, b = 0`` and repeat
its last value, so the value leaving the chunk is always the tile's last row. Only
products of decays ``e^{g} <= 1`` appear: no exponent of a cumulative gate, nothing to
overflow at any decay.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def affine_scan(a, b, BT: tl.constexpr, BD: tl.constexpr):
    """Inclusive scan down the rows of ``[BT, BD]`` steps ``h -> a h + b`` (``BT`` a power
    of two): row ``i`` of the result is the composition of rows ``0 .. i``, as
    (product of the ``a``, the value it gives from ``h = 0``).

    Written as ``log2(BT)`` merges of sibling blocks: at level ``l`` the rows form aligned
    blocks of ``2**l`` each already scanned on its own, and every row of a right block
    composes with its left sibling's last row (a ``tl.gather``). The same ops a tree scan
    does, with each level a few vector ops: ``tl.associative_scan`` with a custom combine
    runs its function once per element under the interpreter (seconds per tile).
    """
    rows = tl.arange(0, BT)[:, None]
    for level in tl.static_range(BT.bit_length() - 1):
        s = 1 << level  # static_range makes it a constant; a constexpr annotation cannot be re-bound per level
        right = (rows >> level) % 2 == 1
        sibling_last = tl.broadcast_to((rows // (2 * s)) * (2 * s) + (s - 1), (BT, BD))
        a_left = tl.gather(a, sibling_last, axis=0)
        b_left = tl.gather(b, sibling_last, axis=0)
        b = tl.where(right, b + a * b_left, b)
        a = tl.where(right, a * a_left, a)
    return a, b


@triton.jit
def last_row(tile, BT: tl.constexpr):
    """Row ``BT - 1`` of a ``[BT, BD]`` tile (a select, so other rows' values never leak in)."""
    return tl.sum(tl.where(tl.arange(0, BT)[:, None] == BT - 1, tile, 0.0), axis=0)


@triton.jit
def channel_block(d0, D, BD: tl.constexpr):
    cols = d0 + tl.arange(0, BD)
    return cols, cols < D


@triton.jit
def forward_tile(x, g, t0, n_rows, d0, D, carry, BT: tl.constexpr, BD: tl.constexpr):
    """``h`` over tokens ``t0 .. t0 + n_rows - 1`` (int64 ``t0``), channels ``d0 ..``, from the
    state ``carry`` [BD] entering the chunk: (products of decays, h) as fp32 [BT, BD], and
    the tile's offsets from ``t0``'s row and mask."""
    i = tl.arange(0, BT)
    cols, m_d = channel_block(d0, D, BD)
    mask = (i[:, None] < n_rows) & m_d[None, :]
    offs = i[:, None] * D + cols[None, :]
    b = tl.load(x + t0 * D + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.exp(tl.load(g + t0 * D + offs, mask=mask, other=0.0).to(tl.float32))
    b = tl.where(i[:, None] == 0, b + a * carry[None, :], b)
    decay, h = affine_scan(a, b, BT, BD)
    return decay, h, offs, mask


@triton.jit
def backward_tile(do, g, t0, n_rows, d0, D, carry, BT: tl.constexpr, BD: tl.constexpr):
    """``dh`` over the same tokens, scanned from the last one back (row ``i`` is token
    ``n_rows - 1 - i``), from ``carry`` = ``e^{g} dh`` of the token after the chunk (dht
    after a sequence's last token): (products of decays, dh) as fp32 [BT, BD], the tile's
    offsets from ``t0``'s row and mask."""
    i = tl.arange(0, BT)
    cols, m_d = channel_block(d0, D, BD)
    mask = (i[:, None] < n_rows) & m_d[None, :]
    offs = (n_rows - 1 - i)[:, None] * D + cols[None, :]
    b = tl.load(do + t0 * D + offs, mask=mask, other=0.0).to(tl.float32)
    # between row i - 1 (token t + 1) and row i (token t) the decay is token t + 1's gate;
    # row 0's is already in the carry
    later = mask & (i[:, None] > 0)
    a = tl.exp(tl.load(g + t0 * D + offs + D, mask=later, other=0.0).to(tl.float32))
    b = tl.where(i[:, None] == 0, b + carry[None, :], b)
    decay, dh = affine_scan(a, b, BT, BD)
    return decay, dh, offs, mask


@triton.jit
def forward_chunk(x, g, o, t0, n_rows, d0, D, carry, BT: tl.constexpr, BD: tl.constexpr):
    """Write ``o = h`` over one chunk; returns the state leaving it."""
    _, h, offs, mask = forward_tile(x, g, t0, n_rows, d0, D, carry, BT, BD)
    tl.store(o + t0 * D + offs, h.to(o.dtype.element_ty), mask=mask)
    return last_row(h, BT)


@triton.jit
def backward_chunk(g, o, h0, do, dx, dg, i_n, t0, n_rows, starts_sequence, d0, D, carry,
                   USE_H0: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Write ``dx``, ``dg`` over one chunk; returns ``e^{g} dh`` of its first token (the
    carry of the chunk before it, or the initial state's gradient).

    ``h_{t-1}`` is the forward's output one token earlier (``o``), or the sequence's
    initial state (``h0``, zero when absent) at its first token (``starts_sequence``:
    the chunk is the sequence's first)."""
    _, dh, offs, mask = backward_tile(do, g, t0, n_rows, d0, D, carry, BT, BD)
    tl.store(dx + t0 * D + offs, dh.to(dx.dtype.element_ty), mask=mask)
    i = tl.arange(0, BT)
    cols, m_d = channel_block(d0, D, BD)
    b_g = tl.load(g + t0 * D + offs, mask=mask, other=0.0).to(tl.float32)
    # a scalar condition joins the block mask through tl.where (kernels/README.md, Triton 3.9)
    at_start = tl.where(starts_sequence, i[:, None] == n_rows - 1, False)
    h_prev = tl.load(o + t0 * D + offs - D, mask=mask & ~at_start, other=0.0).to(tl.float32)
    if USE_H0:
        b_h0 = tl.load(h0 + i_n * D + cols, mask=m_d, other=0.0).to(tl.float32)
        h_prev = tl.where(at_start, b_h0[None, :], h_prev)
    decay = tl.exp(b_g)
    tl.store(dg + t0 * D + offs, (dh * decay * h_prev).to(dg.dtype.element_ty), mask=mask)
    # padded rows repeat the first token's dh; its decay sits at row n_rows - 1
    first_decay = tl.sum(tl.where(i[:, None] == n_rows - 1, decay, 0.0), axis=0)
    return first_decay * last_row(dh, BT)
